"""The transactional producer and the per-batch checkpoint (KIP-447 consume-transform-produce).

``Checkpoint`` is one batch's transaction.  Its ``commit()`` runs four numbered
steps, and the code below carries the same numbers:

1. Offsets: for every partition in the batch, *last processed offset + 1*
   (computed from the records themselves, so a record consumed but not
   processed can never be committed).
2. ``send_offsets_to_transaction(offsets, consumer_group_metadata())``: the
   offsets join the transaction.  The group metadata carries the consumer's
   generation, so a zombie that lost its partitions in a rebalance is rejected
   by the group coordinator (KIP-447 fencing) instead of committing twice.
3. ``commit_transaction()``: flushes every result and dead letter produced in
   the batch, then atomically makes them *and* the offsets visible to
   ``read_committed`` readers.  If any record failed to be delivered the
   commit fails with an abortable error, so nothing is half-written.
4. ``poll(0)``: serve delivery events so librdkafka's queues stay empty.

Hung calls: ``send_offsets_to_transaction`` can block far past its timeout
while the group coordinator is down (librdkafka #5456; seen here when the
broker restarts mid-batch).  The three transaction calls therefore run on the
producer's watchdog thread (``sie.streams.eos.bounded.BoundedWorker``: one
long-lived thread, which is also the committer thread of pipelined commits:
``start_commit``); a call that outlives its timeout raises ``ProducerHung``:
the producer is abandoned and a new producer with the same ``transactional.id``
is created, whose ``init_transactions()`` fences the hung one.

Recovery never waits unboundedly and always honours ``stop``: (re)starting the
producer retries ``init_transactions`` with backoff until the broker answers,
each try bounded and abandoned at once on a stop request; ``rewind`` reads the
committed offsets in short, stop-aware tries; ``close_quietly`` bounds
``Consumer.close()``, which takes no timeout.

Errors (``call``): ``retriable()`` -> the same call again, a bounded number of
times (librdkafka resumes the same operation); ``txn_requires_abort()`` -> ``TxnAbortable``
(the transaction cannot commit: abort it); ``fatal()`` -> ``ProducerFatal``; an
authorization failure (a missing ACL) -> ``NotAuthorized`` (``sie.kernel.authz``), which
stops the stage: no retry can add the ACL.  Anything else from ``send_offsets_to_transaction``,
``commit_transaction`` or ``abort_transaction`` (retries used up, refused, unclassified) and
any failure of an abort is ``OutcomeUnknown``: the transaction may have committed, so it is
never aborted and re-sent; the producer is re-created (``init_transactions`` settles it) and
the consumer is rewound to the *committed* offsets (``rewind``), read back from Kafka.  After
an abort, too, only Kafka's committed offsets say where to resume.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from sie.kernel.authz import from_kafka_error
from sie.kernel.clients import failed_deliveries_only
from sie.kernel.consumer import KafkaConsumer
from sie.kernel.errors import KafkaUnavailable
from sie.streams.eos.bounded import BoundedWorker, CallAbandoned, Pending, call_bounded
from sie.streams.eos.errors import OutcomeUnknown, ProducerFatal, ProducerHung, RecordRejected, TxnAbortable

log = logging.getLogger("sie.eos")

_CALL_TIMEOUT_S = 30.0  # librdkafka timeout of one init_transactions try; recovery retries until the broker is back
_TXN_CALL_TIMEOUT_S = 10.0  # librdkafka timeout of send_offsets/commit/abort
_WATCHDOG_GRACE_S = 5.0  # how long past that timeout we wait before declaring the call hung
_COMMITTED_TRY_S = 5.0  # librdkafka timeout of one committed() try in rewind
_CLOSE_LIMIT_S = 10.0  # Consumer.close() has no timeout; after this long it is abandoned
_LEAVE_LIMIT_S = 5.0  # a planned stop waits this long at most for its LeaveGroup to be sent (leave_group)
_DEFAULT_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes default


def _per_record_codes() -> frozenset[int]:
    """librdkafka errors of produce() that concern the one record, not the transaction."""
    codes = ("MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "_UNKNOWN_PARTITION", "INVALID_RECORD", "_INVALID_ARG")
    return frozenset(getattr(KafkaError, name) for name in codes if hasattr(KafkaError, name))


_PER_RECORD = _per_record_codes()
#: the ACL operation a transaction call needs (offsets join the group's commit: Read on the group)
_OPERATION = {"send_offsets_to_transaction": "READ", "commit_transaction": "WRITE", "begin_transaction": "WRITE",
              "abort_transaction": "WRITE"}


#: the calls after which a transaction may have committed without SIE knowing it: an error of theirs that
#: librdkafka does not classify as abortable or fatal (retries used up, refused, unclassified) is an
#: ``OutcomeUnknown`` (the one rule, ``sie.streams.eos.cycle``), never an abort
UNKNOWN_OUTCOME_CALLS = frozenset({"send_offsets_to_transaction", "commit_transaction", "abort_transaction"})


def call(fn: Callable[[], Any], what: str, attempts: int, backoff_s: float,
         sleep: Callable[[float], Any] = time.sleep) -> Any:
    """Run one Kafka call with the documented error policy (see module docstring and the table in
    docs/reliability.md).  The happy path is the bare call: classification runs only on an error."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.fatal():
                raise ProducerFatal(f"{what}: {err.str()} (fatal)") from exc
            if err is not None and err.txn_requires_abort():
                raise TxnAbortable(f"{what}: {err.str()}") from exc
            if err is not None and err.retriable() and attempt < attempts:
                log.warning("%s: %s (retriable, attempt %d/%d)", what, err.str(), attempt, attempts)
                sleep(backoff_s * attempt)
                continue
            problem = f"{what}: {err.str() if err is not None else exc} (after {attempt} attempt(s))"
            if what in UNKNOWN_OUTCOME_CALLS:
                raise OutcomeUnknown(f"{problem}; whether the transaction committed is unknown") from exc
            raise TxnAbortable(problem) from exc
    raise AssertionError("unreachable")


