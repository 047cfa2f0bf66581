"""A model's data path as an operator asks about it (`sie describe model`): records per second on its topics
over the last minute, and how far its scorer group is behind.

Counts come from offsets (``list_offsets``: the last stable offset now and the first offset at ``now - window``,
read_committed).  Offsets also number transaction markers (one per partition per committed transaction) and
aborted records, so where a partition has few offsets in the window (at most ``exact_below``) its records are read
and counted exactly; above that its last ``exact_below`` offsets are read as a sample and the span's offsets are
scaled by the sample's share of records.  WHY: the markers are not a small share when transactions are small: a
scorer answering 100 requests/s in batches of 3 writes a marker per 3 results, and the offset count said
``results 133.83/s`` (issue 38).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sie.kernel.clients import KafkaClients
from sie.kernel.settings import Settings


@dataclass(frozen=True)
class TopicTraffic:
    topic: str
    partitions: int
    records: int  # in the window
    window_s: float
    exact: bool

    @property
    def per_s(self) -> float:
        return self.records / self.window_s if self.window_s > 0 else 0.0


def _offsets(admin: Any, tps: list[Any], spec_of: Any, timeout: float) -> dict[tuple[str, int], int]:
    from confluent_kafka import IsolationLevel

    futures = admin.list_offsets({tp: spec_of(tp) for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=timeout)
    return {(tp.topic, tp.partition): fut.result(timeout=timeout).offset for tp, fut in futures.items()}


def _count_exact(settings: Settings, spans: dict[tuple[str, int], tuple[int, int]], timeout: float,
                 clients: KafkaClients | None = None) -> dict[tuple[str, int], int]:
    """Committed records in [start, end) of each partition (markers and aborted records are not delivered).

    A span is read when the consumer's position reaches its end (``sie.kernel.replay.ReadProgress``), never when
    a record at ``end - 1`` arrives: a span that ends on a transaction marker or an aborted transaction has no
    record there."""
    import uuid

    from confluent_kafka import TopicPartition

    from sie.kernel.clients import state_reader_config
    from sie.kernel.replay import ReadProgress

    counts: dict[tuple[str, int], int] = {}
    todo = {k: v for k, v in spans.items() if v[1] > v[0]}
    if not todo:
        return counts
    names = settings.names
    consumer = (clients or KafkaClients()).consumer(state_reader_config(
        settings, names.reader_group("describe", uuid.uuid4().hex[:8]), names.cli_client_id("describe"),
        partition_eof=False))  # the positions decide, not end-of-partition events
    progress = ReadProgress({k: end for k, (_start, end) in todo.items()},
                            {k: start for k, (start, _end) in todo.items()})
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _end) in todo.items()])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            progress.check_positions(consumer)
            if progress.done:
                break
            for msg in consumer.consume(500, 0.2):
                key = (msg.topic(), msg.partition())
                if progress.see(msg) and msg.offset() < progress.ends.get(key, 0):
                    counts[key] = counts.get(key, 0) + 1
    finally:
        consumer.close()
    return counts


def traffic(settings: Settings, topics: list[str], window_s: float = 60.0, exact_below: int = 2000,
            timeout: float = 10.0) -> dict[str, TopicTraffic]:
    """Records written to each of ``topics`` in the last ``window_s`` seconds (missing topics are left out;
    ``NotAuthorized`` for one this principal may not read)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from sie.kernel.admin import admin_client
    from sie.kernel.authz import topic_partitions
    from sie.kernel.clients import admin_config

    admin = admin_client(settings)
    config = admin_config(settings)
    # by name: a topic this principal may not read is NotAuthorized (naming the ACL), not "missing"
    found = {t: topic_partitions(admin, t, config, "READ", timeout) for t in dict.fromkeys(topics)}
    tps = [TopicPartition(t, p) for t, parts in found.items() for p in parts or ()]
    if not tps:
        return {}
    since_ms = int((time.time() - window_s) * 1000)
    ends = _offsets(admin, tps, lambda _tp: OffsetSpec.latest(), timeout)
    starts = _offsets(admin, tps, lambda _tp: OffsetSpec.for_timestamp(since_ms), timeout)
    spans = {k: (starts[k] if starts[k] >= 0 else ends[k], ends[k]) for k in ends}
    small = {k for k, v in spans.items() if v[1] - v[0] <= exact_below}
    # a large span: its last exact_below offsets, read, tell the share of records among its offsets
    read = {k: (v if k in small else (v[1] - exact_below, v[1])) for k, v in spans.items()}
    counted = _count_exact(settings, read, timeout)
    out: dict[str, TopicTraffic] = {}
    for topic in dict.fromkeys(tp.topic for tp in tps):
        keys = [k for k in spans if k[0] == topic]
        records = 0
        for k in keys:
            start, end = spans[k]
            if k in small:
                records += counted.get(k, 0)
            else:
                records += round((end - start) * counted.get(k, 0) / max(1, exact_below))
        out[topic] = TopicTraffic(topic, len(keys), records, window_s, all(k in small for k in keys))
    return out


def group_lag(settings: Settings, group: str, topic: str, timeout: float = 10.0) -> int | None:
    """Records of ``topic`` the consumer ``group`` has not committed yet (None: the topic does not exist;
    ``NotAuthorized`` if this principal may not read it)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from sie.kernel.admin import admin_client
    from sie.kernel.authz import topic_partitions
    from sie.kernel.clients import admin_config

    admin = admin_client(settings)
    partitions = topic_partitions(admin, topic, admin_config(settings), "READ", timeout)
    if partitions is None:
        return None
    tps = [TopicPartition(topic, p) for p in partitions]
    ends = _offsets(admin, tps, lambda _tp: OffsetSpec.latest(), timeout)
    firsts = _offsets(admin, tps, lambda _tp: OffsetSpec.earliest(), timeout)
    request = ConsumerGroupTopicPartitions(group, tps)
    result = admin.list_consumer_group_offsets([request], request_timeout=timeout)[group].result(timeout=timeout)
    committed = {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions or ()}
    lag = 0
    for key, end in ends.items():
        position = committed.get(key, -1)
        lag += max(0, end - (position if position >= 0 else firsts[key]))
    return lag
