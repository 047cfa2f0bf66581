"""Small fakes of librdkafka's client objects, for unit tests of the logic around them (no broker).

Components take ``sie.kernel.clients.KafkaClients``; ``fake_clients`` builds one whose factories hand out
these fakes and remember every config they were asked for.  The fakes behave like the real clients
where the code under test depends on it, and nowhere else:

* ``FakeConsumer`` serves a scripted log per partition.  ``poll``/``consume`` wait up to their timeout for
  data (as librdkafka does: no busy loop in the component's thread) and are woken by ``append``/``revoke``.
  Transaction markers (``add_marker``) take an offset and are skipped by a fetch, as read_committed
  readers skip them.  ``position()`` is the offset after the last record handed to the application: a
  ``seek`` does not move it until a record is consumed again (librdkafka does the same), and
  ``refetch_gap`` empty answers after a seek stand for the fetch round trip.  End-of-partition events come
  once per end reached, only with ``enable.partition.eof``.  Rebalance callbacks (``subscribe``) run inside
  ``poll``/``consume``, like librdkafka's.
* ``FakeProducer`` records every call (``calls``, with a sequence number shared by all fakes, to check the
  order across clients); ``faults[name]`` scripts what a call raises: a list is used up one per call, a
  single exception is raised on every call.  Transactional records become visible (``visible``) only when
  their transaction commits; ``begin_transaction`` with a transaction still open fails as librdkafka does.
  A commit that timed out (a retriable ``_TIMED_OUT`` fault) goes on in the background, as librdkafka's does:
  until ``commit_transaction`` is called again and succeeds, ``abort_transaction`` and ``begin_transaction``
  fail with ``_CONFLICT`` (measured on a SIGSTOPped broker: tests/control/reconcile/test_leader_kafka).
* ``FakeAdmin`` keeps a set of topics (metadata, configs) and the committed offsets of other groups.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata

from sie.kernel.clients import KafkaClients

NOW_MS = 1_700_000_000_000
_SEQ = itertools.count()


def kafka_error(code: int, reason: str = "injected", **flags: bool) -> KafkaException:
    """``KafkaException(KafkaError(code))`` with librdkafka's flags (``fatal``, ``retriable``, ``txn_requires_abort``)."""
    return KafkaException(KafkaError(code, reason, **flags))


class Call(NamedTuple):
    seq: int  # order across every fake of the test
    name: str
    args: tuple


class _Recorder:
    """``calls`` and scripted ``faults`` per method name."""

    def __init__(self, faults: dict[str, Any] | None = None) -> None:
        self.calls: list[Call] = []
        self.faults: dict[str, Any] = dict(faults or {})

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append(Call(next(_SEQ), name, args))
        fault = self.faults.get(name)
        if isinstance(fault, list):
            if fault:
                raise fault.pop(0)
        elif fault is not None:
            raise fault

    def called(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]


# --- messages and metadata -------------------------------------------------------------------------------