class PendingCall:
    """Transaction calls started on a producer's watchdog thread (``TransactionalProducer.start_commit``).

    ``result()`` re-raises what they raised (``TxnAbortable``, ``ProducerFatal``, ...), or ``ProducerHung``
    naming the call that did not answer within its limit (librdkafka #5456)."""

    __slots__ = ("_pending", "_current", "_limit_s")

    def __init__(self, pending: Pending, current: list[str], limit_s: float) -> None:
        self._pending, self._current, self._limit_s = pending, current, limit_s

    def done(self) -> bool:
        return bool(self._pending.done())

    def wait(self, timeout_s: float) -> bool:
        """Whether the calls returned within ``timeout_s`` (their return wakes this at once)."""
        return bool(self._pending.wait(timeout_s))

    def result(self) -> None:
        try:
            self._pending.result()
        except CallAbandoned as exc:
            raise ProducerHung(f"{self._current[0]}: no answer after {self._limit_s:.0f}s (hung call, librdkafka "
                               f"#5456); abandoning this producer") from exc


class TransactionalProducer:
    """One ``transactional.id``, one librdkafka producer at a time; re-created after fatal errors."""

    def __init__(self, config: dict[str, Any], factory: Callable[[dict[str, Any]], Any],
                 attempts: int, backoff_s: float, stop: threading.Event,
                 hang_limit_s: float = 2 * _TXN_CALL_TIMEOUT_S + _WATCHDOG_GRACE_S) -> None:
        self._hang_limit_s = hang_limit_s  # a transaction call (retries included) is given up after this long
        self._config = config
        self._factory = factory
        self._attempts = attempts
        self._backoff = backoff_s
        self._stop = stop
        self._producer: Any = None
        #: topics written in the open transaction (named when the broker refuses one without saying which)
        self._txn_topics: set[str] = set()
        #: (topic, error) of a record refused for authorization in the open transaction
        self._refused: tuple[str, Any] | None = None
        #: the thread the transaction calls run on, so that a hung one can be abandoned (``_guarded``)
        self._watchdog = BoundedWorker(f"txn-{self.transactional_id}")

    def _on_failed_delivery(self, err: Any, msg: Any) -> None:
        if err is not None and self._refused is None and from_kafka_error(err, self._config, "WRITE") is not None:
            self._refused = (msg.topic(), err)

    @property
    def transactional_id(self) -> str:
        return str(self._config.get("transactional.id"))

    @property
    def transaction_timeout_s(self) -> float:
        """Its ``transaction.timeout.ms`` (librdkafka's default 60 s): a transaction open longer is aborted by its
        coordinator."""
        return int(self._config.get("transaction.timeout.ms", 60_000)) / 1000

    @property
    def max_record_bytes(self) -> int:
        """The largest record this producer writes (its ``message.max.bytes``): dead letters are fitted to it."""
        return int(self._config.get("message.max.bytes", _DEFAULT_MAX_BYTES))

    def start(self, patience_s: float | None = None) -> bool:
        """Create the producer and ``init_transactions()``; this fences any earlier producer of our id.

        Retries with backoff (capped at 5 s) while the cluster is unreachable or its coordinator is
        loading.  Each try is bounded: an ``init_transactions`` that outlives its own timeout is
        abandoned with its producer and a fresh one tries again.  Returns True once started, False
        as soon as ``stop`` is set (nothing is started then); raises ``KafkaUnavailable`` after
        ``patience_s`` (None: keep trying until the broker is back) or on a non-retriable error.
        """
        deadline = None if patience_s is None else time.monotonic() + patience_s
        delay = self._backoff
        while not self._stop.is_set():
            # Delivery reports of failed records only (nothing per successful record): a record the broker
            # refuses for a missing ACL (e.g. a topic this principal may not write or create) fails only
            # there, as "N message(s) failed delivery" from commit_transaction.
            producer = self._factory(failed_deliveries_only(self._config, self._on_failed_delivery))
            try:
                call_bounded(lambda: producer.init_transactions(_CALL_TIMEOUT_S), "init_transactions",
                             _CALL_TIMEOUT_S + _WATCHDOG_GRACE_S, self._stop)
                self._producer = producer
                return True
            except CallAbandoned as exc:
                problem = str(exc)
                cause: Exception = exc
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                problem = err.str() if err else str(exc)
                cause = exc
                denied = from_kafka_error(err, self._config, "WRITE")
                if denied is not None:
                    _purge(producer)
                    raise denied from exc
                if err is None or not err.retriable():
                    _purge(producer)
                    raise KafkaUnavailable(
                        f"init_transactions for transactional.id {self.transactional_id}: {problem}; "
                        f"check bootstrap servers and that the broker is up") from exc
            _purge(producer)
            del producer  # the abandoned client is destroyed by whichever thread drops it last
            if self._stop.is_set():
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise KafkaUnavailable(
                    f"init_transactions for transactional.id {self.transactional_id}: {problem} for "
                    f"{patience_s:.0f}s; check bootstrap servers and that the broker is up") from cause
            log.warning("init_transactions: %s; retrying in %.1fs", problem, delay)
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, 5.0)
        return False

    def restart(self) -> bool:
        """Drop the unusable producer and start a fresh one (``init_transactions`` aborts what was open).

        Keeps trying until the broker answers; False if ``stop`` was set first (no producer then).
        """
        self.discard()
        return self.start()

    def discard(self) -> None:
        """Abandon the current producer: whatever it still queues is purged, never delivered."""
        if self._producer is not None:
            _purge(self._producer)
            self._producer = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5.0)
            self._producer = None
        self._watchdog.close()

    # --- transaction calls ------------------------------------------------------
    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return call(fn, what, self._attempts, self._backoff)
        except (TxnAbortable, ProducerFatal) as exc:  # a missing ACL is final: say which, do not retry
            if self._refused is not None:  # a record was refused: its delivery report names the topic
                topic, refused = self._refused
                denied = from_kafka_error(refused, self._config, "WRITE", topic)
            else:
                cause = exc.__cause__
                err = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
                denied = from_kafka_error(err, self._config, _OPERATION.get(what, "WRITE"),
                                          topics=tuple(sorted(self._txn_topics)))
            if denied is not None:
                raise denied from exc
            raise

    def _start_guarded(self, *steps: tuple[Callable[[], Any], str],
                       then: Callable[[], None] | None = None) -> PendingCall:
        """Start each step's ``_call``, in order, then ``then()``, on the watchdog thread (see ``PendingCall``).

        The steps of one commit go together: one handoff to that thread per commit, not one per call (each
        handoff waits for the GIL while the loop thread prepares the next batch); each step gets
        ``hang_limit_s`` from its own start (a hung ``send_offsets_to_transaction`` is given up after 25 s, not
        after the 50 s of both steps: in a run of the fault campaign's broker freeze, that 50 s wait stalled
        scoring 62 s, past the campaign's 60 s bound)."""
        current = [steps[0][1]]
        deadline = [time.monotonic() + self._hang_limit_s]

        def run() -> None:
            for fn, what in steps:
                current[0] = what
                deadline[0] = time.monotonic() + self._hang_limit_s
                self._call(fn, what)
            if then is not None:
                then()

        return PendingCall(self._watchdog.submit(run, "txn", self._hang_limit_s, deadline_of=lambda: deadline[0]),
                           current, self._hang_limit_s)

    def _guarded(self, *steps: tuple[Callable[[], Any], str]) -> None:
        """``_start_guarded`` and wait: not stop-aware on purpose (a stop request lets the current batch
        commit; bounded anyway)."""
        self._start_guarded(*steps).result()

    def begin(self) -> None:
        if self._producer is None:  # a restart was interrupted by a stop request
            raise ProducerFatal("begin_transaction: no producer (its restart was interrupted)")
        self._txn_topics.clear()
        self._refused = None
        self._call(self._producer.begin_transaction, "begin_transaction")

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int = -1,
                headers: list[tuple[str, bytes]] | None = None) -> None:
        """Queue one record; waits for room if librdkafka's queue is full (never drops).

        ``RecordRejected`` when librdkafka refuses this record alone (too large, unknown partition);
        ``TxnAbortable`` / ``ProducerFatal`` when the transaction or the producer is the problem.
        """
        p = self._producer
        self._txn_topics.add(topic)
        while True:
            try:
                if headers is None:
                    p.produce(topic, value, key, partition)
                else:
                    p.produce(topic, value, key, partition, headers=headers)
                return
            except BufferError:
                p.poll(0.05)
            except KafkaException as exc:  # e.g. the transaction entered an error state
                err = exc.args[0]
                denied = from_kafka_error(err, self._config, "WRITE", topics=(topic,))
                if denied is not None:
                    raise denied from exc
                if err.fatal():
                    raise ProducerFatal(f"produce to {topic}: {err.str()}") from exc
                if err.code() in _PER_RECORD and not err.txn_requires_abort():
                    raise RecordRejected(f"produce to {topic}: {err.str()}", err.name()) from exc
                raise TxnAbortable(f"produce to {topic}: {err.str()}") from exc

    def start_commit(self, offsets: list[TopicPartition] | None = None, group_metadata: Any = None,
                     then: Callable[[], None] | None = None) -> PendingCall:
        """Start committing the open transaction on the watchdog thread; with ``offsets``, send them to it first
        (``group_metadata`` stamps them with the consumer group's generation: a zombie's offsets are refused).
        ``then()`` runs on that thread right after the commit returned (e.g. a timestamp)."""
        producer = self._producer
        commit = (lambda: producer.commit_transaction(_TXN_CALL_TIMEOUT_S), "commit_transaction")
        if offsets is None:
            return self._start_guarded(commit, then=then)
        return self._start_guarded((lambda: producer.send_offsets_to_transaction(offsets, group_metadata,
                                                                                 _TXN_CALL_TIMEOUT_S),
                                    "send_offsets_to_transaction"), commit, then=then)

    def commit(self, offsets: list[TopicPartition] | None = None, group_metadata: Any = None) -> None:
        """``start_commit`` and wait for it."""
        self.start_commit(offsets, group_metadata).result()

    def abort(self) -> None:
        """Abort the open transaction.  Any failure here (refused, timed out, hung, fatal) is an
        ``OutcomeUnknown``: the producer must be re-created, and a refusal may mean the coordinator is
        committing it (INVALID_TXN_STATE after a commit whose answer was lost)."""
        try:
            producer = self._producer
            self._guarded((lambda: producer.abort_transaction(_TXN_CALL_TIMEOUT_S), "abort_transaction"))
        except OutcomeUnknown:
            raise
        except (TxnAbortable, ProducerFatal) as exc:
            raise OutcomeUnknown(f"{exc}; whether the transaction committed is unknown") from exc

    def poll(self) -> None:
        self._producer.poll(0)

    def transact(self, fill: Callable[[TransactionalProducer], None]) -> None:
        """One transaction without consumer offsets (the control-plane leader's writes): begin,
        ``fill(self)`` produces the records, commit; all of them become visible or none.

        On any failure the transaction is aborted before the error propagates: ``TxnAbortable``
        (nothing was written; try again) or ``ProducerFatal`` (this producer is unusable: fenced by a
        newer holder of the id, or abort itself failed).
        """
        try:
            self.begin()
            fill(self)
            self.commit()
        except ProducerFatal:
            raise
        except BaseException:
            self.abort()  # ProducerFatal if the abort fails too
            raise


