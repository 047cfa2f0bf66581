"""Applied specs on Kafka: the compacted ``<prefix>.specs`` topic, key = model name.

Writers (``sie apply``/``sie delete``) publish ``ModelSpecRecord`` values
(Avro, ``sie.schemas.avro_codec``) with an idempotent producer and wait for the
broker's acknowledgement; a delete publishes a ``deleted=true`` record (so
live readers see the event) followed by a tombstone (so compaction forgets the
model).  Readers (CLI, control plane) replay the topic from the beginning to
the end offsets observed at start and keep the latest record per key.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sie.kernel.errors import KafkaUnavailable, SieError
from sie.kernel.topics import system_topic, system_topics
from sie.schemas.avro_codec import AvroCodecError, decode, encode
from sie.schemas.spec_models import ModelService

if TYPE_CHECKING:
    from sie.kernel.clients import KafkaClients
    from sie.kernel.settings import Settings

log = logging.getLogger(__name__)
RECORD = "ModelSpecRecord"


def specs_topic(settings: Settings) -> str:
    return system_topic("specs", prefix=settings.topic_prefix)


def spec_record(spec: ModelService, applied_at_ms: int, deleted: bool = False) -> dict[str, Any]:
    """The ModelSpecRecord of a spec (``spec_json`` = ``to_document()`` as compact JSON)."""
    return {
        "name": spec.name,
        "version": spec.version,
        "spec_json": json.dumps(spec.to_document(), separators=(",", ":"), sort_keys=True),
        "applied_at_ms": applied_at_ms,
        "deleted": deleted,
    }


def spec_from_record(record: dict[str, Any]) -> ModelService:
    return ModelService.from_document(json.loads(record["spec_json"]))


def ensure_specs_topic(settings: Settings) -> None:
    """Create the specs topic (compacted) if missing, via the infra engineer's ``sie.kernel.admin``."""
    from sie.kernel.admin import ensure_topics

    name = specs_topic(settings)
    ensure_topics(settings, [t for t in system_topics(settings.topic_prefix) if t.name == name])


class AckedWriter:
    """One idempotent producer for many acknowledged writes (``produce_acknowledged``).

    WHY: a fresh idempotent producer waits for its producer id from the broker before its first record is
    acknowledged: 0.5 s per write measured on a loaded machine (bench/bench_scale.py), which capped the control
    API at ~5 applies/s and put half a second into every apply -> assignment.  The control plane's API and
    ``sie apply`` of many specs keep one.  Thread-safe (librdkafka's producer is); made on first use.
    """

    def __init__(self, settings: Settings, client_id: str, clients: Any = None, timeout_s: float = 30.0) -> None:
        self._settings = settings
        self._client_id = client_id
        self._clients = clients
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._producer: Any = None

    def producer(self) -> Any:
        with self._lock:
            if self._producer is None:
                from sie.kernel.clients import KafkaClients, idempotent_producer_config

                clients = self._clients or KafkaClients()
                # a record not acknowledged within the timeout fails (as a fresh producer's would), not later
                self._producer = clients.producer(idempotent_producer_config(
                    self._settings, self._client_id, linger_ms=0, message_timeout_s=self._timeout_s))
            return self._producer

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout)


def produce_acknowledged(settings: Settings, messages: list[tuple[str, bytes | None]], timeout: float,
                         topic: str | None = None, writer: AckedWriter | None = None) -> None:
    """Send ``(key, value)`` pairs in order to ``topic`` (default: the specs topic) with an idempotent producer
    (``writer``'s, else a fresh one); raise unless every one is acknowledged within ``timeout``."""
    if writer is not None:
        producer = writer.producer()
    else:
        from sie.kernel.clients import KafkaClients, idempotent_producer_config

        # no duplicates or reordering on retry; a record not acknowledged within the timeout fails
        producer = KafkaClients().producer(idempotent_producer_config(
            settings, settings.names.writer_client_id("specs"), message_timeout_s=timeout))
    errors: list[str] = []
    delivered: list[int] = []
    done = threading.Event()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"{msg.topic()} key {msg.key()!r}: {err.str()}")
        else:
            delivered.append(msg.offset())
        if len(errors) + len(delivered) == len(messages):
            done.set()

    topic = topic or specs_topic(settings)
    for key, value in messages:
        producer.produce(topic, key=key.encode("utf-8"), value=value, on_delivery=on_delivery)
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:  # serves the callbacks (any thread's)
        producer.poll(min(0.05, max(0.0, deadline - time.monotonic())))
    if errors:
        raise SieError(f"publishing to {topic} failed: {'; '.join(errors)}")
    if len(delivered) != len(messages):
        raise KafkaUnavailable(
            f"{topic}: {len(messages) - len(delivered)} record(s) not acknowledged within {timeout:.0f}s by "
            f"{settings.bootstrap_servers}; check the broker (sie kafka status) and retry"
        )
    if writer is None:
        producer.flush(timeout)