class FakeMessage:
    """A consumed record (or an event: ``error()`` not None) as ``confluent_kafka.Message`` shows it."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None = None, value: bytes | None = None,
                 ts: int = NOW_MS, headers: list[tuple[str, bytes]] | None = None,
                 error: KafkaError | None = None) -> None:
        self._t, self._p, self._o, self._k, self._v = topic, partition, offset, key, value
        self._ts, self._h, self._e = ts, headers, error

    def topic(self) -> str: return self._t
    def partition(self) -> int: return self._p
    def offset(self) -> int: return self._o
    def key(self) -> bytes | None: return self._k
    def value(self) -> bytes | None: return self._v
    def timestamp(self) -> tuple[int, int]: return (TIMESTAMP_CREATE_TIME, self._ts)
    def headers(self) -> list[tuple[str, bytes]] | None: return self._h
    def error(self) -> KafkaError | None: return self._e

    def __repr__(self) -> str:
        return f"FakeMessage({self._t}[{self._p}]@{self._o} key={self._k!r} error={self._e})"


def eof_event(topic: str, partition: int, offset: int) -> FakeMessage:
    return FakeMessage(topic, partition, offset, error=KafkaError(KafkaError._PARTITION_EOF))


def cluster_metadata(topics: dict[str, int], brokers: int = 1) -> ClusterMetadata:
    """Metadata of ``{topic: partition count}``: every partition led by broker 0, replicated on each broker."""
    md = ClusterMetadata()
    for b in range(brokers):
        broker = BrokerMetadata()
        broker.id = b
        md.brokers[b] = broker
    for name, count in topics.items():
        topic = TopicMetadata()
        topic.topic = name
        for p in range(count):
            part = PartitionMetadata()
            part.id, part.leader, part.replicas, part.isrs = p, 0, list(range(brokers)), list(range(brokers))
            topic.partitions[p] = part
        md.topics[name] = topic
    return md


# --- consumer ---------------------------------------------------------------------------------------------

@dataclass
class _Partition:
    records: dict[int, FakeMessage | None] = field(default_factory=dict)  # offset -> record (None: a marker)
    low: int = 0
    high: int | None = None  # the watermark reported; None: after the last entry

    def end(self) -> int:
        last = max(self.records, default=self.low - 1) + 1
        return last if self.high is None else max(self.high, last)


class FakeConsumer(_Recorder):
    """A consumer over a scripted log (module docstring)."""

    def __init__(self, records: Iterable[FakeMessage] = (), *, partitions: dict[str, int] | None = None,
                 committed: dict[tuple[str, int], int] | None = None, refetch_gap: int = 0,
                 group_metadata: Any = "group-metadata", faults: dict[str, Any] | None = None,
                 on_idle: Callable[[FakeConsumer], None] | None = None) -> None:
        super().__init__(faults)
        self._cond = threading.Condition(threading.RLock())
        self._log: dict[tuple[str, int], _Partition] = {}
        for topic, count in (partitions or {}).items():
            for p in range(count):
                self._log.setdefault((topic, p), _Partition())
        for msg in records:
            self._log.setdefault((msg.topic(), msg.partition()), _Partition()).records[msg.offset()] = msg
        self.committed_offsets: dict[tuple[str, int], int] = dict(committed or {})
        self.config: dict[str, Any] = {}
        self.group_metadata = group_metadata
        self.refetch_gap = refetch_gap
        self.on_idle = on_idle
        self._fetch: dict[tuple[str, int], int] = {}  # next offset to fetch, per assigned partition
        self._app: dict[tuple[str, int], int] = {}  # position(): after the last record handed out
        self._eof_at: dict[tuple[str, int], int] = {}
        self._paused: set[tuple[str, int]] = set()
        self._gap = 0
        self._events: list[Any] = []  # pending rebalance callbacks / injected errors, served by poll/consume
        self._callbacks: dict[str, Callable[..., Any] | None] = {}
        self._subscribed: list[str] = []
        #: the group member id while subscribed (librdkafka clears it when it sends LeaveGroup: after an
        #: ``unsubscribe`` once the revoke was served by a poll); ``left`` counts those leaves
        self.member_id: str | None = None
        self.left = 0
        self.serving = False
        self.eof_events = 0
        self.closed = False

    # -- test controls -------------------------------------------------------------------------------------
    def configure(self, config: dict[str, Any]) -> FakeConsumer:
        self.config = dict(config)
        return self

    def append(self, msg: FakeMessage) -> None:
        """A record arrives (written after the consumer started)."""
        with self._cond:
            self._log.setdefault((msg.topic(), msg.partition()), _Partition()).records[msg.offset()] = msg
            self._cond.notify_all()

    def add_marker(self, topic: str, partition: int, offset: int) -> None:
        """A transaction marker (or an aborted record): takes an offset, never reaches the application."""
        with self._cond:
            self._log.setdefault((topic, partition), _Partition()).records[offset] = None
            self._cond.notify_all()

    def set_watermarks(self, topic: str, partition: int, low: int | None = None, high: int | None = None) -> None:
        """``high`` beyond the entries: records the broker has but this consumer has not fetched yet."""
        with self._cond:
            part = self._log.setdefault((topic, partition), _Partition())
            if low is not None:
                part.low = low
            if high is not None:
                part.high = high

    def revoke(self, partitions: list[TopicPartition], lost: bool = False) -> None:
        """A rebalance takes ``partitions`` away; ``on_revoke`` (``on_lost``) runs in the next poll."""
        with self._cond:
            self._events.append(("lost" if lost else "revoke", list(partitions)))
            self._cond.notify_all()

    def reassign(self, partitions: list[TopicPartition]) -> None:
        """A rebalance hands ``partitions`` (back) to this consumer; ``on_assign`` runs in the next poll."""
        with self._cond:
            self._events.append(("assign", list(partitions)))
            self._cond.notify_all()

    def inject_error(self, error: KafkaError, topic: str = "", partition: int = -1) -> None:
        """The next poll/consume hands out an error event."""
        with self._cond:
            self._events.append(("error", FakeMessage(topic, partition, -1, error=error)))
            self._cond.notify_all()

    # -- Consumer API --------------------------------------------------------------------------------------
    def subscribe(self, topics: list[str], on_assign: Callable[..., Any] | None = None,
                  on_revoke: Callable[..., Any] | None = None, on_lost: Callable[..., Any] | None = None) -> None:
        self._call("subscribe", list(topics))
        with self._cond:
            self._subscribed = list(topics)
            self.member_id = "fake-member"
            self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
            tps = [TopicPartition(t, p) for (t, p) in sorted(self._log) if t in topics]
            self._events.append(("assign", tps))
            self._cond.notify_all()

    def unsubscribe(self) -> None:
        """As librdkafka's: pending rebalances are dropped; the revoke of what is assigned runs in the next
        poll (the eager protocol), after which the member leaves the group (``member_id`` None).  Subscribed
        again before that poll: the old assignment is dropped without a callback (what the leader's rejoin
        was written against)."""
        self._call("unsubscribe")
        with self._cond:
            self._subscribed = []
            self._events = [e for e in self._events if e[0] == "error"]
            self._events.append(("leave", [TopicPartition(t, p) for (t, p) in sorted(self._fetch)]))
            self._cond.notify_all()

    def memberid(self) -> str | None:
        return self.member_id
    def assign(self, partitions: list[TopicPartition]) -> None:
        self._call("assign", [(tp.topic, tp.partition, tp.offset) for tp in partitions])
        with self._cond:
            self._drop(list(self._fetch))
            for tp in partitions:
                self._add(tp)

    def assignment(self) -> list[TopicPartition]:
        with self._cond:
            return [TopicPartition(t, p) for (t, p) in sorted(self._fetch)]

    def poll(self, timeout: float | None = None) -> FakeMessage | None:
        self._call("poll")
        got = self._take(1, timeout)
        return got[0] if got else None

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[FakeMessage]:
        self._call("consume", num_messages)
        return self._take(num_messages, timeout)

    def seek(self, partition: TopicPartition) -> None:
        self._call("seek", partition.topic, partition.partition, partition.offset)
        with self._cond:
            key = (partition.topic, partition.partition)
            if key not in self._fetch:
                raise kafka_error(KafkaError._STATE, f"{key} is not assigned")
            self._fetch[key] = self._resolve(key, partition.offset)
            self._eof_at.pop(key, None)
            self._gap = self.refetch_gap

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self._call("position")
        with self._cond:
            return [TopicPartition(tp.topic, tp.partition, self._app.get((tp.topic, tp.partition), OFFSET_INVALID))
                    for tp in partitions]

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        self._call("committed", [(tp.topic, tp.partition) for tp in partitions])
        with self._cond:
            return [TopicPartition(tp.topic, tp.partition,
                                   self.committed_offsets.get((tp.topic, tp.partition), OFFSET_INVALID))
                    for tp in partitions]

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        self._call("get_watermark_offsets", partition.topic, partition.partition)
        with self._cond:
            part = self._log.get((partition.topic, partition.partition))
            if part is None:
                raise kafka_error(KafkaError.UNKNOWN_TOPIC_OR_PART, f"{partition.topic}[{partition.partition}]")
            return part.low, part.end()

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """First offset whose record timestamp is >= the one asked, -1 if none."""
        self._call("offsets_for_times", [(tp.topic, tp.partition, tp.offset) for tp in partitions])
        out = []
        with self._cond:
            for tp in partitions:
                records = self._log.get((tp.topic, tp.partition), _Partition()).records
                found = [o for o, m in sorted(records.items()) if m is not None and m.timestamp()[1] >= tp.offset]
                out.append(TopicPartition(tp.topic, tp.partition, found[0] if found else -1))
        return out

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> ClusterMetadata:
        self._call("list_topics", topic)
        with self._cond:
            counts: dict[str, int] = {}
            for t, p in self._log:
                counts[t] = max(counts.get(t, 0), p + 1)
        if topic is not None:
            counts = {t: n for t, n in counts.items() if t == topic}
        return cluster_metadata(counts)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._call("pause", [(tp.topic, tp.partition) for tp in partitions])
        with self._cond:
            self._paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._call("resume", [(tp.topic, tp.partition) for tp in partitions])
        with self._cond:
            self._paused.difference_update((tp.topic, tp.partition) for tp in partitions)
            self._cond.notify_all()

    def consumer_group_metadata(self) -> Any:
        return self.group_metadata

    def close(self) -> None:
        self._call("close")
        self.closed = True

    # -- internals -----------------------------------------------------------------------------------------
    def _resolve(self, key: tuple[str, int], offset: int) -> int:
        part = self._log.setdefault(key, _Partition())
        if offset == OFFSET_END:
            return part.end()
        if offset == OFFSET_STORED or offset == OFFSET_INVALID:
            offset = self.committed_offsets.get(key, OFFSET_BEGINNING)
            if offset == OFFSET_END:
                return part.end()
        return part.low if offset == OFFSET_BEGINNING or offset < 0 else offset

    def _add(self, tp: TopicPartition) -> None:
        key = (tp.topic, tp.partition)
        self._fetch[key] = self._resolve(key, tp.offset)
        self._eof_at.pop(key, None)

    def _drop(self, keys: list[tuple[str, int]]) -> None:
        for key in keys:
            self._fetch.pop(key, None)
            self._app.pop(key, None)
            self._eof_at.pop(key, None)
            self._paused.discard(key)

    def _serve_events(self, out: list[FakeMessage]) -> None:
        """Rebalance callbacks run here, in the polling thread, as librdkafka runs them (``serving`` is True
        meanwhile: what a callback calls runs inside librdkafka's serving, as it does for real)."""
        self.serving = True
        try:
            self._serve_pending(out)
        finally:
            self.serving = False

    def _serve_pending(self, out: list[FakeMessage]) -> None:
        while self._events:
            kind, payload = self._events.pop(0)
            if kind == "error":
                out.append(payload)
                continue
            if kind == "leave":  # unsubscribe: revoke everything (eager), then the LeaveGroup
                self.left += 1
                if self._subscribed:  # subscribed again at once (the leader's rejoin): dropped, no callback
                    self._drop([(tp.topic, tp.partition) for tp in payload])
                    continue
                callback = self._callbacks.get("revoke")
                if callback is not None:
                    callback(self, payload)
                self._drop(list(self._fetch))
                self._callbacks, self.member_id = {}, None
                continue
            callback = self._callbacks.get(kind)
            if kind == "assign":
                before_assign = len(self.called("assign"))
                if callback is not None:
                    callback(self, payload)
                if not self.called("assign")[before_assign:]:
                    for tp in payload:  # the callback did not assign: the client does it (group offsets)
                        self._add(TopicPartition(tp.topic, tp.partition, OFFSET_STORED))
            else:
                gone = [tp for tp in payload if (tp.topic, tp.partition) in self._fetch]
                if callback is not None:
                    callback(self, gone)
                self._drop([(tp.topic, tp.partition) for tp in gone])

    def _fetchable(self, n: int) -> list[FakeMessage]:
        out: list[FakeMessage] = []
        for key in sorted(self._fetch):
            if key in self._paused:
                continue
            part = self._log.get(key, _Partition())
            while len(out) < n:
                pos = self._fetch[key]
                if pos in part.records:
                    msg = part.records[pos]
                    self._fetch[key] = self._app[key] = pos + 1
                    if msg is not None:
                        out.append(msg)
                    continue
                later = [o for o in part.records if o > pos]
                if later:  # a gap (compacted away): skip to the next entry
                    self._fetch[key] = min(later)
                    continue
                end = part.end()
                if pos >= end and self.config.get("enable.partition.eof") and self._eof_at.get(key) != pos:
                    self._eof_at[key] = pos
                    self.eof_events += 1
                    out.append(eof_event(key[0], key[1], pos))
                break
        return out

    def _take(self, n: int, timeout: float | None) -> list[FakeMessage]:
        with self._cond:
            waited = False
            while True:
                out: list[FakeMessage] = []
                self._serve_events(out)
                if self._gap > 0:  # the fetch after a seek is still on its way: this answer brings no record
                    self._gap -= 1
                    return out
                out += self._fetchable(n - len(out))
                if out or waited:
                    return out
                if self.on_idle is not None:
                    self.on_idle(self)
                waited = True
                self._cond.wait(timeout if timeout is not None and timeout >= 0 else None)


# --- producer ---------------------------------------------------------------------------------------------

class Produced(NamedTuple):
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]] | None


