"""The exactly-once batch cycle (KIP-447 consume-transform-produce), written once for every stage.

One batch::

    prepared = prepare(batch)    # OUTSIDE the transaction: parse, validate, infer, build every output
    txn.begin()
    txn.produce(each output)     # a record the producer refuses alone -> its dead letter, fitted
    txn.track_batch(batch)       # offsets = last record of each partition + 1
    txn.commit()                 # offsets + outputs atomically (read_committed readers)

Preparing first keeps the broker-side transaction (it starts with the first produced record) as short as
producing and committing, whatever the inference time; and a dependency that is down (``RetryLater``)
is found before anything was produced.

Failure -> what happens (the batch is never half-visible):

* ``TxnAbortable``  -> ``abort_transaction()``, rewind to the committed offsets, the batch is read again;
* ``ProducerFatal`` -> re-create the producer (``init_transactions`` fences/aborts the old one), rewind;
  ``fatal_limit`` in a row -> ``Fenced`` (almost always two live processes sharing one
  ``transactional.id``).  ``ProducerHung`` (a call that never answered: broker down) is re-created the
  same way but is not counted: re-creation retries until the broker is back, or ``stop`` is set;
* ``RetryLater`` (e.g. the scorer's ``BackendUnavailable``) while preparing -> rewind, back off (doubling,
  capped), and the same records come again: an outage never becomes dead letters;
* ``RecordRejected`` (one output too large for ``message.max.bytes``, an unknown partition) -> the stage's
  ``rejected`` hook turns it into a dead letter, fitted to the limit (``deadletter.fit``; at worst
  ``deadletter.minimal``): one poison record never aborts its batch in a loop.

Users: the scorer and the CDC stage (through ``stage.StreamLoop``) and backfill (its own assign()-based
loop); the control-plane leader uses the same ``TransactionalProducer`` for producer-only transactions.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sie.streams.eos.deadletter import DEAD_LETTER, fit, minimal
from sie.streams.eos.errors import Fenced, ProducerFatal, ProducerHung, RecordRejected, RetryLater, TxnAbortable
from sie.streams.eos.records import Output, Prepared
from sie.streams.eos.transaction import Checkpoint, TransactionalProducer, rewind

#: ``rejected(output, detail, value)``: the replacement (a dead letter) of an output the producer refused
Rejected = Callable[[Output, str, Any], Output]

log = logging.getLogger("sie.eos")

T = TypeVar("T")


class BatchStatus(str, enum.Enum):
    """How one ``run_batch`` ended; only ``COMMITTED`` made anything visible."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    PRODUCER_RESTARTED = "producer_restarted"
    BACKED_OFF = "backed_off"


@dataclass(frozen=True)
class EosLimits:
    """Knobs of the cycle: retries of one Kafka call, fatal-error tolerance, backoff of ``RetryLater``,
    and how long a hung transaction call is waited for before its producer is abandoned."""

    attempts: int = 8
    backoff_s: float = 0.1
    fatal_limit: int = 5
    retry_later_max_s: float = 5.0
    hang_limit_s: float = 25.0


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
    """The batch cycle over one transactional producer and one consumer (module docstring)."""

    def __init__(self, producer: TransactionalProducer, consumer: Any, stop: threading.Event,
                 limits: EosLimits = EosLimits(), *, observer: EosObserver | None = None,
                 fenced_hint: str = "give every instance a distinct --instance (or stop the other job)",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.producer = producer
        self.consumer = consumer
        self._stop = stop
        self._limits = limits
        self._observer: EosObserver = observer or _NoObserver()
        self._fenced_hint = fenced_hint
        self._clock = clock
        self._fatal_streak = 0
        self._retry_delay = limits.backoff_s
        self.aborts = 0
        self.producer_restarts = 0
        self.backoffs = 0
        #: seconds the last committed batch spent in ``Checkpoint.commit`` (offsets + commit round trips)
        self.last_commit_s = 0.0

    def run_batch(self, batch: list[Any], prepare: Callable[[list[Any]], Prepared[T]],
                  rejected: Rejected | None = None) -> tuple[BatchStatus, T | None]:
        """Prepare ``batch``, then produce its outputs and commit in one transaction (module docstring);
        returns the prepared value only if the transaction committed."""
        txn = Checkpoint(self.producer, self.consumer)
        try:
            prepared = prepare(batch)
        except RetryLater as exc:
            log.error("%s; retrying the batch in %.1fs", exc, self._retry_delay)
            self.backoffs += 1
            self._observer.retry_later(exc)
            txn.track_batch(batch)  # nothing was produced: only the consumer goes back
            rewind(self.consumer, txn.first_offsets(), self._stop)
            self._stop.wait(self._retry_delay)
            self._retry_delay = min(self._retry_delay * 2, self._limits.retry_later_max_s)
            return BatchStatus.BACKED_OFF, None
        try:
            txn.begin()
            for out in prepared.outputs:
                self._produce(txn, out, rejected, prepared.value)
            txn.track_batch(batch)
            commit_started = self._clock()
            txn.commit()
            self.last_commit_s = self._clock() - commit_started
        except TxnAbortable as exc:
            log.warning("transaction aborted: %s", exc)
            self._abort(txn)
            return BatchStatus.ABORTED, None
        except ProducerFatal as exc:
            if not isinstance(exc, ProducerHung):  # a hang means "broker down", not "fenced"
                self._fatal_streak += 1
            if self._fatal_streak >= self._limits.fatal_limit:
                raise Fenced(
                    f"transactional.id {self.producer.transactional_id}: {self._fatal_streak} fatal producer "
                    f"errors in a row (last: {exc}); another live process probably uses the same id: "
                    f"{self._fenced_hint}") from exc
            log.error("producer unusable (%s); re-creating it", exc)
            self._restart(txn)
            return BatchStatus.PRODUCER_RESTARTED, None
        self._fatal_streak = 0
        self._retry_delay = self._limits.backoff_s
        return BatchStatus.COMMITTED, prepared.value

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

    def _abort(self, txn: Checkpoint) -> None:
        self.aborts += 1
        self._observer.aborted()
        try:
            self.producer.abort()
        except ProducerFatal as exc:
            log.error("abort failed (%s); re-creating the producer", exc)
            self._restart(txn)
            return
        rewind(self.consumer, txn.first_offsets(), self._stop)

    def _restart(self, txn: Checkpoint) -> None:
        self.producer_restarts += 1
        self._observer.producer_restarted()
        # init_transactions() aborts (or completes) whatever the old producer left open; retried until the
        # broker answers, False if stopped first (the caller's loop then ends; nothing to rewind).
        if self.producer.restart():
            rewind(self.consumer, txn.first_offsets(), self._stop)


def start_producer(config: dict[str, Any], stop: threading.Event, factory: Callable[[dict[str, Any]], Any] | None = None,
                   limits: EosLimits = EosLimits(), patience_s: float | None = 60.0) -> TransactionalProducer:
    """A started ``TransactionalProducer`` (``init_transactions`` done: earlier holders of the id are fenced).

    If ``stop`` is set before the broker answered, the producer is returned unstarted (the caller's
    ``while not stop.is_set()`` loop then does nothing); ``KafkaUnavailable`` after ``patience_s``.
    """
    if factory is None:
        from confluent_kafka import Producer as factory  # noqa: N813 - the librdkafka class is the factory
    producer = TransactionalProducer(config, factory, limits.attempts, limits.backoff_s, stop, limits.hang_limit_s)
    producer.start(patience_s=patience_s)
    return producer