def publish_spec(settings: Settings, spec: ModelService, timeout: float = 30.0,
                 clock: Callable[[], float] = time.time, ensure_topic: bool = True,
                 writer: AckedWriter | None = None) -> dict[str, Any]:
    """Publish ``spec`` on the specs topic and wait for the acknowledgement; returns the record sent.
    ``writer``: a producer kept for many writes (``AckedWriter``), else a fresh one."""
    if ensure_topic:
        ensure_specs_topic(settings)
    record = spec_record(spec, int(clock() * 1000))
    produce_acknowledged(settings, [(spec.name, encode(RECORD, record))], timeout, writer=writer)
    return record


def delete_spec(settings: Settings, spec: ModelService, timeout: float = 30.0,
                clock: Callable[[], float] = time.time, writer: AckedWriter | None = None) -> None:
    """Publish a ``deleted=true`` record, then a tombstone, for the spec's model."""
    record = spec_record(spec, int(clock() * 1000), deleted=True)
    produce_acknowledged(settings, [(spec.name, encode(RECORD, record)), (spec.name, None)], timeout, writer=writer)


@dataclass
class SpecSnapshot:
    """The specs topic replayed to its end: live specs, names deleted, records that could not be read."""

    specs: dict[str, ModelService] = field(default_factory=dict)
    applied_at_ms: dict[str, int] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def apply(self, key: str, value: bytes | None, where: str) -> None:
        """Fold one record into the snapshot (latest per key wins; tombstone/deleted removes)."""
        if value is None:
            self.specs.pop(key, None)
            self.applied_at_ms.pop(key, None)
            self.deleted.add(key)
            return
        try:
            record = decode(value, expected=RECORD)
            spec = None if record["deleted"] else spec_from_record(record)
        except (AvroCodecError, ValueError) as exc:  # ValueError covers JSON and pydantic errors
            self.problems.append(f"{where} key {key!r}: unreadable spec record: {str(exc).splitlines()[0]}")
            return
        if spec is None:
            self.specs.pop(key, None)
            self.applied_at_ms.pop(key, None)
            self.deleted.add(key)
        else:
            self.specs[key] = spec
            self.applied_at_ms[key] = record["applied_at_ms"]
            self.deleted.discard(key)


def read_spec_snapshot(settings: Settings, timeout: float = 30.0, clients: KafkaClients | None = None) -> SpecSnapshot:
    """Replay the specs topic from the beginning to the end it has now (``sie.kernel.replay``)."""
    from sie.kernel.admin import admin_client, wait_for_cluster
    from sie.kernel.authz import topic_denied
    from sie.kernel.clients import REPLAY_FETCH_WAIT_MS, KafkaClients, admin_config, state_reader_config
    from sie.kernel.replay import read_to_end

    topic = specs_topic(settings)
    snapshot = SpecSnapshot()
    metadata = wait_for_cluster(settings, timeout, clients)  # KafkaUnavailable / NotAuthenticated with the fix
    if topic not in metadata.topics:  # missing, or invisible to this principal (ACLs): tell which
        if settings.security_protocol not in (None, "PLAINTEXT"):
            denied = topic_denied(admin_client(settings, clients), topic, admin_config(settings), "READ",
                                  timeout)
            if denied is not None:
                raise denied
        return snapshot
    names = settings.names
    consumer = (clients or KafkaClients()).consumer(state_reader_config(
        settings, names.reader_group("specs", uuid.uuid4().hex[:8]),  # never committed or joined
        names.reader_client_id("specs"), fetch_wait_ms=REPLAY_FETCH_WAIT_MS))  # an empty fetch at the end returns fast
    try:
        read_to_end(consumer, topic, lambda msg: snapshot.apply(
            (msg.key() or b"").decode("utf-8", "replace"), msg.value(), f"{topic}[{msg.partition()}]@{msg.offset()}"),
            timeout_s=timeout, partitions=sorted(metadata.topics[topic].partitions))
    finally:
        consumer.close()
    for problem in snapshot.problems:
        log.warning(problem)
    return snapshot


def read_specs(settings: Settings, timeout: float = 30.0) -> dict[str, ModelService]:
    """The live specs, by model name (unreadable records are logged, never silently applied)."""
    return read_spec_snapshot(settings, timeout).specs
