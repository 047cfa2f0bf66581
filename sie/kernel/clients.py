"""Every Kafka client SIE makes, built by role from the typed settings, in one place.

Roles (each config is commented where it matters for exactly-once, liveness or bounded memory):

* ``eos_consumer_config``           a consume-transform-produce stage's consumer (scorer, CDC stage, backfill):
                                    offsets only inside transactions, read_committed, cooperative assignor;
* ``transactional_producer_config`` that stage's producer (stable ``transactional.id``: a restart fences
                                    the zombie), also the control-plane leader's fenced writer;
* ``idempotent_producer_config``    status and registration writers (agents, ``sie apply``, ``sie cdc``):
                                    retries never duplicate, no transactions;
* ``request_producer_config``       an application's request writer (``RequestProducer``: ``sie produce``, the
                                    demo): idempotent, lz4, a deep queue for bursts;
* ``state_reader_config``           readers that never commit, read_committed: of compacted state topics
                                    that ``assign()`` (control-plane state, agents' assignments, spec
                                    snapshots, rollouts, ``sie tail``) and throwaway groups that ``subscribe()``
                                    (``ResultCollector``, the demo's dead letters);
* ``group_member_config``           the control plane's leader-election membership;
* ``admin_config``                  an admin client of the cluster ``Settings`` name;
* ``broker_probe_config``           an admin client of a broker ``sie kafka`` runs itself (by address, before
                                    any ``Settings`` name it): is it up, create its SCRAM users.

``KafkaClients`` is how a component makes its clients: the real librdkafka classes by default, fakes in
unit tests (no broker needed for the logic; the broker tests stay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sie.kernel.consumer import KafkaConsumer
from sie.kernel.kafka_types import KafkaAdmin, KafkaProducer
from sie.kernel.names import Names
from sie.kernel.settings import Settings


def _consumer(config: dict[str, Any]) -> KafkaConsumer:
    from confluent_kafka import Consumer

    return cast(KafkaConsumer, Consumer(config))  # why a cast: sie.kernel.consumer


def _producer(config: dict[str, Any]) -> KafkaProducer:
    from confluent_kafka import Producer

    return cast(KafkaProducer, Producer(config))  # why a cast: sie.kernel.kafka_types


def _admin(config: dict[str, Any]) -> KafkaAdmin:
    from confluent_kafka.admin import AdminClient

    return cast(KafkaAdmin, AdminClient(config))


@dataclass(frozen=True)
class KafkaClients:
    """Factories of Kafka clients (each takes a librdkafka config dict)."""

    consumer: Callable[[dict[str, Any]], KafkaConsumer] = _consumer
    producer: Callable[[dict[str, Any]], KafkaProducer] = _producer
    admin: Callable[[dict[str, Any]], KafkaAdmin] = _admin


#: heartbeat of an exactly-once stage's consumer.  Classic-protocol members learn that the group rebalances
#: only from a heartbeat's answer, so this bounds how long the partitions of a member that left on a planned
#: stop wait for the others (two static scorers, 4 partitions, 300 req/s, one stopped: the stopped one's
#: partitions were silent 1.56 s at 2500 ms, 0.40 s at 500 ms, 0.20 s at 250 ms).  Cost, measured on a
#: private broker (40 idle members of 8 groups, 30 s): broker CPU 13.4 % at 2500 ms, 14.0 % at 500 ms,
#: 11.9 % at 250 ms (noise): each member's idle fetch long-polls (fetch.wait.max.ms 50) are ~20 requests/s,
#: its heartbeats 4/s.
EOS_HEARTBEAT_MS = 250

#: the assignor of an exactly-once stage's consumer group.  Eager ``range`` made every rebalance revoke every
#: partition of every member, which then re-read the committed offsets of all of them; read_committed with
#: KIP-447 (``require_stable``) holds that read while an offset is still PENDING in a transaction, so when a
#: scorer was cut off from the brokers between ``send_offsets_to_transaction`` and its commit, the healthy
#: scorer that took its partitions stopped on ALL of its own too until the cut-off one's transaction ended
#: (issue 27: ~40 s, 51-52 s for the cut-off one's).  ``cooperative-sticky`` (KIP-429) revokes only what moves:
#: the others keep fetching and committing their own partitions, and only the moved ones wait for their
#: offsets (bounded by ``eos_transaction_timeout_ms``).  Measured in the partition campaign (docs/reliability.md).
#: A group cannot mix eager and cooperative members: a member started with the other assignor is refused
#: (INCONSISTENT_GROUP_PROTOCOL) until the last member of the other kind has left, so upgrading from a release
#: with ``range`` restarts all replicas of a model together (its old members serve meanwhile).
EOS_ASSIGNOR = "cooperative-sticky"


#: connection liveness of an exactly-once stage's clients.  A partition's fetch (or a produce, a commit) rides
#: one TCP connection per broker; when a link goes down and up again, a request sent meanwhile is retransmitted
#: by TCP at exponentially growing intervals, so after the heal the connection can wait tens of seconds for its
#: next retransmission, and librdkafka only gives up on a request after ``socket.timeout.ms`` (60 s by default):
#: with a link flapping every 3 s, one partition stayed silently stalled ~49 s, 14-28 s past the heal (issue
#: 27).  A request unanswered for 10 s now closes its connection (librdkafka logs REQTMOUT naming the broker)
#: and a fresh one is opened at once; reconnect attempts back off to at most 2 s instead of 10 s, and a connect
#: that does not complete in 10 s (a SYN lost in the partition) is retried instead of waited on for 30 s.  The
#: requests that may take longer have their own timeouts (JoinGroup: max.poll.interval.ms + 3 s, heartbeats:
#: the session); a fetch is a 50 ms long-poll.  The producer's socket timeout follows transaction.timeout.ms
#: (``eos_transaction_timeout_ms``) and must stay below it.
EOS_LIVENESS: dict[str, int] = {
    "socket.timeout.ms": 10_000,
    "socket.connection.setup.timeout.ms": 10_000,
    "reconnect.backoff.max.ms": 2_000,
}


#: the shortest transaction timeout of an exactly-once stage (Kafka Streams' exactly-once default): with 6 s (a 6 s
#: session), brokers on an overloaded 2-core host (load 45-55) acknowledged records later than that, every batch
#: timed out and was aborted, and two scorers never reached a steady load (the partition campaign, issue 27)
EOS_MIN_TRANSACTION_TIMEOUT_MS = 10_000


def eos_transaction_timeout_ms(session_timeout_ms: int) -> int:
    """``transaction.timeout.ms`` of a consume-transform-produce stage whose consumer has this session timeout:
    the same, and at least ``EOS_MIN_TRANSACTION_TIMEOUT_MS``.

    A member cut off from the brokers leaves its transaction open, and with it the offsets it sent to it: the
    member that takes its partitions after the session timeout cannot read their committed offsets until that
    transaction ends, which, if the cut-off member does not come back, is when the coordinator aborts it:
    ``transaction.timeout.ms`` after it began, checked every ``transaction.abort.timed.out.transaction.cleanup.
    interval.ms`` (10 s by default).  librdkafka's 60 s default kept a moved partition stalled ~60 s; sized to the
    session, a moved partition waits about as long as the session itself again.  A transaction here is open only
    from the batch's first output to its commit (inference runs before it: ``sie.streams.eos.cycle``), so even
    a slow broker rarely makes one outlive it, and then it is aborted and the batch read again (exactly once
    holds either way).  Kafka Streams defaults exactly-once transactions to 10 s for the same reason.
    librdkafka lowers the producer's ``message.timeout.ms`` and ``socket.timeout.ms`` to it as well."""
    return max(session_timeout_ms, EOS_MIN_TRANSACTION_TIMEOUT_MS)


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
        # classic protocol, incremental (KIP-429): a rebalance revokes only the partitions that move, so a member
        # keeps fetching and committing its own partitions while another's are handed over (EOS_ASSIGNOR)
        "partition.assignment.strategy": EOS_ASSIGNOR,
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
        **EOS_LIVENESS,  # a request stuck on a connection that lost packets is retried on a fresh one
    })


