"""Named error classes of the scorer, one per outcome.

* ``DeadLetterReason`` is not an exception: a poison record is data, it goes to
  the dead-letter topic inside the batch's transaction and is never retried.
* ``TxnAbortable``: the open transaction must be aborted and the batch
  re-read from the last committed offsets (nothing was committed).
* ``ProducerFatal``: the transactional producer is unusable (fenced, fatal
  idempotence error); re-create it, then re-read from the committed offsets.
  ``ProducerHung`` is the case of a call that never answered (broker down).
* ``BackendUnavailable``: the model failed on every row *and* on a known-good
  probe row: an outage, not poison.  The batch is aborted and retried later,
  never dead-lettered.
* ``ScorerFenced``: fatal errors keep coming back: almost always two live
  scorers sharing one ``transactional.id``.  The process stops with a reason.
"""

from __future__ import annotations

import enum

from sie.kernel.errors import SieError


class DeadLetterReason(str, enum.Enum):
    """Value of the ``sie.reason`` header of a dead letter."""

    INVALID_JSON = "invalid_json"
    SCHEMA_VIOLATION = "schema_violation"
    TOO_LARGE = "too_large"
    EXPIRED = "expired"
    INFERENCE_ERROR = "inference_error"


class ScorerError(SieError):
    """Base of the scorer's errors."""


class TxnAbortable(ScorerError):
    """The current transaction must be aborted; its records will be read again."""


class ProducerFatal(ScorerError):
    """The transactional producer must be closed and re-created."""


class ProducerHung(ProducerFatal):
    """A transaction call gave no answer in time (coordinator down, librdkafka #5456).

    Handled like any fatal error (the producer is abandoned and re-created), but it is
    a symptom of an unreachable broker, not of fencing: it does not count towards the
    "another live process uses our transactional.id" limit.
    """


class BackendUnavailable(ScorerError):
    """The backend fails even on a known-good row: retry the batch later."""


class ScorerFenced(ScorerError):
    """Repeated fatal producer errors: another live scorer uses our transactional.id."""
