"""librdkafka settings of every exactly-once stage (scorer, CDC stage, backfill), in one place.

Each choice is commented where it matters: consume-transform-produce correctness (offsets only inside
transactions, read_committed, eager assignor) and the latency/throughput traps measured in
``bench/bench_scoring.py`` (CONCURRENT_TRANSACTIONS retries, fetch back-off).
"""

from __future__ import annotations

from typing import Any

from sie.kernel.settings import Settings


def consumer_config(settings: Settings, group_id: str, client_id: str, *, max_batch: int = 256,
                    session_timeout_ms: int = 10_000, max_poll_interval_ms: int = 300_000,
                    fetch_queue_kbytes: int = 16_384, auto_offset_reset: str = "earliest",
                    group_instance_id: str | None = None) -> dict[str, Any]:
    """Consumer of an exactly-once stage; ``group_instance_id`` turns on static membership."""
    return settings.kafka_client_config(**{
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,  # offsets are committed only inside the producer's transaction
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",  # never see records of aborted transactions (explicit on purpose)
        "auto.offset.reset": auto_offset_reset,
        "partition.assignment.strategy": "range",  # classic protocol, eager: on_revoke sees every partition go
        **({"group.instance.id": group_instance_id} if group_instance_id else {}),
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(500, session_timeout_ms // 4),
        "max.poll.interval.ms": max_poll_interval_ms,
        "queued.max.messages.kbytes": fetch_queue_kbytes,  # bounded prefetch: flat memory whatever the backlog
        "queued.min.messages": max(1000, 4 * max_batch),
        "fetch.wait.max.ms": 50,
        # librdkafka waits fetch.queue.backoff.ms (default 1 s) before refetching once its queue thresholds
        # are reached; with the thresholds above that stalled consume() mid-backlog (bench_scoring).
        "fetch.queue.backoff.ms": 5,
        "enable.partition.eof": False,
    })


def producer_config(settings: Settings, transactional_id: str, *, max_batch: int = 256,
                    transaction_timeout_ms: int = 60_000) -> dict[str, Any]:
    """Transactional producer (stable ``transactional.id`` per instance/job: a restart fences the zombie)."""
    return settings.kafka_client_config(**{
        "client.id": f"{transactional_id}.producer",
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,  # results of one batch leave together; commit_transaction flushes anyway
        "transaction.timeout.ms": transaction_timeout_ms,  # > the slowest batch
        # commit_transaction() returns before the coordinator has finished the transaction, so the next
        # transaction's first request often meets CONCURRENT_TRANSACTIONS and waits retry.backoff.ms
        # (confluent-kafka-python #967). 5 ms instead of 20 doubled a bare transactional copy loop.
        "retry.backoff.ms": 5,
        "queue.buffering.max.messages": max(100_000, 40 * max_batch),
    })