def transactional_producer_config(settings: Settings, transactional_id: str, *, max_batch: int = 256,
                                  transaction_timeout_ms: int = 60_000, linger_ms: int = 5,
                                  buffer_kbytes: int | None = None) -> dict[str, Any]:
    """Transactional producer (stable ``transactional.id`` per instance/job: a restart fences the zombie).

    ``buffer_kbytes`` caps what the producer may queue (librdkafka's default is 1 GiB per producer): a
    multi-model worker process (``sie.workers.multimodel``) runs one producer per model and bounds each."""
    return settings.kafka_client_config(**{
        "client.id": Names.stage_client_id(transactional_id, "producer"),
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
        # a request stuck on a connection that lost packets is retried on a fresh one (EOS_LIVENESS); librdkafka
        # requires the socket timeout at least 100 ms below the transaction timeout
        **EOS_LIVENESS,
        "socket.timeout.ms": min(EOS_LIVENESS["socket.timeout.ms"], transaction_timeout_ms - 100),
    })


def idempotent_producer_config(settings: Settings, client_id: str, *, linger_ms: int = 5,
                               message_timeout_s: float | None = None, **overrides: Any) -> dict[str, Any]:
    """A non-transactional writer whose retries never duplicate a record (status, registrations, specs).
    ``message_timeout_s``: a record not acknowledged within it fails (as a fresh producer's would), not later."""
    return settings.kafka_client_config(**{
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "message.max.bytes": settings.max_record_bytes,
        **({"message.timeout.ms": int(message_timeout_s * 1000)} if message_timeout_s is not None else {}),
        **overrides,
    })


