"""The control plane's reader of Kafka: every control topic, read_committed, into a ``ClusterState``.

``StateFeeder`` is the only Kafka-facing part of the cluster state (the records and their fold are
``records``): it reads every control topic ``read_committed`` from the beginning (the history topics from
a time window) and hands each decoded record to ``ClusterState``; how a heartbeat's time is judged while
replaying and while live is in ``records``.

The feeder runs under a ``SupervisedThread``: whatever kills its loop (a client error, a bug) restarts
it with backoff, resuming every partition where it stopped, and the state counts as stale (not caught
up) until it has read to the end again.  One record that cannot be read or applied (undecodable key or
value, a field of the wrong type) is counted, logged with its coordinates and skipped: it never stops
the feed.  ``ReadBarrier`` is what a new leader waits for before its first pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from sie.control.reconcile.records import Clock, ClusterState
from sie.kernel.clients import BARRIER_FETCH_WAIT_MS, KafkaClients, state_reader_config
from sie.kernel.names import SYSTEM_TOPICS, check_node_name
from sie.kernel.supervised import SupervisedThread, ThreadStatus

log = logging.getLogger(__name__)

#: topic suffix -> whether it must be read to its end before the first reconcile
STATE_TOPICS = ("specs", "nodes", "assignments", "control-leader", "heartbeats", "replica-status", "events", "model-status",
                "connectors")


#: topic suffix -> the one record type its values may be (anything else on it is skipped)
RECORD_OF_TOPIC = {
    "specs": "ModelSpecRecord", "nodes": "NodeRegistration", "assignments": "Assignment",
    "control-leader": "LeaderEpoch", "heartbeats": "Heartbeat", "replica-status": "ReplicaStatus",
    "events": "ControlEvent", "model-status": "ModelStatus", "connectors": "ConnectorRecord",
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at ``pos``: (its value, the position after it)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def heartbeat_head(value: bytes, current: bytes) -> tuple[str, int, int, bytes] | None:
    """(node, ts_ms, seq, everything else) of a heartbeat written with the ``current`` schema (its fingerprint:
    node, ts_ms and seq lead it), without decoding the rest; None for anything else."""
    if len(value) < 10 or value[2:10] != current or value[:2] != b"\xc3\x01":
        return None
    try:
        size, pos = _varint(value, 10)
        node = value[pos:pos + size].decode("utf-8")
        ts_ms, pos = _varint(value, pos + size)
        seq, pos = _varint(value, pos)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    return node, ts_ms, seq, value[pos:]


def decode_value(value: bytes, expected: str | None = None) -> dict[str, Any]:
    """Avro single-object bytes -> record dict (the codec may return ``(name, record)``); with ``expected``,
    a record of another type is an error."""
    from sie.schemas import avro_codec

    decoded = avro_codec.decode(value, expected)
    if isinstance(decoded, tuple):
        decoded = decoded[-1]
    return dict(decoded)


#: topics whose live records wake the reconcile loop at once (an operator's apply, delete or connector change)
#: instead of at its next interval: apply -> assignment is then one pass, not up to a second more
WAKE_TOPICS = frozenset({"specs", "connectors"})
#: topics read from a time window, not from the beginning (history, not state: not compacted)
HISTORY_TOPICS = frozenset({"heartbeats", "replica-status", "events"})
_LAG_CHECK_S = 1.0  # how often the feeder compares its position on the heartbeats partitions with their end
_KEY_SHOWN = 64  # bytes of a skipped record's key shown in logs and health


class ReadBarrier:
    """"Every record committed on the control topics before this barrier was asked for is applied": what a new
    leader waits for before its first pass (``StateFeeder.sync``).

    WHY: a standby's feeder reads all along, but the old leader's last transactions can still be on their way
    to it when the new leader is elected (a clean stop hands over in about a second); a pass that planned
    from a state without them would undo them.  The targets are each partition's high watermark taken by
    the feeder after the request, and the request is made after the election's ``init_transactions``
    fenced the old leader, so nothing it committed lies beyond them.
    """

    def __init__(self, on_done: Callable[[], None] | None = None) -> None:
        self.done = threading.Event()
        self._on_done = on_done
        #: (topic, partition) -> the end to reach (None: not taken yet)
        self.ends: dict[tuple[str, int], int] | None = None
        #: (topic, partition) -> (reached, end) while short of it
        self.short: dict[tuple[str, int], tuple[int, int]] = {}
        self.error: str | None = None

    def reached(self) -> bool:
        return self.done.is_set()

    def describe(self) -> str:
        """What it still waits for (shown while a new leader waits)."""
        if self.done.is_set():
            return "reached"
        if self.ends is None:
            return "taking the end offsets" + (f" (last try: {self.error})" if self.error else "")
        short = sorted(self.short.items())
        shown = ", ".join(f"{t}[{p}] at {at} of {end}" for (t, p), (at, end) in short[:5])
        return f"{len(short)} partition(s) short: {shown}" + (" ..." if len(short) > 5 else "")

    def _finish(self) -> None:
        self.short = {}
        self.done.set()
        if self._on_done is not None:
            try:
                self._on_done()
            except Exception:
                log.exception("read barrier callback failed")


class StateFeeder:
    """Reads every control topic (read_committed) into a ``ClusterState``, on a supervised thread.

    ``caught_up`` is set once every partition reached the end it had when the current run started: the
    controller does not reconcile before that (a half-read assignments topic would look like "nothing is
    placed" and the leader would move healthy replicas).  Heartbeats and replica-status are not
    compacted: only the last ``history_s`` seconds of them are read (``offsets_for_times``), enough for
    liveness and recent failures.  A run that dies is restarted (backoff) and resumes every partition
    after the last record it read; ``caught_up`` is cleared until that run reached the end again.

    How stale the state is, for the controller and health:

    * ``stale_reason()``: the state may miss records of any topic (not caught up, the loop died and waits
      to restart, or it has not polled for ``stall_limit_s``): nothing should act on it;
    * ``lag_reason()``: caught up once, but now behind the end of a heartbeats partition for more than
      ``lag_limit_s``: nodes look more silent than they are (evidence for the controller's mass-offline
      guard, which then holds removals).

    ``sync()`` asks for a ``ReadBarrier``: done once every partition was read to the end it had when the
    feeder thread took it (a new leader's takeover).  A partition counts as read to an offset when a record
    before it was applied, an end-of-partition event was reported there (the end may be a transaction
    marker, which no record shows), or the current run started past it (history outside the window).
    """

    def __init__(
        self,
        settings: Any,
        state: ClusterState,
        clock: Clock = time.time,
        history_s: float = 600.0,
        topics: Iterable[str] = STATE_TOPICS,
        clients: KafkaClients | None = None,
        lag_limit_s: float = 3.0,
        stall_limit_s: float = 15.0,
        on_skip: Callable[[str], None] | None = None,
        backoff_initial_s: float = 0.5,
        monotonic: Clock = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._settings = settings
        self._clients = clients or KafkaClients()
        self._state = state
        self._clock = clock
        self._monotonic = monotonic
        self._history_s = history_s
        self._lag_limit_s = lag_limit_s
        self._stall_limit_s = stall_limit_s
        self._on_skip = on_skip
        #: called (with the topic suffix) after a live record of a ``WAKE_TOPICS`` topic was applied
        self._on_change = on_change
        self._topics = {settings.names.system_topic(s): s for s in topics if s in SYSTEM_TOPICS}
        from sie.schemas import avro_codec

        #: the current Heartbeat schema's fingerprint, and each node's last live heartbeat after its seq
        self._heartbeat_fp = avro_codec.default_codec().fingerprint("Heartbeat")
        self._heartbeat_rest: dict[str, bytes] = {}
        self.caught_up = threading.Event()
        #: the feeder's clock when the current run caught up (None while not caught up)
        self.caught_up_at: float | None = None
        self._stop = threading.Event()
        self._thread = SupervisedThread("sie-control-state", self._run, self._stop, backoff_initial_s=backoff_initial_s)
        self._next: dict[tuple[str, int], int] = {}  # next offset to read, per partition (kept across runs)
        self._run_start: dict[tuple[str, int], int] = {}  # where the current run started, per partition
        self._behind: dict[tuple[str, int], tuple[float, int]] = {}  # heartbeats partition -> (since, end to reach)
        self._eof: dict[tuple[str, int], int] = {}  # where the latest end-of-partition event was, per partition
        #: heartbeats partition -> node key -> its latest record read while replaying (``_replayed``)
        self._replay_latest: dict[tuple[str, int], dict[bytes | None, Any]] = {}
        self._barriers: list[ReadBarrier] = []
        self._barriers_lock = threading.Lock()
        self._lag_checked = 0.0
        self._polled_at: float | None = None
        self.errors = 0
        self.skipped = 0
        self.last_error: str | None = None
        self.last_skipped: str | None = None

    def start(self) -> StateFeeder:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    # -- staleness ---------------------------------------------------------------------------------

    def stale_reason(self) -> str | None:
        """Why the state may miss records right now (None: caught up and reading)."""
        thread = self._thread.status()
        if thread.state == "restarting":
            return f"state reader died ({thread.last_error}); restart {thread.restarts} pending"
        if thread.state != "running":
            return f"state reader {thread.state}"
        if not self.caught_up.is_set():
            again = f" again after restart {thread.restarts}" if thread.restarts else ""
            return f"state reader is reading the control topics to their end{again} (not caught up)"
        polled = self._polled_at
        if polled is not None and self._monotonic() - polled > self._stall_limit_s:
            return f"state reader stalled: no poll for {self._monotonic() - polled:.0f}s"
        return None

    def sync(self, on_done: Callable[[], None] | None = None) -> ReadBarrier:
        """A read barrier over every control topic (``ReadBarrier``); ``on_done`` is called from the feeder's
        thread once it is reached."""
        barrier = ReadBarrier(on_done)
        with self._barriers_lock:
            self._barriers.append(barrier)
        return barrier

    def lag_s(self) -> float:
        """How long the feeder has been behind an end of a heartbeats partition it saw (0: not behind)."""
        behind = list(self._behind.values())
        return max((self._monotonic() - since for since, _end in behind), default=0.0)

    def lag_reason(self) -> str | None:
        lag = self.lag_s()
        if lag > self._lag_limit_s:
            return f"state reader {lag:.0f}s behind the end of the heartbeats topic"
        return None

    def thread_status(self) -> ThreadStatus:
        return self._thread.status()

    def status(self) -> dict[str, Any]:
        """The feeder as ``/healthz`` shows it."""
        thread = self._thread.status()
        problem = self.stale_reason() or self.lag_reason()
        return {
            "ok": problem is None,
            "detail": problem or "caught up",
            "state": thread.state,
            "restarts": thread.restarts,
            "last_death": thread.last_error,
            "caught_up": self.caught_up.is_set(),
            "lag_s": round(self.lag_s(), 1),
            "skipped_records": self.skipped,
            "last_skipped": self.last_skipped,
            "client_errors": self.errors - self.skipped,
            "last_error": self.last_error,
        }

    # -- the loop ----------------------------------------------------------------------------------

    def _assign_all(self, consumer: Any) -> dict[tuple[str, int], int]:
        """Assign every partition (resuming after the last record a previous run read); return the end
        offsets to reach before ``caught_up``."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from sie.kernel.replay import watermarks

        metadata = consumer.list_topics(timeout=10)
        since_ms = int((self._clock() - self._history_s) * 1000)
        parts: list[TopicPartition] = []
        ends: dict[tuple[str, int], int] = {}
        self._run_start = {}
        present = {}
        for topic in self._topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                log.warning("control topic %s missing (run `sie topics ensure`); skipping it", topic)
                continue
            present[topic] = sorted(meta.partitions)
        # each partition's (low, end) now (read_committed: the last stable offset), refusals retried
        marks = watermarks(consumer, [(t, p) for t, ps in present.items() for p in ps], timeout_s=10)
        for topic, partitions in present.items():
            suffix = self._topics[topic]
            for p in partitions:
                lo, hi = marks[(topic, p)]
                resume = self._next.get((topic, p))
                if resume is not None:
                    start = max(resume, lo)
                elif suffix in HISTORY_TOPICS:
                    found = consumer.offsets_for_times([TopicPartition(topic, p, since_ms)], timeout=10)[0]
                    start = found.offset if found.offset >= 0 else hi
                else:
                    start = OFFSET_BEGINNING
                parts.append(TopicPartition(topic, p, start))
                first = lo if start == OFFSET_BEGINNING else max(start, lo)
                self._run_start[(topic, p)] = first
                if hi > first:
                    ends[(topic, p)] = hi
        consumer.assign(parts)
        return ends

    def _caught_up(self) -> None:
        self.caught_up_at = self._clock()
        self.caught_up.set()

    def _run(self) -> None:
        """One run: a fresh consumer, every partition assigned, read until stopped.  Raises on whatever
        the run cannot go on with (the supervisor restarts it); one bad record never gets here."""
        from confluent_kafka import KafkaError, KafkaException

        from sie.kernel.replay import ReadProgress

        self.caught_up.clear()
        self.caught_up_at = None
        self._behind.clear()
        self._polled_at = None
        names = self._settings.names
        # a read barrier (a new leader's first pass waits on it): an idle partition's position passes the last
        # commit marker only with the next fetch answer, so the long-poll is the barrier's own (sie.kernel.clients)
        consumer = self._clients.consumer(state_reader_config(
            self._settings, names.control_state_group, names.control_state_client_id,
            fetch_wait_ms=BARRIER_FETCH_WAIT_MS))
        try:
            # the replay: each partition read to the end it had at start, by the kernel's one rule (the position
            # passes commit markers and aborted records that no record shows: sie.kernel.replay)
            progress = ReadProgress(self._assign_all(consumer), dict(self._run_start))
            pending = set(progress.short())
            if not pending:
                self._caught_up()
            while not self._stop.is_set():
                self._polled_at = self._monotonic()
                msg = consumer.poll(0.2)
                if self.caught_up.is_set():
                    self._check_lag(consumer)
                if self._barriers:
                    self._serve_barriers()
                if msg is not None:
                    key = (msg.topic(), msg.partition())
                    error = msg.error()
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        self._eof[key] = max(self._eof.get(key, 0), msg.offset())
                    elif error is not None:
                        self.errors += 1
                        self.last_error = f"consumer: {error}"
                        if error.fatal():
                            raise KafkaException(error)
                        continue
                    else:
                        self._next[key] = msg.offset() + 1
                        if key in pending and self._topics.get(key[0]) == "heartbeats":
                            # history: only each node's latest heartbeat counts (its replayed_at, GPUs, replicas);
                            # a cold start replays every heartbeat still in the topic: only the latest is decoded
                            self._replay_latest.setdefault(key, {})[msg.key()] = msg
                        else:
                            self._apply(msg, live=key not in pending)
                    if key in pending:
                        progress.see(msg)
                if pending:
                    progress.check_positions(consumer)
                    for key in sorted(pending - set(progress.short())):
                        pending.discard(key)
                        self._replayed(key)
                    if not pending:
                        self._caught_up()
        except Exception as exc:
            self.last_error = f"state reader died: {type(exc).__name__}: {exc}"
            raise
        finally:
            for key in list(self._replay_latest):  # read, so never read again (resumed after): applied now
                self._replayed(key)
            if not self._stop.is_set():
                self.caught_up.clear()  # whatever ended this run, the state is stale until the next one caught up
                self.caught_up_at = None
            try:
                consumer.close()
            except Exception as exc:
                log.warning("closing the state reader's consumer: %s", exc)

    def _replayed(self, key: tuple[str, int]) -> None:
        """A partition read to the end it had at start: apply what its replay kept back (the latest heartbeat
        of each node), in log order."""
        kept = self._replay_latest.pop(key, None)
        for msg in sorted((kept or {}).values(), key=lambda m: m.offset()):
            self._apply(msg, live=False)

    def _read_to(self, key: tuple[str, int]) -> int:
        """The offset up to which ``key`` has been read and applied in this feeder (``ReadBarrier``)."""
        return max(self._next.get(key, 0), self._eof.get(key, 0), self._run_start.get(key, 0))

    def _ends(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermark of each partition now, asked through a consumer of its own: the reader's consumer
        would wait behind its own fetch long-poll on every call (a broker answers one request per connection at
        a time), seconds on a takeover of every control topic."""
        from sie.kernel.replay import end_offsets

        names = self._settings.names
        probe = self._clients.consumer(state_reader_config(
            self._settings, names.control_state_group, names.control_state_ends_client_id))
        try:
            return end_offsets(probe, keys, timeout_s=5)
        finally:
            probe.close()

    def _serve_barriers(self) -> None:
        """Take the end offsets of each new barrier; finish every barrier whose ends were all reached."""
        with self._barriers_lock:
            barriers = list(self._barriers)
        for barrier in barriers:
            if barrier.ends is None:
                try:
                    barrier.ends = self._ends(list(self._run_start))
                except Exception as exc:  # tried again on the next loop
                    barrier.error = f"{type(exc).__name__}: {exc}"
                    continue
            barrier.short = {key: (self._read_to(key), end) for key, end in barrier.ends.items()
                             if self._read_to(key) < end}
            if not barrier.short:
                with self._barriers_lock:
                    self._barriers.remove(barrier)
                barrier._finish()

    def _check_lag(self, consumer: Any) -> None:
        """Every second: is an end of a heartbeats partition seen earlier still not reached?"""
        from confluent_kafka import TopicPartition

        now = self._monotonic()
        if now - self._lag_checked < _LAG_CHECK_S:
            return
        self._lag_checked = now
        for (topic, p), start in self._run_start.items():
            if self._topics.get(topic) != "heartbeats":
                continue
            try:
                _lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            except Exception as exc:  # no end known yet: nothing to compare with
                log.debug("watermarks of %s[%d]: %s", topic, p, exc)
                continue
            position = self._next.get((topic, p), start)
            target = self._behind.get((topic, p))
            if target is not None and position >= target[1]:
                del self._behind[(topic, p)]
                target = None
            if target is None and hi > position:
                self._behind[(topic, p)] = (now, hi)

    def _replayed_at(self, msg: Any) -> float | None:
        """A replayed heartbeat's proof of life: its broker timestamp, capped at now."""
        _kind, ts_ms = msg.timestamp()
        if ts_ms is None or ts_ms <= 0:
            return None
        return min(ts_ms / 1000.0, self._clock())

    def _apply(self, msg: Any, live: bool) -> None:
        """Decode and apply one record; anything wrong with it is counted and skipped (``_skip``)."""
        suffix = self._topics.get(msg.topic())
        try:
            raw_key = msg.key()
            key = raw_key.decode("utf-8") if raw_key else ""
            value = msg.value()
            record = decode_value(value, RECORD_OF_TOPIC.get(suffix or "")) if value is not None else None
            if suffix == "heartbeats" and live and value is not None and self._unchanged_heartbeat(value):
                return  # the node's last heartbeat again: only its time moved
            if suffix in ("nodes", "assignments"):
                check_node_name(key, f"{suffix} record key")  # a node name from data: refused where decoded
            elif suffix == "heartbeats" and record is not None:
                check_node_name(record.get("node"), "heartbeat node")
            if suffix == "specs":
                self._state.apply_spec(key, record)
            elif suffix == "nodes":
                self._state.apply_node(key, record)
            elif suffix == "assignments":
                self._state.apply_assignment(key, record)
            elif suffix == "control-leader":
                self._state.apply_leader_epoch(record)
            elif suffix == "model-status":
                self._state.apply_model_status(key, record)
            elif suffix == "connectors":
                self._state.apply_connector(key, record)
            elif record is None:
                return
            elif suffix == "heartbeats":
                if live:
                    self._state.apply_heartbeat(record, seen_at=self._clock())
                    self._remember_heartbeat(value)
                else:
                    self._state.apply_heartbeat(record, seen_at=None, replayed_at=self._replayed_at(msg))
            elif suffix == "replica-status":
                self._state.apply_replica_status(record)
            elif suffix == "events":
                self._state.apply_event(record, (msg.partition(), msg.offset()))
        except Exception as exc:  # one bad record must not stop the feed
            self._skip(msg, suffix, exc)
            return
        if live and suffix in WAKE_TOPICS and self._on_change is not None:
            self._on_change(suffix)

    def _unchanged_heartbeat(self, value: bytes) -> bool:
        """A live heartbeat byte-equal to the node's last one but for its time and sequence: the state keeps the
        last one with the new time (``touch_heartbeat``), nothing is decoded.  At 1,000 nodes every 2 s, decoding
        and folding unchanged heartbeats was most of a steady leader's CPU."""
        head = heartbeat_head(value, self._heartbeat_fp)
        if head is None or self._heartbeat_rest.get(head[0]) != head[3]:
            return False
        node, ts_ms, seq, _ = head
        return self._state.touch_heartbeat(node, self._clock(), ts_ms / 1000.0, seq)

    def _remember_heartbeat(self, value: bytes) -> None:
        head = heartbeat_head(value, self._heartbeat_fp)
        if head is not None:
            self._heartbeat_rest[head[0]] = head[3]

    def _skip(self, msg: Any, suffix: str | None, exc: Exception) -> None:
        raw_key = msg.key()
        shown = raw_key[:_KEY_SHOWN].decode("utf-8", "backslashreplace") if raw_key else ""
        text = (str(exc).splitlines() or [""])[0][:200]
        self.errors += 1
        self.skipped += 1
        self.last_error = self.last_skipped = (
            f"{msg.topic()}[{msg.partition()}]@{msg.offset()} key={shown!r}: {type(exc).__name__}: {text}")
        log.warning("skipping a control record that cannot be applied: %s", self.last_skipped)
        if self._on_skip is not None:
            try:
                self._on_skip(suffix or msg.topic())
            except Exception:
                log.exception("counting a skipped record failed")