class FakeProducer(_Recorder):
    """A producer (module docstring).  With ``consumer``, offsets sent to a transaction become that
    consumer's committed offsets when the transaction commits (what the group coordinator does)."""

    def __init__(self, faults: dict[str, Any] | None = None, consumer: FakeConsumer | None = None,
                 undelivered: int = 0) -> None:
        super().__init__(faults)
        self.consumer = consumer
        self.config: dict[str, Any] = {}
        self.transactional = False
        self.in_transaction = False
        self.pending: list[Produced] = []  # in the open transaction
        self.visible: list[Produced] = []  # committed (or, without transactions, delivered)
        self.transactions: list[list[Produced]] = []  # each committed transaction's records
        self.undelivered = undelivered  # what flush() reports as not delivered
        self.commit_in_progress = False  # a commit timed out and goes on in the background
        self._offsets: list[TopicPartition] = []
        self._deliveries: list[tuple[Callable[..., Any], Any]] = []
        self.purged = False

    def configure(self, config: dict[str, Any]) -> FakeProducer:
        self.config = dict(config)
        return self

    @property
    def commits(self) -> int:
        return len(self.transactions)

    @property
    def aborts(self) -> int:
        return len(self.called("abort_transaction"))

    def init_transactions(self, timeout: float | None = None) -> None:
        self._call("init_transactions")
        self.transactional = True

    def _refuse_while_committing(self) -> None:
        if self.commit_in_progress:
            raise kafka_error(KafkaError._CONFLICT, "Conflicting commit_transaction API call is already in progress")

    def begin_transaction(self) -> None:
        self._call("begin_transaction")
        self._refuse_while_committing()
        if self.in_transaction:
            raise kafka_error(KafkaError._STATE, "Operation not valid in state InTransaction")
        self.in_transaction, self.pending, self._offsets = True, [], []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Callable[..., Any] | None = None, headers: list[tuple[str, bytes]] | None = None,
                **_kw: Any) -> None:
        self._call("produce", topic, key)
        record = Produced(topic, value, key, headers)
        if self.transactional:
            if not self.in_transaction:
                raise kafka_error(KafkaError._STATE, "produce outside a transaction")
            self.pending.append(record)
        else:
            self.visible.append(record)
        if on_delivery is not None:
            self._deliveries.append((on_delivery, record))

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], metadata: Any,
                                    timeout: float | None = None) -> None:
        self._call("send_offsets_to_transaction", [(tp.topic, tp.partition, tp.offset) for tp in offsets])
        if self.consumer is not None:
            assert metadata is self.consumer.group_metadata, "offsets must carry the consumer's group metadata"
        self._offsets = list(offsets)

    def commit_transaction(self, timeout: float | None = None) -> None:
        try:
            self._call("commit_transaction")
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._TIMED_OUT and exc.args[0].retriable():
                self.commit_in_progress = True
            raise
        self.commit_in_progress = False
        self.visible += self.pending
        self.transactions.append(self.pending)
        if self.consumer is not None:
            self.consumer.committed_offsets.update({(tp.topic, tp.partition): tp.offset for tp in self._offsets})
        self.in_transaction, self.pending, self._offsets = False, [], []

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._call("abort_transaction")
        self._refuse_while_committing()
        self.in_transaction, self.pending, self._offsets = False, [], []

    def poll(self, timeout: float = 0) -> int:
        served, self._deliveries = self._deliveries, []
        for callback, record in served:
            callback(None, record)
        return len(served)

    def flush(self, timeout: float | None = None) -> int:
        self._call("flush")
        self.poll(0)
        return self.undelivered

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self._call("purge")
        self.purged = True
        self.pending = []