def failed_deliveries_only(config: dict[str, Any], on_failed: Callable[[Any, Any], None]) -> dict[str, Any]:
    """``config`` with delivery reports of failed records only (nothing per successful record), to
    ``on_failed(err, msg)``: a record the broker refuses (a missing ACL) fails there, not only as "N message(s)
    failed delivery" from ``commit_transaction``."""
    return {**config, "delivery.report.only.error": True, "on_delivery": on_failed}


def leader_producer_config(settings: Settings, transactional_id: str, *, transaction_timeout_ms: int) -> dict[str, Any]:
    """The control-plane leader's fenced writer: a transactional producer whose records are lz4-compressed (an
    Assignment repeats each replica's spec document: lz4 stores and sends it ~30x smaller, a node's 85-replica
    record 124 KB -> ~4 KB, what every agent's replay and live read fetch)."""
    return {**transactional_producer_config(settings, transactional_id, transaction_timeout_ms=transaction_timeout_ms),
            "compression.type": "lz4"}


def request_producer_config(settings: Settings, client_id: str, **overrides: Any) -> dict[str, Any]:
    """An application's writer of requests (``sie.connectors.producer.RequestProducer``): idempotent (a retry
    never duplicates a request), lz4 (requests are JSON), room for a burst of 200,000 queued requests."""
    return idempotent_producer_config(settings, client_id, **{
        "compression.type": "lz4",
        "queue.buffering.max.messages": 200_000,
        **overrides,
    })


#: fetch long-poll of a reader that serves as a read barrier on the data path (the rollouts read by a scorer
#: assigned partitions).  A consumer's position passes a trailing transaction marker only with the next fetch
#: answer, so an idle reader at its end proves it with the default 500 ms long-poll only after 0.1-0.5 s, which
#: stalled every partition of the scorer at each assignment; 50 ms (the stage consumer's own) takes ~10 ms.
BARRIER_FETCH_WAIT_MS = 50


#: fetch long-poll of a replay (the spec snapshots, the artifact manifests and chunks): the broker answers an
#: empty fetch at the end after 50 ms, not librdkafka's 500 ms default
REPLAY_FETCH_WAIT_MS = 50


def state_reader_config(settings: Settings, group_id: str, client_id: str, *, partition_eof: bool = True,
                        fetch_wait_ms: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A reader of (compacted) state topics that ``assign()``s and never commits: ``group_id`` is required
    by librdkafka but never joined; only committed records (transactional writers) are seen.
    ``fetch_wait_ms``: its fetch long-poll (``REPLAY_FETCH_WAIT_MS``, ``BARRIER_FETCH_WAIT_MS``; None:
    librdkafka's default)."""
    return settings.kafka_client_config(**{
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": partition_eof,
        **({"fetch.wait.max.ms": fetch_wait_ms} if fetch_wait_ms is not None else {}),
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


def quiet_admin_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """``admin_config`` logging warnings and up (``sie.kernel.admin.admin_client``): hides the info line each
    destroyed client prints."""
    return {"log_level": 4, **admin_config(settings), **overrides}


def scram_client_security(mechanism: str, user: str, password: str, ca_cert: str) -> dict[str, Any]:
    """The properties of a client that logs in to a SASL_SSL listener as ``user`` (``broker_probe_config``'s
    ``security``: ``sie kafka``'s own brokers, probed as their admin or as a user just created)."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password, "ssl.ca.location": ca_cert}


#: the properties of a client's config that say how it connects (an allow-list: a consumer's or producer's own
#: properties would make an admin client beside it log a warning for each)
_CONNECTION_KEYS = frozenset({"bootstrap.servers", "client.id", "logger", "client.dns.lookup", "broker.address.family"})
_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "reconnect.", "connections.")


def connection_config(client_config: dict[str, Any]) -> dict[str, Any]:
    """How ``client_config``'s client connects (brokers, security, socket settings), for an admin client beside
    it: an exactly-once stage that has only its consumer's config describing its own group."""
    return {key: value for key, value in client_config.items()
            if key in _CONNECTION_KEYS or key.startswith(_CONNECTION_PREFIXES)}


def broker_probe_config(bootstrap: str, security: dict[str, Any] | None = None, *,
                        timeout_s: float | None = None, log_level: int = 3) -> dict[str, Any]:
    """An admin client of a local broker by address (``sie.infra.kafka.local``: probing a broker that boots,
    creating SCRAM users).  ``security``: librdkafka properties of a secured cluster (the admin's SASL_SSL
    settings).  ``timeout_s``: how long a probe waits, which bounds its connection setup too."""
    return {
        **(security or {}),
        "bootstrap.servers": bootstrap,
        **({
            "reconnect.backoff.max.ms": 500,  # default 10 s would delay noticing a broker that just came up
            "socket.connection.setup.timeout.ms": max(1000, int(timeout_s * 1000)),
        } if timeout_s is not None else {}),
        "log_level": log_level,
    }
