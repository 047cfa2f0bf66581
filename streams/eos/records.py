"""What a stage hands the exactly-once layer: the records to write for one batch, prepared OUTSIDE the
transaction.

A stage's ``prepare(batch)`` parses, validates, runs inference and builds every output record before
anything is produced; only then does the layer open the transaction, produce them and commit.  So the
broker-side transaction (it starts with the first produced record) lasts as long as producing and
committing, whatever the inference time: a slow model cannot push a batch past ``transaction.timeout.ms``.

``safe_headers`` reads a consumed record's headers without trusting them: confluent-kafka raises
``SystemError`` on a header key that is not UTF-8, and one such record must not crash a stage.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Headers = list[tuple[str, bytes]]


@dataclass(slots=True)
class Output:
    """One record to produce in the batch's transaction; ``source`` is the consumed record it answers."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int = -1
    headers: Headers | None = None
    source: Any = None
    #: what the record is to its stage ("result", "expired", "request", ...); "dead_letter" is reserved
    #: for dead letters, which the layer never hands back to the stage's ``rejected`` hook
    kind: str = ""

    def size(self) -> int:
        """Bytes of key, value and headers (what counts against the producer's ``message.max.bytes``,
        less librdkafka's per-record framing, which ``deadletter.RECORD_OVERHEAD`` covers)."""
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(k.encode()) + len(v or b"") for k, v in self.headers or ()))


@dataclass(slots=True)
class Prepared(Generic[T]):
    """A prepared batch: the outputs to produce (in order) and the stage's own summary of them
    (handed back to the stage's ``committed`` only if the transaction commits)."""

    outputs: list[Output] = field(default_factory=list)
    value: T | None = None


#: ``msg.headers()`` through a call CPython checks.  On a non-UTF-8 key confluent-kafka's ``headers()`` returns
#: a half-built list (a NULL where the key should be) WITH an exception set; the generic call path turns that
#: into ``SystemError``, but a warm call site specialised by CPython 3.11+ skips the check and hands the
#: broken list on: the next access segfaults the stage (seen once a scorer had dead-lettered a few records).
_read_headers = operator.methodcaller("headers")


def safe_headers(msg: Any) -> Headers | None:
    """``msg.headers()``, or None when they cannot be decoded (a non-UTF-8 key: confluent-kafka raises
    ``SystemError``); a dead letter then carries ``sie.headers.dropped`` instead of the originals."""
    try:
        headers = _read_headers(msg)
    except (SystemError, UnicodeDecodeError, ValueError):
        try:  # the message caches the half-built list: a later headers() would return it without an error
            msg.set_headers([])
        except Exception:  # a message type without set_headers (test doubles) has no such cache
            pass
        return None
    return list(headers) if headers else []
