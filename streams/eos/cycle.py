"""The exactly-once batch cycle (KIP-447 consume-transform-produce), written once for every stage.

One batch::

    txn.track_batch(batch)       # offsets = last record of each partition + 1 (known before anything is produced)
    prepared = prepare(batch)    # OUTSIDE the transaction: parse, validate, infer, build every output
    txn.begin()
    txn.produce(each output)     # a record the producer refuses alone -> its dead letter, fitted
    txn.commit()                 # offsets + outputs atomically (read_committed readers)

Preparing first keeps the broker-side transaction (it starts with the first produced record) as short as
producing and committing, whatever the inference time; and a dependency that is down (``RetryLater``)
is found before anything was produced.

Pipelined (``start_batch``/``settle``, what ``StreamLoop`` runs when ``pipelined``): the commit of batch N runs on
the producer's committer thread (its watchdog: ``TransactionalProducer.start_commit``) while the caller's
thread collects batch N+1 (librdkafka releases the GIL while it waits for the coordinator)::

    loop thread:  collect N+1 (open while commit N runs) | prepare N+1 | settle(N) | begin N+1, produce, start commit N+1 | ...
    committer:    ... commit N (send_offsets + commit_transaction) ...|                                             | commit N+1 ...

``StreamLoop`` keeps batch N+1 open while commit N runs (``Batcher.collect(hold=commit_running)``): under a
backlog N+1 is full at once and its preparation (parse, validate, infer) overlaps the commit's round
trips; at light load it closes when commit N returns, so a record arriving during a commit is in the
next transaction (a batch closed at the commit's start would make it wait for a whole extra commit).

The rules that keep it exactly once:

* one open transaction per producer: batch N+1 begins only after ``settle`` saw commit N finish;
* the consumer stays on the caller's thread (consume, seek, rebalance callbacks): the group metadata that
  ``send_offsets_to_transaction`` needs is taken there, when the commit starts (after the last
  ``consume()``, so no rebalance can come between), and the committer only talks to the producer;
* offsets are still "last record of the batch + 1" per partition, computed from the batch's records;
* a rebalance (``on_revoke``/``on_lost``) calls ``settle`` first: the in-flight commit finishes (or fails)
  before the partitions go;
* if commit N fails, batch N+1 (already prepared, nothing of it produced) is DISCARDED: commit N's
  recovery rewinds the partitions of both batches to the committed offsets, and their records come again;
* a ``RetryLater`` while preparing N+1 settles commit N first: the rewind must read final committed offsets;
* a stop request (SIGTERM) ends the loop between batches; ``StreamLoop`` then settles the in-flight commit.

Failure -> what happens (the batch is never half-visible), the same in both modes:

* ``TxnAbortable``  -> ``abort_transaction()``, rewind to the committed offsets, the batch is read again;
  an abort that fails in any way is an ``OutcomeUnknown`` (below);
* ``OutcomeUnknown`` (send_offsets, commit or abort timed out, refused, hung past the watchdog:
  ``ProducerHung``, or an unclassified error) -> THE ONE RULE: no abort, no re-send; the producer is
  closed and a new one with the same ``transactional.id`` runs ``init_transactions`` (it fences the old
  epoch, and the coordinator completes or aborts the pending transaction before it answers), then the
  consumer's positions are set from the committed offsets read back from the broker (``rewind``:
  require_stable, a partition answered with an error is asked again); not counted as fencing;
  re-creation retries until the broker is back, or ``stop`` is set;
* ``ProducerFatal`` -> re-create the producer and rewind the same way; ``fatal_limit`` in a row ->
  ``Fenced`` (almost always two live processes sharing one ``transactional.id``);
* ``RetryLater`` (e.g. the scorer's ``BackendUnavailable``) while preparing -> rewind, back off (doubling,
  capped), and the same records come again: an outage never becomes dead letters;
* ``RecordRejected`` (one output too large for ``message.max.bytes``, an unknown partition) -> the stage's
  ``rejected`` hook turns it into a dead letter, fitted to the limit (``deadletter.fit``; at worst
  ``deadletter.minimal``): one poison record never aborts its batch in a loop.

Every rewind is reported to ``on_rewind`` (``StreamLoop`` drops records it had already collected from
those partitions: they come again after the seek).

Stalled: a stage that reaches its group coordinator (so it keeps its partitions) but not its transaction
coordinator or the leaders it writes to (a partial partition) fails every batch and would hold its
partitions until ``max.poll.interval.ms``.  When a batch fails, or its commit has not returned, and nothing was
committed for ``EosLimits.stall_s`` while there was work (``idle()`` says when there was none),
``on_stalled(reason)`` runs BEFORE the recovery (which may wait for the broker): ``StreamLoop`` leaves the
consumer group there, so the other members take the partitions, and joins again once the recovery is through.
(A commit still in flight then carries the old generation: the group coordinator refuses its offsets, or it
completed before the rebalance; exactly once either way, KIP-447.)

Users: the scorer and the CDC stage through ``stage.StreamLoop``, serial unless asked (``PIPELINED_DEFAULT``
below, the one default both read: ``StageSettings.pipelined``, ``ScorerConfig.pipelined``; ``sie score
--pipelined`` opts in); backfill and dead-letter redrive through ``StreamLoop``'s bounded runs
(``sie.streams.eos.ranges``: serial); the LLM stage through ``StreamLoop``'s windowed mode
(``sie.streams.eos.windowed``: serial); the control-plane
leader uses the same ``TransactionalProducer`` for producer-only transactions.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sie.kernel.consumer import KafkaConsumer
from sie.streams.eos.deadletter import DEAD_LETTER, fit, minimal
from sie.streams.eos.errors import (
    EosError,
    Fenced,
    OutcomeUnknown,
    ProducerFatal,
    RecordRejected,
    RetryLater,
    TxnAbortable,
)
from sie.streams.eos.records import Output, Prepared
from sie.streams.eos.transaction import Checkpoint, PendingCall, TransactionalProducer, rewind

#: ``rejected(output, detail, value)``: the replacement (a dead letter) of an output the producer refused
Rejected = Callable[[Output, str, Any], Output]
#: ``on_rewind(partitions)``: the consumer was sought back on these ``(topic, partition)``s
OnRewind = Callable[[list[tuple[str, int]]], None]

log = logging.getLogger("sie.eos")

T = TypeVar("T")

#: The one default commit mode of every stage: ``StageSettings.pipelined`` (the CDC stage) and
#: ``ScorerConfig.pipelined`` (``sie score``, the node agent's workers) both read it; ``sie score --pipelined``
#: opts in.  Serial: pipelining was not ahead at every rate or in every run, so the simpler cycle is the default
#: (bench/results/pipelining.txt).
PIPELINED_DEFAULT = False

#: how often a stage waiting on a commit looks at whether it stalled (``ExactlyOnce._wait``)
_STALL_TICK_S = 0.5


class BatchStatus(str, enum.Enum):
    """How one batch ended; only ``COMMITTED`` made anything visible."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    PRODUCER_RESTARTED = "producer_restarted"
    BACKED_OFF = "backed_off"
    #: pipelined only: prepared while the previous commit was in flight, thrown away (nothing of it was
    #: produced) because that commit failed; its records come again after the rewind
    DISCARDED = "discarded"