class Checkpoint:
    """One batch's transaction: records produced, offsets tracked, committed in order (module docstring)."""

    __slots__ = ("_producer", "_consumer", "_last", "_first", "produced", "opened_at")

    def __init__(self, producer: TransactionalProducer, consumer: KafkaConsumer) -> None:
        self._producer = producer
        self._consumer = consumer
        self._last: dict[tuple[str, int], int] = {}
        self._first: dict[tuple[str, int], int] = {}
        self.produced = 0
        #: when ``begin`` was called (the stage's monotonic clock); None: never begun
        self.opened_at: float | None = None

    def begin(self) -> None:
        self._producer.begin()

    def track_batch(self, batch: list[Any]) -> None:
        """Every record of ``batch`` processed: each produced its outputs (or was skipped on purpose)."""
        first, last = self._first, self._last
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            if tp not in first:
                first[tp] = msg.offset()
            last[tp] = msg.offset()

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int = -1,
                headers: list[tuple[str, bytes]] | None = None) -> None:
        self._producer.produce(topic, value, key, partition, headers)
        self.produced += 1

    def offsets(self) -> list[TopicPartition]:
        """Step 1: the offsets to commit, last processed + 1 per partition."""
        return [TopicPartition(t, p, off + 1) for (t, p), off in self._last.items()]

    def commit(self, group_metadata: Any = None) -> None:
        """Steps 1-4, waiting for them.  ``group_metadata``: the consumer's; None: taken here."""
        if group_metadata is None:
            group_metadata = self._consumer.consumer_group_metadata()
        self.start_commit(group_metadata).result()

    def start_commit(self, group_metadata: Any, then: Callable[[], None] | None = None) -> PendingCall:
        """Steps 1-4 on the producer's watchdog thread (pipelined commits).  ``group_metadata``: the consumer's,
        taken by the caller on the consumer's own thread (the consumer is not thread-safe); ``then()`` runs on
        that thread once the commit returned."""
        # 1. Offsets = last processed + 1, from the records of this batch.
        offsets = self.offsets()
        producer = self._producer

        def finish() -> None:
            producer.poll()  # 4. serve delivery events
            if then is not None:
                then()

        # 2. Offsets join the transaction, stamped with the group generation (zombie fencing), and
        # 3. results + dead letters are flushed and committed atomically with them.
        return producer.start_commit(offsets, group_metadata, then=finish)

    def first_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self._first)


