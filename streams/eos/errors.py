"""Named outcomes of the exactly-once layer, one class per way a batch can fail.

* ``TxnAbortable``: the open transaction must be aborted and the batch re-read from the
  committed offsets (nothing of it was committed).
* ``ProducerFatal``: the transactional producer is unusable (fenced, fatal idempotence
  error); it is re-created (``init_transactions`` fences its predecessor), then the batch
  is re-read.  ``ProducerHung`` is the case of a call that never answered (broker down):
  handled the same way, but not counted as evidence of a second live process.
* ``RetryLater``: a dependency of the stage (e.g. the scorer's model backend) is down, not
  the data: abort, back off, retry the same batch.  Never turned into dead letters.
* ``Fenced``: SIE's one "someone else owns this transactional id" error: fatal errors keep
  coming back after re-creation (two live processes share an id), or a control-plane
  instance that lost leadership tried to write.  The process (or leadership) stops.
* ``ConsumerFatal``: librdkafka reported a fatal consumer error; the stage must restart.
* ``RecordRejected``: the producer refused ONE record (too large for ``message.max.bytes``, a partition
  that does not exist): not a transaction failure.  The layer replaces that record by a dead letter that
  fits, in the same transaction, so the batch commits instead of aborting in a loop.
"""

from __future__ import annotations

from sie.kernel.errors import SieError


class EosError(SieError):
    """Base of the exactly-once layer's errors."""


class TxnAbortable(EosError):
    """The current transaction must be aborted; its records will be read again."""


class ProducerFatal(EosError):
    """The transactional producer must be closed and re-created."""


class OutcomeUnknown(ProducerFatal):
    """Whether the open transaction committed is unknown (module docstring: the one rule).

    Handled like a fatal error (the producer is closed and re-created, the positions are read back from the
    broker), but it is a symptom of an unreachable or slow broker, not of fencing: it does not count towards
    the "another live process uses our transactional.id" limit.
    """


class ProducerHung(OutcomeUnknown):
    """A transaction call gave no answer in time (coordinator down, librdkafka #5456): an unknown outcome."""


class RetryLater(EosError):
    """A dependency is down, not the data: abort, back off, retry the batch (never dead-letter it)."""


class Fenced(EosError):
    """Another live process owns this transactional id (or this instance no longer leads)."""


class ConsumerFatal(EosError):
    """The consumer reported a fatal error; restart the stage."""


class RecordRejected(EosError):
    """The producer refused one record at ``produce()``; the transaction itself is still usable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
