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
REPO_ROOT = Path(__file__).resolve().parent.parent
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
        time.sleep(interval)


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


def consume_all(
    settings: Settings,
    topic: str,
    expected: int | None = None,
    timeout: float = 15.0,
    isolation: str = "read_committed",
    idle: float = 1.0,
) -> list[Record]:
    """Read ``topic`` from the beginning with a throwaway group.

    Stops at ``expected`` records, or (when ``expected`` is None) once the
    consumer has caught up with the end of every partition and seen nothing
    for ``idle`` seconds; always stops at ``timeout``.  Records come sorted by
    (partition, offset).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(settings.kafka_client_config(**{
        "group.id": unique_group("consume-all"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": True,
    }))
    records: list[Record] = []
    try:
        def topic_partitions() -> list[int]:
            md = consumer.list_topics(topic, timeout=10)
            meta = md.topics.get(topic)
            return [] if meta is None or meta.error is not None else list(meta.partitions)

        # A topic created a moment ago (by a worker, say) can take a metadata round to show its partitions.
        partitions = wait_until(topic_partitions, min(timeout, 15.0), interval=0.2,
                                message=f"topic {topic} to exist")
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2 = OFFSET_BEGINNING
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        last_activity = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(records) >= expected:
                break
            if expected is None and at_eof >= set(partitions) and time.monotonic() - last_activity >= idle:
                break
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                    continue
                raise AssertionError(f"consuming {topic}: {msg.error()}")
            at_eof.discard(msg.partition())
            last_activity = time.monotonic()
            records.append(Record(msg.key(), msg.value(), dict(msg.headers() or []), msg.partition(), msg.offset()))
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def produce_json(
    settings: Settings,
    topic: str,
    records: Iterable[Any],
    key_fn: Callable[[Any], str | bytes | None] | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    """Produce each record as JSON (acks=all, idempotent) and flush; returns the count delivered."""
    from confluent_kafka import Producer

    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
    errors: list[str] = []
    count = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for record in records:
        key = key_fn(record) if key_fn else None
        producer.produce(topic, json.dumps(record).encode(), key=key, headers=headers, on_delivery=on_delivery)
        producer.poll(0)
        count += 1
    remaining = producer.flush(30)
    if remaining or errors:
        raise AssertionError(f"producing to {topic}: {remaining} undelivered, errors {errors[:3]}")
    return count


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