# --- admin ------------------------------------------------------------------------------------------------

class _ConfigEntry(NamedTuple):
    value: str


def _done(value: Any = None, error: BaseException | None = None) -> Future:
    future: Future = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


class FakeAdmin(_Recorder):
    """Topics ``{name: partitions}`` with their configs, other groups' committed offsets, and groups as the
    broker describes them (``groups``: ``{group: (ConsumerGroupState, [member ids][, {member id: [(topic,
    partition)]}])}``, ``"*"`` for any other; without the assignments the first member owns every partition)."""

    def __init__(self, topics: dict[str, int] | None = None, brokers: int = 1,
                 group_offsets: dict[str, dict[tuple[str, int], int]] | None = None,
                 faults: dict[str, Any] | None = None,
                 groups: dict[str, tuple[Any, ...]] | None = None) -> None:
        super().__init__(faults)
        self.groups = dict(groups or {})
        self.topics: dict[str, int] = dict(topics or {})
        self.topic_config: dict[str, dict[str, str]] = {t: {"cleanup.policy": "delete"} for t in self.topics}
        self.brokers = brokers
        self.group_offsets = group_offsets or {}
        self.config: dict[str, Any] = {}

    def configure(self, config: dict[str, Any]) -> FakeAdmin:
        self.config = dict(config)
        return self

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> ClusterMetadata:
        self._call("list_topics", topic)
        return cluster_metadata(self.topics, self.brokers)

    def create_topics(self, new_topics: list[Any], **_kw: Any) -> dict[str, Future]:
        self._call("create_topics", [t.topic for t in new_topics])
        out = {}
        for t in new_topics:
            if t.topic in self.topics:
                out[t.topic] = _done(error=kafka_error(KafkaError.TOPIC_ALREADY_EXISTS))
                continue
            self.topics[t.topic] = t.num_partitions
            self.topic_config[t.topic] = dict(t.config)
            out[t.topic] = _done()
        return out

    def describe_configs(self, resources: list[Any], **_kw: Any) -> dict[Any, Future]:
        self._call("describe_configs", [r.name for r in resources])
        return {r: _done({k: _ConfigEntry(v) for k, v in self.topic_config.get(r.name, {}).items()})
                for r in resources}

    def incremental_alter_configs(self, resources: list[Any], **_kw: Any) -> dict[Any, Future]:
        self._call("incremental_alter_configs", [r.name for r in resources])
        for r in resources:
            for entry in r.incremental_configs:
                self.topic_config.setdefault(r.name, {})[entry.name] = entry.value
        return {r: _done() for r in resources}

    def describe_consumer_groups(self, group_ids: list[str], **_kw: Any) -> dict[str, Future]:
        self._call("describe_consumer_groups", list(group_ids))
        from types import SimpleNamespace

        from confluent_kafka import ConsumerGroupState, TopicPartition

        out = {}
        for group in group_ids:
            described = self.groups.get(group, self.groups.get("*", (ConsumerGroupState.DEAD, [])))
            state, members = described[0], described[1]
            # the members' assignments: as given, else the first member owns every partition (a settled group)
            every = [(t, p) for t, n in self.topics.items() for p in range(n)]
            owned = described[2] if len(described) > 2 else {m: every if i == 0 else [] for i, m in enumerate(members)}
            out[group] = _done(SimpleNamespace(group_id=group, state=state, members=[
                SimpleNamespace(member_id=m, assignment=SimpleNamespace(
                    topic_partitions=[TopicPartition(t, p) for t, p in owned.get(m, [])]))
                for m in members]))
        return out

    def list_consumer_group_offsets(self, requests: list[Any], **_kw: Any) -> dict[str, Future]:
        self._call("list_consumer_group_offsets", [r.group_id for r in requests])
        from confluent_kafka import ConsumerGroupTopicPartitions

        out = {}
        for r in requests:
            offsets = self.group_offsets.get(r.group_id, {})
            tps = [TopicPartition(tp.topic, tp.partition, offsets.get((tp.topic, tp.partition), OFFSET_INVALID))
                   for tp in r.topic_partitions]
            out[r.group_id] = _done(ConsumerGroupTopicPartitions(r.group_id, tps))
        return out