def rewind(consumer: KafkaConsumer, first_offsets: dict[tuple[str, int], int], stop: threading.Event,
           backoff_s: float = 0.1) -> bool:
    """Seek the batch's partitions back to the group's committed offsets.

    The committed offset read back from the broker (not our own bookkeeping) is the truth after an abort
    or an unknown commit outcome.  The consumer is read_committed (``sie.kernel.clients``), so librdkafka
    asks with ``require_stable``: an offset still pending in an open transaction is not answered until that
    transaction ends.  A partition the broker answers for with an error (coordinator moving, an offset still
    unstable) is asked again, never guessed: falling back to the batch's first offset there would score again
    a batch whose transaction committed.  Only a partition the broker says was never committed (no offset,
    no error) falls back to the batch's first offset (nothing of it was committed).  Partitions no longer
    assigned are skipped: their new owner reads from the committed offset.
    Retries (short, bounded tries, backoff capped at 5 s) while the coordinator is unreachable;
    returns False only if asked to stop.
    """
    delay = backoff_s
    while True:
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        tps = [TopicPartition(t, p) for (t, p) in first_offsets if (t, p) in assigned]
        if not tps:
            return True
        try:
            committed = call_bounded(lambda: consumer.committed(tps, timeout=_COMMITTED_TRY_S), "committed",
                                     _COMMITTED_TRY_S + _WATCHDOG_GRACE_S, stop)
            failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in committed if tp.error is not None]
            if not failed:
                break
            log.warning("committed(): %s; asking again before rewinding", ", ".join(failed))
        except CallAbandoned as exc:
            if exc.stopped:
                return False
            log.warning("committed(): %s; retrying before rewinding", exc)
        except KafkaException as exc:
            log.warning("committed(): %s; retrying before rewinding", exc)
        if stop.wait(delay):
            return False
        delay = min(delay * 2, 5.0)
    for tp in committed:
        target = tp.offset if tp.offset >= 0 and tp.offset != OFFSET_INVALID else first_offsets[(tp.topic, tp.partition)]
        try:
            consumer.seek(TopicPartition(tp.topic, tp.partition, target))
        except KafkaException as exc:  # revoked meanwhile: the next owner starts from the committed offset
            log.warning("seek %s[%d] to %d: %s", tp.topic, tp.partition, target, exc)
    return True