@dataclass(frozen=True)
class EosLimits:
    """Knobs of the cycle: retries of one Kafka call, fatal-error tolerance, backoff of ``RetryLater``,
    and how long a hung transaction call is waited for before its producer is abandoned."""

    attempts: int = 8
    backoff_s: float = 0.1
    fatal_limit: int = 5
    retry_later_max_s: float = 5.0
    hang_limit_s: float = 25.0
    #: a batch that fails after nothing was committed for this long (while there was work) is a stall:
    #: ``on_stalled`` (module docstring); None: never (stages without a consumer group)
    stall_s: float | None = None


@dataclass(slots=True)
class BatchTimes:
    """Wall-clock stamps (``time.time()``) of one batch: where its records' latency went.

    ``collected`` (the batcher handed it over) -> ``prepared`` (parse/validate/infer done) -> ``begun``
    (pipelined: the previous commit had settled) -> ``produced`` (outputs queued: the commit starts) ->
    ``committed`` (``commit_transaction`` returned: the results are visible once the markers are written).
    0.0 for a step the batch never reached.  ``bench/bench_latency.py`` turns them into a time split.
    """

    collected: float = 0.0
    prepared: float = 0.0
    begun: float = 0.0
    produced: float = 0.0
    committed: float = 0.0

    @property
    def commit_s(self) -> float:
        """Seconds in ``Checkpoint.commit`` (offsets + commit round trips)."""
        return max(0.0, self.committed - self.produced) if self.committed else 0.0


