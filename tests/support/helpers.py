"""Shared test helpers: wait on conditions (never sleep to synchronise), unique topics, produce/consume.

Everything here talks to the real broker the ``kafka_settings`` fixture points at.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from sie.kernel.settings import Settings

#: the source checkout (tests read its examples/ and docs/; product code never depends on it)
REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {text}")
        time.sleep(interval)  # the polling period between checks of the condition; the deadline above bounds it


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test run uses (parallel runs share the broker)."""
    return f"{prefix}.{uuid.uuid4().hex[:12]}"


def unique_group(prefix: str = "test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Record(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]
    partition: int
    offset: int

    def json(self) -> Any:
        return None if self.value is None else json.loads(self.value)


def _topic_partitions(consumer: Any, topic: str, deadline: float) -> list[int]:
    """The topic's partitions; waits (to ``deadline``) for a topic created a moment ago to show them."""
    def partitions() -> list[int]:
        left = deadline - time.monotonic()
        meta = consumer.list_topics(topic, timeout=max(0.5, min(10.0, left))).topics.get(topic)
        return [] if meta is None or meta.error is not None else sorted(meta.partitions)

    return wait_until(partitions, max(0.0, deadline - time.monotonic()), interval=0.2,
                      message=f"topic {topic} to exist")


def end_offsets(consumer: Any, topic: str, partitions: Iterable[int], timeout: float = 10.0) -> dict[int, int]:
    """partition -> its end now, as ``consumer`` reads: the high watermark, or with read_committed the last
    stable offset, so the records of a transaction still open lie beyond the end and are not waited for
    (``sie.kernel.replay.end_offsets``: what the product's readers use, transient refusals retried)."""
    from sie.kernel.replay import end_offsets as kernel_end_offsets

    return {p: end for (_t, p), end in kernel_end_offsets(consumer, [(topic, p) for p in partitions],
                                                          timeout_s=timeout).items()}


def read_up_to(reached: dict[int, int], msg: Any) -> bool:
    """Advance ``reached`` (partition -> offset read up to) by one polled message; True if it is a record.

    A partition-EOF event (``enable.partition.eof``) carries the end the fetcher reached, which lies past
    any transaction marker after the last record (a record's offset + 1 does not); other errors are left
    to the caller."""
    from confluent_kafka import KafkaError

    p = msg.partition()
    if msg.error() is not None:
        if msg.error().code() == KafkaError._PARTITION_EOF:
            reached[p] = max(reached.get(p, 0), msg.offset())
        return False
    reached[p] = max(reached.get(p, 0), msg.offset() + 1)
    return True


def behind(reached: dict[int, int], ends: dict[int, int]) -> dict[int, str]:
    """partition -> "read up to/end" for every partition not yet read to its end (empty when all are)."""
    return {p: f"{reached.get(p, 0)}/{end}" for p, end in sorted(ends.items()) if reached.get(p, 0) < end}


def consume_all(
    settings: Settings,
    topic: str,
    expected: int | None = None,
    timeout: float = 15.0,
    isolation: str = "read_committed",
) -> list[Record]:
    """Read ``topic`` from the beginning with a throwaway group, up to the END of every partition.

    The end is the high watermark as a consumer with ``isolation`` sees it (read_committed: the last stable
    offset, see ``end_offsets``).  Which end:

    - ``expected=None``: the ends when the read starts (once the topic exists).  Call it after whatever is
      to be checked was written (producer flushed, job finished, stage stopped): then ``== []`` or a count
      proves nothing else is there, which "idle for a second" never did.
    - ``expected=N``: waits until at least N records were read, then takes the ends again and reads on to
      them, so a record already written past the N-th (a duplicate) comes back too and the caller's exact
      count or comparison fails.  More than N is returned, never trimmed: the caller asserts the count.

    AssertionError at ``timeout`` (the whole call, topic lookup included), saying how many records (of N)
    it got, the partitions short of their end and the last records read: never a partial answer.
    Records come sorted by (partition, offset).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    deadline = time.monotonic() + timeout
    consumer = Consumer(settings.kafka_client_config(**{
        "group.id": unique_group("consume-all"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": True,
        # the end is known from an empty fetch at it (partition EOF): answered at once, not after 500 ms
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": 5,
    }))
    records: list[Record] = []
    reached: dict[int, int] = {}
    try:
        partitions = _topic_partitions(consumer, topic, deadline)
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2 = OFFSET_BEGINNING
        ends = end_offsets(consumer, topic, partitions) if expected is None else None
        while True:
            if ends is None and len(records) >= expected:  # type: ignore[operator]
                ends = end_offsets(consumer, topic, partitions)
            if ends is not None and not behind(reached, ends):
                break
            if time.monotonic() >= deadline:
                raise AssertionError(_short_read(consumer, topic, partitions, expected, timeout, records, reached, ends))
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"consuming {topic}: {msg.error()}")
            if read_up_to(reached, msg):
                records.append(Record(msg.key(), msg.value(), dict(msg.headers() or []), msg.partition(), msg.offset()))
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def _short_read(consumer: Any, topic: str, partitions: list[int], expected: int | None, timeout: float,
                records: list[Record], reached: dict[int, int], ends: dict[int, int] | None) -> str:
    """What consume_all saw when its deadline hit."""
    if ends is None:  # fewer than expected: show how far each partition was read against its end now
        try:
            now = end_offsets(consumer, topic, partitions, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - the report must not hide the timeout
            now = {}
            where = f"(end offsets unavailable: {exc}) "
        else:
            where = ""
        where += "read up to/end now per partition: " + str({p: f"{reached.get(p, 0)}/{now.get(p, '?')}"
                                                               for p in partitions})
        what = f"got {len(records)} of {expected} records"
    else:
        where = f"partitions not read to their end (read up to/end): {behind(reached, ends)}"
        what = f"got {len(records)} records" + ("" if expected is None else f" (>= {expected} expected)")
    last = [(r.partition, r.offset, r.key, (r.value or b"")[:80]) for r in records[-3:]]
    return f"consume_all({topic}): timed out after {timeout:.1f}s: {what}; {where}; last records read: {last}"


#: one idempotent producer per cluster for the tests' bulk produce (``produce_to``): a new one waits ~0.5 s for its
#: producer id before its first batch is sent (librdkafka's idempotence timer), so a producer per call cost a test
#: that produces 60 batches 30 s
_PRODUCERS: dict[tuple[str, ...], Any] = {}
_PRODUCERS_LOCK = threading.Lock()


def _shared_producer(settings: Settings) -> Any:
    from confluent_kafka import Producer

    config = settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True, "linger.ms": 20,
                                             "message.max.bytes": 2_000_000})
    key = tuple(f"{k}={v}" for k, v in sorted(config.items()) if k != "logger")
    with _PRODUCERS_LOCK:
        if key not in _PRODUCERS:
            _PRODUCERS[key] = Producer(config)
        return _PRODUCERS[key]


def produce_to(settings: Settings, topic: str, messages: Iterable[tuple[Any, Any, Any]]) -> int:
    """Produce ``(key, value, headers)`` to ``topic`` on this cluster's shared idempotent producer (acks=all) and
    flush; returns the count.  AssertionError naming the topic if any is undelivered; the failed producer (a fatal
    idempotence error, say) is dropped, so the next call starts a new one.  Never sent twice: a resend would put a
    request in twice and an exactly-once proof would blame the product for it."""
    producer = _shared_producer(settings)
    errors: list[str] = []
    count = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    try:
        for key, value, headers in messages:
            while True:
                try:
                    producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
        remaining = producer.flush(60)
    except Exception as exc:
        errors.append(str(exc))
        remaining = -1
    if remaining or errors:
        with _PRODUCERS_LOCK:
            for key_, cached in list(_PRODUCERS.items()):
                if cached is producer:
                    del _PRODUCERS[key_]
        raise AssertionError(f"producing to {topic}: {remaining} undelivered, errors {errors[:3]}")
    return count


def produce_json(
    settings: Settings,
    topic: str,
    records: Iterable[Any],
    key_fn: Callable[[Any], str | bytes | None] | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    """Produce each record as JSON (acks=all, idempotent: ``produce_to``) and flush; returns the count delivered."""
    return produce_to(settings, topic, ((key_fn(record) if key_fn else None, json.dumps(record).encode(), headers)
                                        for record in records))


def create_topic(settings: Settings, name: str, partitions: int = 1, replication: int = 1,
                 config: dict[str, str] | None = None) -> str:
    """Create a plain test topic and wait until it has leaders."""
    from sie.kernel.admin import ensure_topics
    from sie.kernel.topics import TopicSpec

    compacted = (config or {}).get("cleanup.policy") == "compact"
    extra = {k: v for k, v in (config or {}).items() if k != "cleanup.policy"}
    ensure_topics(settings, [TopicSpec(name, partitions, compacted, "test", extra)], replication_factor=replication)
    return name


class TopicTail:
    """Reads a topic from the beginning in a background thread, decoding Avro values (for assertions)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.records: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(settings.kafka_client_config(**{
            "group.id": f"tail-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
        }))
        partitions = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from sie.schemas.avro_codec import decode

        while not self._stop.is_set():
            for msg in self._consumer.consume(100, timeout=0.1):
                if msg.error() is None and msg.value() is not None:
                    with self._lock:
                        self.records.append((msg.key().decode(), decode(msg.value())))

    def values(self) -> list[dict[str, Any]]:
        with self._lock:
            return [v for _, v in self.records]

    def find(self, **match: Any) -> list[dict[str, Any]]:
        return [v for v in self.values() if all(v.get(k) == want for k, want in match.items())]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


# --- time bounds on measured durations, derived from the configuration under test -------------------

#: Slack for one failover measured on a loaded 2-core CI machine, where the broker, two control planes,
#: agents and their workers share the cores: a rejoin plus an election (init_transactions, reading
#: control-leader to its end, one transaction) takes 1-2 s idle and several times that there.  It is
#: slack for the measurement, not a product timing.
FAILOVER_SLACK_S = 12.0


def leader_takeover_bound_s() -> float:
    """Most seconds from SIGKILL of the leading ``sie control`` to the standby reporting ``role=leader``.

    The processes run with ``sie control``'s default ``--session-timeout-ms`` (read from the CLI here, so
    the bound follows it).  The group coordinator expires the killed member at most one session timeout
    after its last heartbeat (sent before the kill); the standby hears of the rebalance on its next
    heartbeat, ``heartbeat.interval.ms = max(500, session // 6)`` (LeaderElector._consumer); then it
    rejoins and elects within FAILOVER_SLACK_S.  With the default 6000 ms: 6 + 1 + 12 = 19 s.
    """
    from sie.commands.control import control

    session_ms = next(p.default for p in control.params if p.name == "session_timeout_ms")
    heartbeat_ms = max(500, session_ms // 6)
    return (session_ms + heartbeat_ms) / 1000 + FAILOVER_SLACK_S


# ---- control API tokens (tests configure the control plane with known tokens instead of a generated one) ----
OPERATOR_TOKEN = "sie_test-operator-token-0123456789abcdefghijklmnopq"
VIEWER_TOKEN = "sie_test-viewer-token-0123456789abcdefghijklmnopqrs"


def with_api_tokens(settings: Settings) -> Settings:
    """``settings`` whose control plane accepts ``OPERATOR_TOKEN`` (operator) and ``VIEWER_TOKEN`` (viewer)."""
    import hashlib

    from sie.kernel.settings import ApiTokenEntry

    entries = [ApiTokenEntry(name=role, role=role, sha256=hashlib.sha256(token.encode()).hexdigest())
               for role, token in (("operator", OPERATOR_TOKEN), ("viewer", VIEWER_TOKEN))]
    return settings.model_copy(update={"api_tokens": entries})


def forge_artifact(store: Any, data: bytes, name: str = "forged.bin", corrupt: int | None = None,
                   drop: int | None = None) -> Any:
    """Put ``data`` on a cluster's artifact topics as an upload writes it, but with chunk ``corrupt`` flipped
    after its digest was taken (bit rot, tampering) or chunk ``drop`` never written, then a manifest claiming
    the whole: what a fetch must refuse.  Returns the ``Manifest``."""
    import hashlib

    from confluent_kafka import Producer

    from sie.schemas.artifact_store import Manifest
    from sie.schemas.avro_codec import encode

    names, settings = store.settings.names, store.settings
    sha = hashlib.sha256(data).hexdigest()
    size = store.chunk_size
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    partition = store.partition_of(sha, 3)
    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
    offsets: list[int] = []
    for i, chunk in enumerate(chunks):
        if i == drop:
            continue
        value = bytes([chunk[0] ^ 0xFF]) + chunk[1:] if i == corrupt else chunk
        producer.produce(store.chunk_topic, value=value, key=names.artifact_chunk_key(sha, i).encode(),
                         partition=partition, headers=[("sie.sha256", hashlib.sha256(chunk).hexdigest().encode())],
                         on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
    assert producer.flush(30) == 0
    first = min(offsets)
    manifest = Manifest(sha, name, len(data), size, len(chunks), partition, first, first + len(chunks) - 1, 1)
    producer.produce(store.manifest_topic, key=names.artifact_key(sha).encode(),
                     value=encode("ArtifactManifest", manifest.to_record()))
    assert producer.flush(30) == 0
    return manifest