def _purge(producer: Any) -> None:
    """Drop what an abandoned producer still queues (it must not deliver after its successor started)."""
    try:
        producer.purge(in_queue=True, in_flight=False)
    except Exception:  # an unusable producer may refuse even this; it is dropped anyway
        pass


def leave_group(consumer: KafkaConsumer, limit_s: float = _LEAVE_LIMIT_S, clock: Callable[[], float] = time.monotonic,
                poll_s: float = 0.05, *, subscribed: bool = False) -> bool:
    """A planned stop (SIGTERM, a drain, a lane removed): leave the consumer group NOW, so the other members
    take this member's partitions at their next heartbeat instead of after ``session.timeout.ms``.

    Call it after the last batch committed.  Why not just ``close()``: a static member
    (``group.instance.id``, KIP-345) sends no LeaveGroup when it closes (librdkafka
    ``rd_kafka_cgrp_leave_maybe``: skipped once the consumer is terminating), so its partitions
    wait out the session timeout with nobody scoring them.
    ``unsubscribe()`` before ``close()`` does leave, static or not: the revoke of every partition it owns
    is served here (``poll``; the stage's ``on_revoke`` finds nothing in flight, and a record the poll
    still returns is dropped: it is uncommitted, the next owner reads it again), and once the unassign is
    done librdkafka sends the LeaveGroup and clears the member id (``rd_kafka_cgrp_leave``), which is
    what this waits for: closing before that would suppress the leave again.

    ``subscribed``: the consumer is subscribed now (a stage's planned stop).  With no member id it is then
    joining, and the JoinGroup's answer is awaited (``poll``) before the unsubscribe: the broker registered the
    member when the request arrived (a static member at once), but librdkafka leaves on unsubscribe only when it
    knows its member id (``rd_kafka_cgrp_unsubscribe``: ``RD_KAFKA_CGRP_HAS_JOINED``) and drops an answer that
    comes after it (``rd_kafka_cgrp_handle_JoinGroup``: no longer in wait-join).  Unsubscribed at once, the
    member would be given partitions by that join and hold them until its session timed out
    (tests/streams/eos/test_leave_kafka.py: a worker the agent stops while it is still joining).  Without
    ``subscribed`` (a stall's leave, a consumer already out of its group) nothing is awaited.

    A crash (SIGKILL, an error out of the loop) never gets here: the member stays in the group until
    its session times out, and a restarted replica (same ``group.instance.id``) takes its place and its
    partitions without a rebalance.

    Returns whether the leave was sent within ``limit_s`` (False: the group drops the member after its
    session timeout, as for a crash; safe, nothing uncommitted is lost).  Never raises.
    """
    deadline = clock() + limit_s
    try:
        while subscribed and not consumer.memberid() and clock() < deadline:
            consumer.poll(poll_s)  # the JoinGroup's answer; a record it returns is dropped (never committed)
        # unsubscribed also when still no member (a stall's leave, or the bound above ran out): after a lost
        # session librdkafka is joining again, and that join would complete with an assignment (a stalled
        # scorer would be handed its partitions back)
        consumer.unsubscribe()
        while consumer.memberid():
            if clock() >= deadline:
                return False
            consumer.poll(poll_s)  # serves the revoke; a record it returns is dropped (never committed)
        return True
    except Exception as exc:  # a consumer in an error state (fenced, closed): it is dropped by the group anyway
        log.warning("leaving the consumer group: %s", exc)
        return False


