"""A generic exactly-once consume-transform-produce cycle (KIP-447), for any stage that is not the scorer.

The transaction *primitives* already exist in ``sie.streams.eos.transaction``
(``TransactionalProducer``: one ``transactional.id``, the retriable/abortable/fatal
error policy; ``Checkpoint``: one batch = one transaction, offsets = last processed + 1
sent with the consumer's group metadata; ``rewind``: seek back to the committed
offsets).  They are reused here unchanged.  What the scorer keeps inside its own
``Scorer.run`` is the *cycle* around them (what to do after each kind of failure);
``ExactlyOnce.run_batch`` is that cycle written once, so the CDC stage and the
backfill job do not each grow a copy.  The scorer could move onto it too.

One batch::

    txn = Checkpoint(producer, consumer)
    txn.begin()
    process(batch, txn)          # txn.track(...) every record, txn.produce(...) outputs
    txn.commit()                 # offsets + outputs atomically (read_committed readers)

Failure -> what happens (the batch is never half-visible):

* ``TxnAbortable``  -> ``abort_transaction()``, rewind to the committed offsets, the batch is read again;
* ``ProducerFatal`` -> re-create the producer (``init_transactions`` fences/aborts the old one), rewind;
  ``fatal_limit`` in a row -> ``TransactionFenced`` (almost always two live processes sharing one
  ``transactional.id``).  ``ProducerHung`` (a call that never answered: broker down) is re-created the
  same way but is not counted: re-creation retries until the broker is back, or ``stop`` is set;
* ``RetryLater`` (e.g. the scorer's ``BackendUnavailable``) -> abort, rewind, back off (doubling, capped).
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from sie.kernel.errors import SieError
from sie.streams.scorer.errors import BackendUnavailable, ProducerFatal, ProducerHung, TxnAbortable
from sie.streams.eos.transaction import Checkpoint, TransactionalProducer, rewind
from sie.streams.eos.transaction import close_quietly as _close_quietly

log = logging.getLogger("sie.eos")

T = TypeVar("T")

# Exceptions after which a batch is aborted and retried after a backoff (a dependency is down, not the data).
RetryLater = (BackendUnavailable,)


class TransactionFenced(SieError):
    """Fatal producer errors keep coming back: another live process uses our ``transactional.id``."""


class BatchStatus(str, enum.Enum):
    """How one ``run_batch`` ended; only ``COMMITTED`` made anything visible."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    PRODUCER_RESTARTED = "producer_restarted"
    BACKED_OFF = "backed_off"


@dataclass(frozen=True)
class EosLimits:
    """Knobs of the cycle: retries of one Kafka call, fatal-error tolerance, backoff of ``RetryLater``."""

    attempts: int = 8
    backoff_s: float = 0.1
    fatal_limit: int = 5
    retry_later_max_s: float = 5.0


class ExactlyOnce:
    """The batch cycle over one transactional producer and one consumer (module docstring)."""

    def __init__(self, producer: TransactionalProducer, consumer: Any, stop: threading.Event,
                 limits: EosLimits = EosLimits()) -> None:
        self.producer = producer
        self.consumer = consumer
        self._stop = stop
        self._limits = limits
        self._fatal_streak = 0
        self._retry_delay = limits.backoff_s
        self.aborts = 0
        self.producer_restarts = 0

    def run_batch(self, batch: list[Any], process: Callable[[list[Any], Checkpoint], T]) -> tuple[BatchStatus, T | None]:
        """``process`` inside one transaction; returns its value only if the transaction committed."""
        txn = Checkpoint(self.producer, self.consumer)
        try:
            txn.begin()
            value = process(batch, txn)
            txn.commit()
        except TxnAbortable as exc:
            log.warning("transaction aborted: %s", exc)
            self._abort(txn)
            return BatchStatus.ABORTED, None
        except RetryLater as exc:
            log.error("%s; retrying the batch in %.1fs", exc, self._retry_delay)
            self._abort(txn)
            self._stop.wait(self._retry_delay)
            self._retry_delay = min(self._retry_delay * 2, self._limits.retry_later_max_s)
            return BatchStatus.BACKED_OFF, None
        except ProducerFatal as exc:
            if not isinstance(exc, ProducerHung):  # a hang means "broker down", not "fenced"
                self._fatal_streak += 1
            if self._fatal_streak >= self._limits.fatal_limit:
                raise TransactionFenced(
                    f"transactional.id {self.producer.transactional_id}: {self._fatal_streak} fatal producer "
                    f"errors in a row (last: {exc}); another live process probably uses the same id: give every "
                    f"instance a distinct --instance (or stop the other job)") from exc
            log.error("producer unusable (%s); re-creating it", exc)
            self._restart(txn)
            return BatchStatus.PRODUCER_RESTARTED, None
        self._fatal_streak = 0
        self._retry_delay = self._limits.backoff_s
        return BatchStatus.COMMITTED, value

    def _abort(self, txn: Checkpoint) -> None:
        self.aborts += 1
        try:
            self.producer.abort()
        except ProducerFatal as exc:
            log.error("abort failed (%s); re-creating the producer", exc)
            self._restart(txn)
            return
        rewind(self.consumer, txn.first_offsets(), self._stop)

    def _restart(self, txn: Checkpoint) -> None:
        self.producer_restarts += 1
        # init_transactions() aborts (or completes) whatever the old producer left open; retried until the
        # broker answers, False if stopped first (the caller's loop then ends; nothing to rewind).
        if self.producer.restart():
            rewind(self.consumer, txn.first_offsets(), self._stop)


def start_producer(config: dict[str, Any], stop: threading.Event, factory: Callable[[dict], Any] | None = None,
                   limits: EosLimits = EosLimits(), patience_s: float = 60.0) -> TransactionalProducer:
    """A started ``TransactionalProducer`` (``init_transactions`` done: earlier holders of the id are fenced).

    If ``stop`` is set before the broker answered, the producer is returned unstarted (the caller's
    ``while not stop.is_set()`` loop then does nothing); ``KafkaUnavailable`` after ``patience_s``.
    """
    if factory is None:
        from confluent_kafka import Producer as factory  # noqa: N813 - the librdkafka class is the factory
    producer = TransactionalProducer(config, factory, limits.attempts, limits.backoff_s, stop)
    producer.start(patience_s=patience_s)
    return producer


def close_quietly(consumer: Any, producer: TransactionalProducer | None) -> None:
    """Close the consumer (leaves the group: partitions move at once), then the producer; never raises.

    Bounded: a ``Consumer.close()`` stuck on an unreachable coordinator is abandoned (see transaction.py).
    """
    _close_quietly(consumer, producer, log)
