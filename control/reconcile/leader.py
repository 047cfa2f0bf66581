"""Leadership: group membership decides WHO leads; a fenced transactional producer guarantees that
ONLY that one can still write (docs/control-plane.md, docs/architecture.md).

WHY both:
- Group membership (group ``<prefix>.control`` on the 1-partition ``control-leader`` topic; the
  member assigned partition 0 leads) gives fast, automatic election with no extra service: the broker's
  group coordinator notices a dead member after ``session.timeout.ms`` (6 s) and hands partition 0 to
  a standby.
- But membership alone cannot stop a *zombie*: a leader that was paused (GC, SIGSTOP, network
  partition) past its session still believes it leads until its next poll, and could publish stale
  assignments.  So the leader writes only through a transactional producer with the SHARED
  ``transactional.id`` ``<prefix>.control``: the new leader's ``init_transactions()`` bumps the
  producer epoch, the broker rejects the zombie's next transaction (``PRODUCER_FENCED``), and the
  zombie steps down.  Readers use ``read_committed`` so an aborted zombie write is never seen.

The leader epoch (published as a ``LeaderEpoch`` record, stamped on every Assignment) is
``max(highest epoch on control-leader + 1, wall-clock seconds)``, the topic read AFTER
``init_transactions()`` so a zombie's open transaction is already resolved when we read.

WHY the wall-clock floor: agents ignore an Assignment whose epoch is lower than one they have applied
(a deposed leader's late record must not win).  If the ``control-leader`` topic is ever recreated (or
lost, or a cluster is rebuilt next to an old ``assignments`` topic), "highest + 1" restarts at 1 and every
agent that remembers epoch N ignores every new assignment, silently, forever.  With the floor, a leader
that finds no history still starts above any epoch an earlier incarnation can have reached: those started
at their own wall-clock seconds and grew by one per election, and nobody elects a leader more than once a
second for long.  Picked over an incarnation id in the records (agents compare (incarnation, epoch)) because
it needs no schema change and no agent upgrade: deployed agents keep their plain ``epoch >= newest`` rule.
What it assumes: the new leader's clock is not behind the old one's by more than the time between the two
elections (NTP keeps it far closer); "highest + 1" still guarantees a strict increase while the topic lives.  "Read to the end" means up to the partition's end taken after
``init_transactions``, by a reader of its own that reads from the beginning (``_read_to_end`` says why not
the group member).

Every write goes through the exactly-once layer's ``TransactionalProducer`` (watchdog on each call,
retriable -> retry, abortable -> abort, fatal -> ``Fenced``, on which this instance steps down).  A commit
that times out is called again and completes once the broker answers; if it is given up, librdkafka
refuses to abort it (``_CONFLICT``: it goes on in the background), so the producer is dropped, this
instance steps down and runs for leader again with a fresh producer, whose ``init_transactions`` settles
the old transaction.  Never is a transaction left open to make every later ``begin_transaction`` fail
(measured on a SIGSTOPped broker: tests/control/reconcile/test_leader_kafka).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sie.control.reconcile.ports import OutRecord
from sie.kernel.clients import KafkaClients, group_member_config, leader_producer_config, state_reader_config
from sie.kernel.supervised import SupervisedThread, ThreadStatus
from sie.streams.eos import EosLimits, Fenced, ProducerFatal, TransactionalProducer

log = logging.getLogger(__name__)

#: transaction.timeout.ms of the leader's writes: a zombie's open transaction is aborted by the broker
#: within this long even if no successor ever calls init_transactions()
_TXN_TIMEOUT_MS = 15_000
_READ_TO_END_S = 15.0


class LeaderElector:
    """Joins the control group, becomes leader when assigned partition 0 of ``control-leader``.

    One background thread polls the group consumer (keeps membership alive, runs elections).
    ``is_leader``/``epoch`` are read by the controller; ``producer`` is the fenced transactional
    producer while leading (None otherwise).  Callbacks let the service react (log, metrics).
    The thread is supervised: if it dies it steps down (a leader without its election thread cannot
    keep its group membership), and a fresh run rejoins the group after a backoff.
    """

    def __init__(
        self,
        settings: Any,
        instance_id: str,
        session_timeout_ms: int = 6000,
        on_change: Callable[[bool, int], None] | None = None,
        clock: Callable[[], float] = time.time,
        clients: KafkaClients | None = None,
        limits: EosLimits = EosLimits(),
    ) -> None:
        self._settings = settings
        self.instance_id = instance_id
        self._names = settings.names
        self._topic = self._names.system_topic("control-leader")
        self._session_timeout_ms = session_timeout_ms
        self._on_change = on_change
        self._clock = clock
        self._clients = clients or KafkaClients()
        self._limits = limits
        self._lock = threading.RLock()
        self._leader = False
        self._epoch = 0
        self._producer: TransactionalProducer | None = None
        self._holds_p0 = False
        self._max_epoch_seen = 0
        self._resubscribe = False
        self._stop = threading.Event()
        self._thread = SupervisedThread("sie-control-leader", self._run, self._stop)
        self.last_error: str | None = None
        self.elections = 0
        #: when the first of the current run of failed election attempts failed (None: not failing)
        self.election_failing_since: float | None = None

    # -- Leadership protocol (used by the controller) ----------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def producer(self) -> TransactionalProducer | None:
        return self._producer

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def names(self) -> Any:
        return self._names

    @property
    def alive(self) -> bool:
        """The election thread runs (False before start, after stop, or if it died)."""
        return self._thread.alive

    def thread_status(self) -> ThreadStatus:
        return self._thread.status()

    def status(self) -> dict[str, Any]:
        """The elector as ``/healthz`` shows it: not ok while its thread is not running or while it holds
        partition 0 and its election attempts fail (no one leads then)."""
        thread = self._thread.status()
        out: dict[str, Any] = {**thread.to_json(), "elections": self.elections}
        failing = self.election_failing_since
        if not thread.ok:
            out.update(ok=False, detail=f"election thread {thread.state}: {thread.last_error}")
        elif failing is not None and self._holds_p0 and not self._leader:
            out.update(ok=False, detail=f"holds partition 0 but cannot take the lead "
                                        f"(failing for {time.monotonic() - failing:.0f}s): {self.last_error}")
        else:
            out["detail"] = f"leader (epoch {self._epoch})" if self._leader else "standby"
        return out

    def step_down(self, reason: str) -> None:
        """Stop publishing now; rejoin the group so it can re-decide (a fenced member may still hold p0)."""
        with self._lock:
            was = self._leader
            self._resubscribe = True  # before _leader: the election thread, which reads them unlocked, sees
            self._leader = False      # "not leader" only together with "rejoin first"
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.discard()  # a fenced producer's queued records must never be delivered
        if was:
            log.warning("control plane %s stepped down: %s", self.instance_id, reason)
            self._notify()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> LeaderElector:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave the group (close) so a standby takes over at once instead of after the session timeout."""
        self._stop.set()
        self._thread.join(timeout)

    # -- internals ---------------------------------------------------------------------------------

    def _notify(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self._leader, self._epoch)
            except Exception:
                log.exception("leadership callback failed")

    def _consumer(self) -> Any:
        return self._clients.consumer(group_member_config(
            self._settings, self._names.control_group, self._names.control_client_id(self.instance_id),
            session_timeout_ms=self._session_timeout_ms))

    def _subscribe(self, consumer: Any) -> None:
        # cooperative-sticky: a standby joining does not revoke partition 0 from the leader (no blip)
        def on_assign(c: Any, partitions: list) -> None:
            if any(p.partition == 0 for p in partitions):
                with self._lock:
                    self._holds_p0 = True

        def on_revoke(c: Any, partitions: list) -> None:
            if any(p.partition == 0 for p in partitions):
                with self._lock:
                    self._holds_p0 = False
                self.step_down("partition 0 of the control-leader topic revoked (group rebalance)")

        consumer.subscribe([self._topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)

    def _run(self) -> None:
        """One run of the election thread: a fresh group member; raises only on what the run cannot go on
        with (the supervisor restarts it)."""
        with self._lock:
            self._holds_p0 = False
            self._resubscribe = False
        consumer = self._consumer()
        try:
            self._subscribe(consumer)
            while not self._stop.is_set():
                if self._resubscribe:
                    self._resubscribe = False
                    if not self._leader and self._holds_p0:
                        consumer.unsubscribe()
                        self._holds_p0 = False
                        self._subscribe(consumer)
                self._handle(consumer.poll(0.2))
                # a step-down during the poll (set by the controller's thread) rejoins the group first
                if self._holds_p0 and not self._leader and not self._resubscribe:
                    try:
                        self._elect()
                        self.election_failing_since = None
                    except Exception as exc:  # retried on the next loop while we still hold p0
                        self.last_error = f"election failed: {exc}"
                        if self.election_failing_since is None:
                            self.election_failing_since = time.monotonic()
                        log.warning("election failed (will retry): %s", exc)
                        self._stop.wait(1.0)
                elif not self._holds_p0:
                    self.election_failing_since = None
        finally:
            self.step_down("stopping" if self._stop.is_set() else "the election thread died")
            try:
                consumer.close()  # leave the group: the standby is assigned p0 right away
            except Exception:
                pass

    def _handle(self, msg: Any) -> None:
        """Note the epoch of a LeaderEpoch record; end-of-partition events carry no information here."""
        if msg is None:
            return
        if msg.error() is None:
            self._see(msg)
        elif not msg.error().code() == _partition_eof():
            self.last_error = str(msg.error())

    def _see(self, msg: Any) -> None:
        from sie.schemas.avro_codec import decode

        if msg.value() is None:
            return
        try:
            self._max_epoch_seen = max(self._max_epoch_seen, int(decode(msg.value()).get("epoch") or 0))
        except Exception as exc:
            self.last_error = f"unreadable LeaderEpoch at offset {msg.offset()}: {exc}"

    def _read_to_end(self) -> bool:
        """Read ``control-leader`` from its beginning to the end it has now, with a reader of its own that
        ``assign()``s (``sie.kernel.replay.read_to_end``); False if p0 or the stop was lost first.

        Not through the group member: a member re-assigned p0 after a step-down starts with no position
        (librdkafka has none before it returns a record) and signals end-of-partition once, so a barrier on it
        depends on what its own poll loop happened to take first; one CI run kept an election failing for
        90 s on "at 0 of 2" after a broker freeze.  A fresh reader has none of that state; the topic is one
        compacted partition, a few records."""
        from sie.kernel.replay import read_to_end

        def error(msg: Any) -> None:
            self.last_error = str(msg.error())

        reader = self._clients.consumer(state_reader_config(
            self._settings, self._names.control_state_group, self._names.control_client_id(self.instance_id, "leader")))
        try:
            return read_to_end(reader, self._topic, self._see, timeout_s=_READ_TO_END_S, partitions=[0],
                               keep_going=lambda: self._holds_p0 and not self._stop.is_set(), on_error=error)
        finally:
            reader.close()

    def _elect(self) -> None:
        """init_transactions (fences any zombie) -> read control-leader to its end -> epoch = max + 1."""
        config = leader_producer_config(self._settings, self._names.control_transactional_id,
                                        transaction_timeout_ms=_TXN_TIMEOUT_MS)  # lz4: an Assignment is large
        producer = TransactionalProducer(config, self._clients.producer, self._limits.attempts,
                                         self._limits.backoff_s, self._stop, self._limits.hang_limit_s)
        if not producer.start(patience_s=30.0):  # stopping
            return
        try:
            if not self._read_to_end():
                producer.discard()
                return
            now = self._clock()
            epoch = max(self._max_epoch_seen + 1, int(now))  # the wall-clock floor: module docstring
            now_ms = int(now * 1000)
            records = [
                OutRecord("control-leader", "cluster", "LeaderEpoch",
                          {"instance_id": self.instance_id, "epoch": epoch, "ts_ms": now_ms}),
                OutRecord("events", "cluster", "ControlEvent", {
                    "ts_ms": now_ms, "kind": "leader_elected", "model": None, "replica_id": None, "node": None,
                    "detail": f"control plane {self.instance_id} leads with epoch {epoch}",
                }),
            ]
            publish(producer, self._names, records)
        except BaseException:
            producer.discard()
            raise
        with self._lock:
            self._producer = producer
            self._epoch = epoch
            self._max_epoch_seen = epoch
            self._leader = True
            self.elections += 1
        log.info("control plane %s is leader, epoch %d", self.instance_id, epoch)
        self._notify()


def _partition_eof() -> int:
    from confluent_kafka import KafkaError

    return KafkaError._PARTITION_EOF


def publish(producer: TransactionalProducer, names: Any, records: Sequence[OutRecord]) -> None:
    """Every record in one transaction through the layer's producer; ``Fenced`` if the producer is
    unusable (a newer leader's init_transactions fenced it); ``TxnAbortable`` after an abort."""
    from sie.schemas.avro_codec import encode

    encoded = [(names.system_topic(r.topic), r.key.encode(), None if r.value is None else encode(r.record, dict(r.value)))
               for r in records]  # encode first: a bad record fails before any transaction opens

    def fill(p: TransactionalProducer) -> None:
        for topic, key, value in encoded:
            p.produce(topic, value, key)

    try:
        producer.transact(fill)
    except ProducerFatal as exc:
        raise Fenced(str(exc)) from exc


class TransactionalPublisher:
    """The controller's ``Publisher`` while running against Kafka: one transaction per pass, only
    through the elector's fenced producer; refuses (``Fenced``) when this instance does not lead."""

    def __init__(self, elector: LeaderElector) -> None:
        self._elector = elector

    def publish(self, records: Sequence[OutRecord]) -> None:
        with self._elector.lock:
            producer = self._elector.producer
            if producer is None or not self._elector.is_leader:
                raise Fenced("this instance is not the leader")
            publish(producer, self._elector.names, records)