@dataclass(slots=True)
class BatchOutcome(Generic[T]):
    """One batch's end: its status, the prepared value (only when committed), its size and timings."""

    status: BatchStatus
    value: T | None
    size: int
    times: BatchTimes = field(default_factory=BatchTimes)


@dataclass(slots=True)
class _InFlight:
    """The batch whose commit runs on the committer thread."""

    txn: Checkpoint
    commit: PendingCall
    value: Any
    size: int
    times: BatchTimes


class EosObserver(Protocol):
    """What a stage wants to count about failed batches (metrics); every method is optional work."""

    def aborted(self) -> None: ...

    def producer_restarted(self) -> None: ...

    def retry_later(self, exc: RetryLater) -> None: ...


class _NoObserver:
    def aborted(self) -> None:
        pass

    def producer_restarted(self) -> None:
        pass

    def retry_later(self, exc: RetryLater) -> None:
        pass


class ExactlyOnce:
    """The batch cycle over one transactional producer and one consumer (module docstring).

    Serial: ``run_batch`` (returns when the batch committed or failed).  Pipelined: ``start_batch``
    (returns once this batch's commit has STARTED, with the outcomes decided meanwhile) and ``settle``
    (waits for the in-flight commit; the producer's ``close`` ends its committer thread).
    """

    def __init__(self, producer: TransactionalProducer, consumer: KafkaConsumer, stop: threading.Event,
                 limits: EosLimits = EosLimits(), *, observer: EosObserver | None = None,
                 fenced_hint: str = "give every instance a distinct --instance (or stop the other job)",
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 on_rewind: OnRewind | None = None, on_stalled: Callable[[str], None] | None = None) -> None:
        self.producer = producer
        self.consumer = consumer
        self._stop = stop
        self._limits = limits
        self._observer: EosObserver = observer or _NoObserver()
        self._fenced_hint = fenced_hint
        self._clock = clock
        self._wall = wall_clock
        self._on_rewind = on_rewind
        self._on_stalled = on_stalled
        #: when the stage last made progress: a commit, or nothing to do (``idle``) before its batches failed
        self._progress_at = clock()
        self._failed_since_commit = False
        self._fatal_streak = 0
        self._retry_delay = limits.backoff_s
        self._inflight: _InFlight | None = None
        self.aborts = 0
        self.producer_restarts = 0
        self.backoffs = 0
        #: seconds the last committed batch spent in ``Checkpoint.commit`` (offsets + commit round trips)
        self.last_commit_s = 0.0
        #: timings of the last committed batch (set before its outcome is handed back)
        self.last_times = BatchTimes()

    def idle(self) -> None:
        """Nothing to do right now (no records, nothing in flight): not a stall, however long ago the last commit.
        Once a batch failed, only a commit counts (records of a failed batch come again after the rewind, and a
        poll meanwhile may well return none)."""
        if self._inflight is None and not self._failed_since_commit:
            self._progress_at = self._clock()

    def restarted(self) -> None:
        """The stage starts afresh (joined its group again): ``stall_s`` counts from now."""
        self._progress_at = self._clock()
        self._failed_since_commit = False

    @property
    def in_flight(self) -> bool:
        """A commit was started on the committer thread and not settled yet (``settle`` waits for it)."""
        return self._inflight is not None

    def commit_running(self, wait_s: float = 0.0) -> bool:
        """Whether the started commit is still running after waiting up to ``wait_s`` for it to return
        (the batcher holds the next batch open meanwhile; the commit's end wakes the wait at once)."""
        inflight = self._inflight
        if inflight is None:
            return False
        if wait_s > 0:
            return not inflight.commit.wait(wait_s)
        return not inflight.commit.done()

    # --- serial ---------------------------------------------------------------------------------------
    def run_batch(self, batch: list[Any], prepare: Callable[[list[Any]], Prepared[T]],
                  rejected: Rejected | None = None) -> tuple[BatchStatus, T | None]:
        """Prepare ``batch``, then produce its outputs and commit in one transaction (module docstring);
        returns the prepared value only if the transaction committed."""
        outcome = self.start_batch(batch, prepare, rejected, pipelined=False)[-1]
        return outcome.status, outcome.value

    # --- pipelined ------------------------------------------------------------------------------------
    def start_batch(self, batch: list[Any], prepare: Callable[[list[Any]], Prepared[T]],
                    rejected: Rejected | None = None, *, pipelined: bool = True,
                    collected_at: float | None = None) -> list[BatchOutcome[Any]]:
        """Prepare ``batch`` (overlapping the in-flight commit, if any), settle that commit, then begin,
        produce and START this batch's commit on the committer thread (``pipelined``; else commit here).

        Returns the outcomes decided during the call, in batch order: the previous batch's (if its
        commit was in flight), then this batch's unless its commit is now in flight.
        """
        outcomes: list[BatchOutcome[Any]] = []
        times = BatchTimes(collected=collected_at if collected_at is not None else self._wall())
        txn = Checkpoint(self.producer, self.consumer)
        txn.track_batch(batch)  # before anything can fail: every failure below rewinds these partitions
        try:
            prepared = prepare(batch)
        except RetryLater as exc:
            outcomes += self.settle()  # the rewind below must read final committed offsets
            log.error("%s; retrying the batch in %.1fs", exc, self._retry_delay)
            self.backoffs += 1
            self._observer.retry_later(exc)
            self._rewind(txn.first_offsets())  # nothing was produced: only the consumer goes back
            self._stop.wait(self._retry_delay)
            self._retry_delay = min(self._retry_delay * 2, self._limits.retry_later_max_s)
            outcomes.append(BatchOutcome(BatchStatus.BACKED_OFF, None, len(batch), times))
            return outcomes
        times.prepared = self._wall()
        previous = self.settle(also=txn.first_offsets())
        outcomes += previous
        if previous and previous[-1].status is not BatchStatus.COMMITTED:
            # the previous commit failed: its recovery rewound this batch's partitions too
            outcomes.append(BatchOutcome(BatchStatus.DISCARDED, None, len(batch), times))
            return outcomes
        try:
            times.begun = self._wall()
            txn.opened_at = self._clock()
            txn.begin()
            for out in prepared.outputs:
                self._produce(txn, out, rejected, prepared.value)
            times.produced = self._wall()
            # the consumer is not thread-safe: its group metadata is taken here, after the last consume()
            metadata = self.consumer.consumer_group_metadata()
            if pipelined:
                pending = txn.start_commit(metadata, then=lambda: self._stamp_committed(times))
                self._inflight = _InFlight(txn, pending, prepared.value, len(batch), times)
                return outcomes
            self._wait(txn.start_commit(metadata))
            self._stamp_committed(times)
        except (TxnAbortable, ProducerFatal) as exc:
            outcomes.append(BatchOutcome(self._recover(txn, exc), None, len(batch), times))
            return outcomes
        outcomes.append(self._committed(prepared.value, len(batch), times))
        return outcomes

    def settle(self, also: dict[tuple[str, int], int] | None = None,
               revoked: Iterable[Any] = ()) -> list[BatchOutcome[Any]]:
        """Wait for the in-flight commit, if any, and return its outcome (``[]`` when none was in flight).

        If it failed, the usual recovery runs here (abort or re-create the producer, rewind); the rewind
        also covers ``also`` (first offsets of a batch read after it, to be discarded) and skips the
        ``revoked`` partitions (called from a rebalance callback: their next owner reads from the
        committed offset anyway).
        """
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return []
        try:
            self._wait(inflight.commit)  # bounded: ProducerHung if a call inside never answered
        except (TxnAbortable, ProducerFatal) as exc:
            gone = {(tp.topic, tp.partition) for tp in revoked}
            first = {tp: off for tp, off in inflight.txn.first_offsets().items() if tp not in gone}
            for tp, off in (also or {}).items():
                if tp not in gone:
                    first[tp] = min(off, first.get(tp, off))
            status = self._recover(inflight.txn, exc, first)
            return [BatchOutcome(status, None, inflight.size, inflight.times)]
        return [self._committed(inflight.value, inflight.size, inflight.times)]

    # --- steps ----------------------------------------------------------------------------------------
    def _wait(self, pending: PendingCall) -> None:
        """``pending.result()``; meanwhile, past ``stall_s`` without a commit, ``on_stalled`` (module docstring):
        a commit that hangs on an unreachable coordinator is given up by the watchdog only after
        ``hang_limit_s`` (25 s) from the start of the call that hangs, the partitions should move on before that."""
        stall_s = self._limits.stall_s
        if self._on_stalled is not None and stall_s is not None:
            while not pending.wait(_STALL_TICK_S):
                stalled_s = self._clock() - self._progress_at
                if stalled_s >= stall_s:
                    self._on_stalled(f"nothing committed for {stalled_s:.0f}s, the commit in flight has not returned")
                    break
        pending.result()

    def _stamp_committed(self, times: BatchTimes) -> None:
        """When the commit returned (on the committer thread when pipelined)."""
        times.committed = self._wall()

    def _committed(self, value: Any, size: int, times: BatchTimes) -> BatchOutcome[Any]:
        self._progress_at = self._clock()
        self._failed_since_commit = False
        self._fatal_streak = 0
        self._retry_delay = self._limits.backoff_s
        self.last_commit_s = times.commit_s
        self.last_times = times
        return BatchOutcome(BatchStatus.COMMITTED, value, size, times)

    def _produce(self, txn: Checkpoint, out: Output, rejected: Rejected | None, value: Any) -> None:
        """One output; a record the producer refuses alone is replaced by its (fitted) dead letter."""
        try:
            txn.produce(out.topic, out.value, out.key, out.partition, out.headers)
            return
        except RecordRejected as exc:
            detail = f"{out.topic}: record of {out.size()} bytes refused by the producer ({exc.code}: {exc})"
            if out.kind == DEAD_LETTER:  # already a dead letter: only its smallest form is left
                replacement = out
            elif rejected is None:
                raise TxnAbortable(f"{exc}; this stage has no dead letter for refused records") from exc
            else:
                log.warning("output refused, dead-lettering its source instead: %s", detail)
                replacement = fit(rejected(out, detail, value), self.producer.max_record_bytes)
        try:
            txn.produce(replacement.topic, replacement.value, replacement.key, replacement.partition,
                        replacement.headers)
        except RecordRejected:
            last = minimal(replacement)
            txn.produce(last.topic, last.value, last.key, last.partition, last.headers)

    # --- recovery (the same for both modes) -------------------------------------------------------------
    def _recover(self, txn: Checkpoint, exc: EosError,
                 first: dict[tuple[str, int], int] | None = None) -> BatchStatus:
        first = txn.first_offsets() if first is None else first
        self._failed_since_commit = True
        stalled_s = self._clock() - self._progress_at
        if self._on_stalled is not None and self._limits.stall_s is not None and stalled_s >= self._limits.stall_s:
            self._on_stalled(f"nothing committed for {stalled_s:.0f}s, the last batch failed: {exc}")
        if isinstance(exc, TxnAbortable):
            log.warning("transaction aborted: %s", exc)
            return self._abort(first)
        if isinstance(exc, OutcomeUnknown):
            # the one rule: never abort and re-send what may have committed; a new producer's init_transactions
            # settles the transaction, then the positions come from the broker's committed offsets
            log.warning("transaction outcome unknown (%s): re-creating the producer, then resuming from the "
                        "committed offsets", exc)
            self._restart(first)
            return BatchStatus.PRODUCER_RESTARTED
        # nor does a fatal error of a transaction open longer than its timeout count as "fenced": its coordinator
        # aborted it and bumped the producer's epoch (the stage was partitioned or slow)
        if not self._timed_out(txn):
            self._fatal_streak += 1
        if self._fatal_streak >= self._limits.fatal_limit:
            raise Fenced(
                f"transactional.id {self.producer.transactional_id}: {self._fatal_streak} fatal producer "
                f"errors in a row (last: {exc}); another live process probably uses the same id: "
                f"{self._fenced_hint}") from exc
        log.error("producer unusable (%s); re-creating it", exc)
        self._restart(first)
        return BatchStatus.PRODUCER_RESTARTED

    def _timed_out(self, txn: Checkpoint) -> bool:
        """Whether ``txn`` was open longer than ``transaction.timeout.ms`` (so its coordinator may have aborted it)."""
        return txn.opened_at is not None and self._clock() - txn.opened_at >= self.producer.transaction_timeout_s

    def _abort(self, first: dict[tuple[str, int], int]) -> BatchStatus:
        self.aborts += 1
        self._observer.aborted()
        started = self._clock()
        try:
            self.producer.abort()
        except ProducerFatal as exc:  # OutcomeUnknown: refused (maybe committing), timed out, hung
            log.error("abort failed (%s); its outcome is unknown: re-creating the producer", exc)
            self._restart(first)
            return BatchStatus.PRODUCER_RESTARTED
        aborted = self._clock()
        self._rewind(first)
        # what a failed batch cost its partitions beyond the failure itself (the partition campaign reads it)
        log.info("aborted in %.2fs, %d partition(s) rewound to their committed offsets in %.2fs",
                 aborted - started, len(first), self._clock() - aborted)
        return BatchStatus.ABORTED

    def _restart(self, first: dict[tuple[str, int], int]) -> None:
        self.producer_restarts += 1
        self._observer.producer_restarted()
        # init_transactions() aborts (or completes) whatever the old producer left open; retried until the
        # broker answers, False if stopped first (the caller's loop then ends; nothing to rewind).
        if self.producer.restart():
            self._rewind(first)

    def _rewind(self, first: dict[tuple[str, int], int]) -> None:
        rewind(self.consumer, first, self._stop)
        if self._on_rewind is not None and first:
            self._on_rewind(list(first))


def start_producer(config: dict[str, Any], stop: threading.Event, factory: Callable[[dict[str, Any]], Any] | None = None,
                   limits: EosLimits = EosLimits(), patience_s: float | None = 60.0) -> TransactionalProducer:
    """A started ``TransactionalProducer`` (``init_transactions`` done: earlier holders of the id are fenced).

    If ``stop`` is set before the broker answered, the producer is returned unstarted (the caller's
    ``while not stop.is_set()`` loop then does nothing); ``KafkaUnavailable`` after ``patience_s``.
    """
    if factory is None:
        from sie.kernel.clients import KafkaClients

        factory = KafkaClients().producer
    producer = TransactionalProducer(config, factory, limits.attempts, limits.backoff_s, stop, limits.hang_limit_s)
    producer.start(patience_s=patience_s)
    return producer
