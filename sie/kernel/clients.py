"""Every Kafka client SIE makes, built by role from the typed settings, in one place.

Roles (each config is commented where it matters for exactly-once, liveness or bounded memory):

* ``eos_consumer_config``           a consume-transform-produce stage's consumer (scorer, CDC stage, backfill):
                                    offsets only inside transactions, read_committed, eager assignor;
* ``transactional_producer_config`` that stage's producer (stable ``transactional.id``: a restart fences
                                    the zombie), also the control-plane leader's fenced writer;
* ``idempotent_producer_config``    status and registration writers (agents, ``sie apply``, ``sie produce``):
                                    retries never duplicate, no transactions;
* ``state_reader_config``           readers of compacted state topics that ``assign()`` and never commit
                                    (control-plane state, agents' assignments, spec snapshots), read_committed;
* ``group_member_config``           the control plane's leader-election membership.

``KafkaClients`` is how a component makes its clients: the real librdkafka classes by default, fakes in
unit tests (no broker needed for the logic; the broker tests stay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sie.kernel.settings import Settings


def _consumer(config: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(config)


def _producer(config: dict[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(config)


def _admin(config: dict[str, Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(config)


@dataclass(frozen=True)
class KafkaClients:
    """Factories of Kafka clients (each takes a librdkafka config dict)."""

    consumer: Callable[[dict[str, Any]], Any] = _consumer
    producer: Callable[[dict[str, Any]], Any] = _producer
    admin: Callable[[dict[str, Any]], Any] = _admin


#: heartbeat of an exactly-once stage's consumer.  Classic-protocol members learn that the group rebalances
#: only from a heartbeat's answer, so this bounds how long the partitions of a member that left on a planned
#: stop wait for the others (two static scorers, 4 partitions, 300 req/s, one stopped: the stopped one's
#: partitions were silent 1.56 s at 2500 ms, 0.40 s at 500 ms, 0.20 s at 250 ms).  Cost, measured on a
#: private broker (40 idle members of 8 groups, 30 s): broker CPU 13.4 % at 2500 ms, 14.0 % at 500 ms,
#: 11.9 % at 250 ms (noise): each member's idle fetch long-polls (fetch.wait.max.ms 50) are ~20 requests/s,
#: its heartbeats 4/s.
EOS_HEARTBEAT_MS = 250


def eos_consumer_config(settings: Settings, group_id: str, client_id: str, *, max_batch: int = 256,
                        session_timeout_ms: int = 10_000, max_poll_interval_ms: int = 300_000,
                        fetch_queue_kbytes: int = 16_384, auto_offset_reset: str = "earliest",
                        group_instance_id: str | None = None,
                        heartbeat_interval_ms: int = EOS_HEARTBEAT_MS) -> dict[str, Any]:
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
        # members learn of a rebalance only from a heartbeat's answer (classic protocol): a member that left
        # on a planned stop (or joined) has its partitions served by the others within about this long
        # (EOS_HEARTBEAT_MS); capped at a third of the session so a live member is never timed out
        "heartbeat.interval.ms": min(heartbeat_interval_ms, session_timeout_ms // 3),
        "max.poll.interval.ms": max_poll_interval_ms,
        "queued.max.messages.kbytes": fetch_queue_kbytes,  # bounded prefetch: flat memory whatever the backlog
        "queued.min.messages": max(1000, 4 * max_batch),
        # a fetch waiting on an idle partition is answered as soon as a record (or, read_committed, a commit
        # marker) arrives: this bounds idle polling, not latency (50, 10 or 500 ms: the same p50 here)
        "fetch.wait.max.ms": 50,
        # librdkafka waits fetch.queue.backoff.ms (default 1 s) before refetching once its queue thresholds
        # are reached; with the thresholds above that stalled consume() mid-backlog (bench_scoring).
        "fetch.queue.backoff.ms": 5,
        "enable.partition.eof": False,
        # partitions added to a request topic are seen (and rebalanced onto) within 10 s, not librdkafka's
        # default 5 minutes; the stage then re-reads the result topic's partition count (issue 9, case 8)
        "topic.metadata.refresh.interval.ms": 10_000,
    })


def transactional_producer_config(settings: Settings, transactional_id: str, *, max_batch: int = 256,
                                  transaction_timeout_ms: int = 60_000, linger_ms: int = 5,
                                  buffer_kbytes: int | None = None) -> dict[str, Any]:
    """Transactional producer (stable ``transactional.id`` per instance/job: a restart fences the zombie).

    ``buffer_kbytes`` caps what the producer may queue (librdkafka's default is 1 GiB per producer): a
    multi-model worker process (``sie.workers.shared``) runs one producer per model and bounds each."""
    return settings.kafka_client_config(**{
        "client.id": f"{transactional_id}.producer",
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,  # outputs of one batch leave together; commit_transaction flushes anyway
        "transaction.timeout.ms": transaction_timeout_ms,  # > the slowest batch
        "message.max.bytes": settings.max_record_bytes,  # one limit for every record SIE writes
        # AddOffsetsToTxn meets CONCURRENT_TRANSACTIONS while the coordinator is still writing the previous
        # transaction's markers, or this one's AddPartitionsToTxn (sent at the first produce) to its log, and
        # librdkafka retries it after retry.backoff.ms (exponential since 2.3, capped by retry.backoff.max.ms;
        # confluent-kafka-python #967). 5 ms instead of 20 doubled a bare transactional copy loop; 1 ms
        # cut send_offsets' median again at light load (bench_latency). Other retries back off from it too.
        "retry.backoff.ms": 1,
        "queue.buffering.max.messages": max(100_000, 40 * max_batch),
        **({"queue.buffering.max.kbytes": buffer_kbytes} if buffer_kbytes is not None else {}),
    })


def idempotent_producer_config(settings: Settings, client_id: str, **overrides: Any) -> dict[str, Any]:
    """A non-transactional writer whose retries never duplicate a record (status, registrations, specs)."""
    return settings.kafka_client_config(**{
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.max.bytes": settings.max_record_bytes,
        **overrides,
    })


def state_reader_config(settings: Settings, group_id: str, client_id: str, *, partition_eof: bool = True,
                        **overrides: Any) -> dict[str, Any]:
    """A reader of (compacted) state topics that ``assign()``s and never commits: ``group_id`` is required
    by librdkafka but never joined; only committed records (transactional writers) are seen."""
    return settings.kafka_client_config(**{
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": partition_eof,
        **overrides,
    })


def group_member_config(settings: Settings, group_id: str, client_id: str, *, session_timeout_ms: int,
                        **overrides: Any) -> dict[str, Any]:
    """Membership of a coordination group (leader election): cooperative, end-of-partition signalled."""
    return settings.kafka_client_config(**{
        "group.id": group_id,
        "client.id": client_id,
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(500, session_timeout_ms // 6),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        # a standby joining does not revoke partition 0 from the leader (no leadership blip)
        "partition.assignment.strategy": "cooperative-sticky",
        **overrides,
    })


def admin_config(settings: Settings) -> dict[str, Any]:
    return settings.kafka_client_config()