# --- the factories ----------------------------------------------------------------------------------------

Maker = Callable[[dict[str, Any]], Any]


@dataclass
class FakeClients:
    """What a component asked ``KafkaClients`` for: ``configs`` as ``(kind, config)`` in order."""

    clients: KafkaClients
    configs: list[tuple[str, dict[str, Any]]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [c for k, c in self.configs if k == kind]


def fake_clients(consumer: Any = None, producer: Any = None, admin: Any = None) -> FakeClients:
    """``KafkaClients`` handing out fakes: each argument is a fake (handed out on every call) or a
    ``config -> fake`` function; a fake's ``configure(config)`` gets the config it was made with.
    A kind not given raises (the component made a client the test did not expect)."""
    configs: list[tuple[str, dict[str, Any]]] = []

    def factory(kind: str, source: Any) -> Maker:
        def make(config: dict[str, Any]) -> Any:
            configs.append((kind, dict(config)))
            if source is None:
                raise AssertionError(f"unexpected {kind} client: {config}")
            fake = source(config) if callable(source) else source
            return fake.configure(config) if hasattr(fake, "configure") else fake
        return make

    return FakeClients(KafkaClients(consumer=factory("consumer", consumer), producer=factory("producer", producer),
                                    admin=factory("admin", admin)), configs)


if TYPE_CHECKING:  # mypy (pyproject [tool.mypy] modules) checks the fake against the interface the stages are typed with
    from sie.kernel.consumer import KafkaConsumer

    _fake_is_a_consumer: KafkaConsumer = FakeConsumer()
