"""Leadership: group membership decides WHO leads; a fenced transactional producer guarantees that
ONLY that one can still write (CONTROL_PROTOCOL.md).

WHY both:
- Group membership (group ``sie.control.<prefix>`` on the 1-partition ``control-leader`` topic; the
  member assigned partition 0 leads) gives fast, automatic election with no extra service: the broker's
  group coordinator notices a dead member after ``session.timeout.ms`` (6 s) and hands partition 0 to
  a standby.
- But membership alone cannot stop a *zombie*: a leader that was paused (GC, SIGSTOP, network
  partition) past its session still believes it leads until its next poll, and could publish stale
  assignments.  So the leader writes only through a transactional producer with the SHARED
  ``transactional.id`` ``sie.control.<prefix>``: the new leader's ``init_transactions()`` bumps the
  producer epoch, the broker rejects the zombie's next transaction (``PRODUCER_FENCED``), and the
  zombie steps down.  Readers use ``read_committed`` so an aborted zombie write is never seen.

The leader epoch (published as a ``LeaderEpoch`` record, stamped on every Assignment) is the highest
epoch on ``control-leader`` + 1, read AFTER ``init_transactions()`` so a zombie's open transaction is
already resolved when we read.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

from sie.streams.control.controller import Fenced, OutRecord

log = logging.getLogger(__name__)

#: error codes that mean "another producer with our transactional.id took over"
_FENCED_CODES = ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING")


def leader_group(prefix: str) -> str:
    """Consumer group of every control-plane instance of one cluster (topic prefix)."""
    return f"sie.control.{prefix}"


def transactional_id(prefix: str) -> str:
    """Shared by every instance: a new leader's init_transactions() fences the previous one."""
    return f"sie.control.{prefix}"


def _is_fenced(err: Any) -> bool:
    from confluent_kafka import KafkaError

    codes = {getattr(KafkaError, name, None) for name in _FENCED_CODES} - {None}
    return err.code() in codes or err.fatal()


