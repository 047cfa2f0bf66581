"""Consumer lag of the partitions a consumer owns, for the ``*_consumer_lag`` gauges.

Shared by the scorer and the CDC stage (each labels its gauge differently).
Lag = high watermark - position; it uses librdkafka's *cached* watermarks (kept
fresh by fetch responses), so a refresh never waits on the broker and can run
inside the batch loop.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException

from sie.kernel.consumer import KafkaConsumer

log = logging.getLogger("sie.lag")


def consumer_lag(consumer: KafkaConsumer) -> dict[int, int]:
    """``{partition: records behind}`` for the assigned partitions whose position and watermark are known.

    Empty when nothing is assigned or the client cannot answer (a metric is not worth an error).
    """
    lag: dict[int, int] = {}
    try:
        assignment = consumer.assignment()
        if not assignment:
            return lag
        for tp in consumer.position(assignment):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                lag[tp.partition] = max(0, high - tp.offset)
    except KafkaException as exc:
        log.debug("lag update skipped: %s", exc)
    return lag