def close_quietly(consumer: KafkaConsumer, producer: TransactionalProducer | None,
                  logger: logging.Logger = log, *, leave: bool = False, subscribed: bool = False) -> None:
    """Close the consumer, then the producer; never raises.  ``leave``: a planned stop, the consumer
    leaves the group first (``leave_group``: its partitions move to the others at once, static member
    or not; ``subscribed``: a join in flight is awaited first); else a static member keeps its place for its
    restart (a dynamic one leaves on close anyway).

    ``Consumer.close()`` has no timeout and can wait indefinitely while the group coordinator is
    unreachable; after ``_CLOSE_LIMIT_S`` it is abandoned (the group then drops this member after
    ``session.timeout.ms``, which is safe: nothing uncommitted is lost, it is read again).
    """
    if consumer is not None and leave:
        try:  # leave_group bounds itself; the watchdog is for a client call that never returns
            left = call_bounded(lambda: leave_group(consumer, subscribed=subscribed), "consumer-leave", _LEAVE_LIMIT_S + _WATCHDOG_GRACE_S)
        except CallAbandoned as exc:
            left = False
            logger.warning("consumer leave: %s", exc)
        if not left:
            logger.warning("consumer group: no LeaveGroup sent within %.0fs; the group drops this member "
                           "after session.timeout.ms", _LEAVE_LIMIT_S)
    if consumer is not None:
        try:
            call_bounded(consumer.close, "consumer-close", _CLOSE_LIMIT_S)
        except CallAbandoned as exc:
            logger.warning("consumer close: %s; leaving it (the group drops us after session.timeout.ms)", exc)
        except Exception as exc:  # closing must never mask the reason we are stopping
            logger.warning("consumer close: %s", exc)
    if producer is not None:
        try:
            producer.close()
        except Exception as exc:
            logger.warning("producer close: %s", exc)