class LeaderElector:
    """Joins the control group, becomes leader when assigned partition 0 of ``control-leader``.

    One background thread polls the group consumer (keeps membership alive, runs elections).
    ``is_leader``/``epoch`` are read by the controller; ``producer`` is the fenced transactional
    producer while leading (None otherwise).  Callbacks let the service react (log, metrics).
    """

    def __init__(
        self,
        settings: Any,
        instance_id: str,
        session_timeout_ms: int = 6000,
        on_change: Callable[[bool, int], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from sie.kernel.topics import system_topic

        self._settings = settings
        self.instance_id = instance_id
        self._topic = system_topic("control-leader", settings.topic_prefix)
        self._session_timeout_ms = session_timeout_ms
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.RLock()
        self._leader = False
        self._epoch = 0
        self._producer: Any = None
        self._holds_p0 = False
        self._max_epoch_seen = 0
        self._eof = False
        self._resubscribe = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.elections = 0

    # -- Leadership protocol (used by the controller) ----------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def producer(self) -> Any:
        return self._producer

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def step_down(self, reason: str) -> None:
        """Stop publishing now; rejoin the group so it can re-decide (a fenced member may still hold p0)."""
        with self._lock:
            was = self._leader
            self._leader = False
            producer, self._producer = self._producer, None
            self._resubscribe = True
        if producer is not None:
            try:
                producer.flush(1)
            except Exception:
                pass
        if was:
            log.warning("control plane %s stepped down: %s", self.instance_id, reason)
            self._notify()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "LeaderElector":
        self._thread = threading.Thread(target=self._run, name="sie-control-leader", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave the group (close) so a standby takes over at once instead of after the session timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- internals ---------------------------------------------------------------------------------

    def _notify(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self._leader, self._epoch)
            except Exception:
                log.exception("leadership callback failed")

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(
            self._settings.kafka_client_config(
                **{
                    "group.id": leader_group(self._settings.topic_prefix),
                    "client.id": f"sie-control-{self.instance_id}",
                    "session.timeout.ms": self._session_timeout_ms,
                    "heartbeat.interval.ms": max(500, self._session_timeout_ms // 6),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "partition.assignment.strategy": "cooperative-sticky",
                }
            )
        )

    def _subscribe(self, consumer: Any) -> None:
        # cooperative-sticky: a standby joining does not revoke partition 0 from the leader (no blip)
        def on_assign(c: Any, partitions: list) -> None:
            if any(p.partition == 0 for p in partitions):
                with self._lock:
                    self._holds_p0 = True
                    self._eof = False

        def on_revoke(c: Any, partitions: list) -> None:
            if any(p.partition == 0 for p in partitions):
                with self._lock:
                    self._holds_p0 = False
                self.step_down("partition 0 of the control-leader topic revoked (group rebalance)")

        consumer.subscribe([self._topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)

    def _run(self) -> None:
        from confluent_kafka import KafkaError

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
                msg = consumer.poll(0.2)
                if msg is not None:
                    if msg.error() is None:
                        self._see(msg)
                    elif msg.error().code() == KafkaError._PARTITION_EOF:
                        self._eof = True
                    else:
                        self.last_error = str(msg.error())
                if self._holds_p0 and not self._leader:
                    try:
                        self._elect(consumer)
                    except Exception as exc:  # retried on the next loop while we still hold p0
                        self.last_error = f"election failed: {exc}"
                        log.warning("election failed (will retry): %s", exc)
                        self._stop.wait(1.0)
        finally:
            self.step_down("stopping")
            try:
                consumer.close()  # leave the group: the standby is assigned p0 right away
            except Exception:
                pass

    def _see(self, msg: Any) -> None:
        from sie.schemas.avro_codec import decode

        if msg.value() is None:
            return
        try:
            self._max_epoch_seen = max(self._max_epoch_seen, int(decode(msg.value()).get("epoch") or 0))
        except Exception as exc:
            self.last_error = f"unreadable LeaderEpoch at offset {msg.offset()}: {exc}"

    def _elect(self, consumer: Any) -> None:
        """init_transactions (fences any zombie) -> read control-leader to its end -> epoch = max + 1."""
        from confluent_kafka import KafkaError, Producer

        producer = Producer(
            self._settings.kafka_client_config(
                **{
                    "transactional.id": transactional_id(self._settings.topic_prefix),
                    "transaction.timeout.ms": 15000,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
        )
        producer.init_transactions(30)
        self._eof = False
        deadline = time.monotonic() + 15
        while not self._eof and time.monotonic() < deadline and self._holds_p0 and not self._stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is None:
                self._see(msg)
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                self._eof = True
        if not self._holds_p0 or self._stop.is_set():
            return
        if not self._eof:
            raise TimeoutError(f"could not read {self._topic} to its end within 15 s")
        epoch = self._max_epoch_seen + 1
        now_ms = int(self._clock() * 1000)
        records = [
            OutRecord("control-leader", "cluster", "LeaderEpoch", {"instance_id": self.instance_id, "epoch": epoch, "ts_ms": now_ms}),
            OutRecord("events", "cluster", "ControlEvent", {
                "ts_ms": now_ms, "kind": "leader_elected", "model": None, "replica_id": None, "node": None,
                "detail": f"control plane {self.instance_id} leads with epoch {epoch}",
            }),
        ]
        with self._lock:
            self._producer = producer
            self._epoch = epoch
        try:
            _transact(producer, self._settings.topic_prefix, records)
        except Exception:
            with self._lock:
                self._producer = None
            raise
        with self._lock:
            self._max_epoch_seen = epoch
            self._leader = True
            self.elections += 1
        log.info("control plane %s is leader, epoch %d", self.instance_id, epoch)
        self._notify()


def _transact(producer: Any, prefix: str, records: Sequence[OutRecord], timeout: float = 30.0) -> None:
    """One transaction with every record; translate errors: fenced -> ``Fenced``; abortable -> abort + raise."""
    from confluent_kafka import KafkaException

    from sie.schemas.avro_codec import encode

    try:
        producer.begin_transaction()
        for r in records:
            value = None if r.value is None else encode(r.record, dict(r.value))
            producer.produce(f"{prefix}.{r.topic}", key=r.key.encode(), value=value)
        producer.commit_transaction(timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if _is_fenced(err):
            raise Fenced(str(err)) from None
        if err.txn_requires_abort():
            try:
                producer.abort_transaction(timeout)
            except KafkaException:
                pass
        raise
    except Exception:
        try:
            producer.abort_transaction(timeout)
        except Exception:
            pass
        raise


class TransactionalPublisher:
    """The controller's ``Publisher`` while running against Kafka: one transaction per pass, only
    through the elector's fenced producer; refuses (``Fenced``) when this instance does not lead."""

    def __init__(self, elector: LeaderElector, prefix: str) -> None:
        self._elector = elector
        self._prefix = prefix

    def publish(self, records: Sequence[OutRecord]) -> None:
        with self._elector.lock:
            producer = self._elector.producer
            if producer is None or not self._elector.is_leader:
                raise Fenced("this instance is not the leader")
            _transact(producer, self._prefix, records)
