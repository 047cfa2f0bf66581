"""Named outcomes of the scorer (the transaction-level ones live in ``sie.streams.eos.errors``).

* ``DeadLetterReason`` is not an exception: a poison record is data, it goes to
  the dead-letter topic inside the batch's transaction and is never retried.
* ``BackendUnavailable``: the model failed on every row *and* on a known-good
  probe row: an outage, not poison.  A ``RetryLater``: the batch is aborted and
  retried after a backoff, never dead-lettered.
* ``VersionLost``: a version served from a process of its own during a rollout (a *companion* version,
  ``sie.workers.versions``) died or stopped answering mid-call.  Neither poison nor an outage of the
  replica: no other version answers its rows (a key's version is its bucket's, never another's); the
  batch is refused with ``VersionsNotReady`` and the replica hands its partitions to the others until the
  version is ready again, and the version is reported unavailable to the control plane.
* ``VersionsNotReady``: a version the replica's routing table names cannot answer here now (loading,
  lost, failed).  A ``RetryLater``: nothing of the batch is produced; the replica leaves its consumer group
  until every version is ready (``sie.streams.eos.stage``, ``serving``).
"""

from __future__ import annotations

import enum

from sie.kernel.errors import SieError
from sie.streams.eos.errors import RetryLater


class DeadLetterReason(str, enum.Enum):
    """Value of the ``sie.reason`` header of a dead letter."""

    INVALID_JSON = "invalid_json"
    SCHEMA_VIOLATION = "schema_violation"
    TOO_LARGE = "too_large"
    EXPIRED = "expired"
    INFERENCE_ERROR = "inference_error"
    RESULT_TOO_LARGE = "result_too_large"  # the result (request metadata copied in) exceeds the record limit
    OUTPUT_VIOLATION = "output_violation"  # the model's output breaks spec.outputSchema (a type, a range, a field)


class ScorerError(SieError):
    """Base of the scorer's own errors."""


class BackendUnavailable(RetryLater, ScorerError):
    """The backend fails even on a known-good row: retry the batch later."""


class VersionLost(ScorerError):
    """A companion version's process died or hung mid-call (module docstring); never bisected, never retried
    against the same process, never answered by another version."""

    def __init__(self, version: str, detail: str) -> None:
        super().__init__(f"version {version}: {detail}")
        self.version = version
        self.detail = detail


class VersionsNotReady(RetryLater, ScorerError):
    """A version this replica's routing table names cannot answer here now: the batch is refused (nothing of it
    produced) and the replica holds no partitions until the version is ready (module docstring)."""
