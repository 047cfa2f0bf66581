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

import gc
import operator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)  # a Prepared[X] is a Prepared[X | None]: it is only read

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


@dataclass(slots=True, frozen=True)
class Prepared(Generic[T_co]):
    """A prepared batch: the outputs to produce (in order) and the stage's own summary of them
    (handed back to the stage's ``committed`` only if the transaction commits)."""

    outputs: list[Output] = field(default_factory=list)
    value: T_co | None = None


_read_headers = operator.methodcaller("headers")

#: what an undecodable header list is replaced with on its message
_UNDECODABLE = ("sie.headers.dropped", b"the record's headers could not be decoded (a key is not UTF-8)")


def safe_headers(msg: Any) -> Headers | None:
    """``msg.headers()``, or None when they cannot be decoded; a dead letter then carries
    ``sie.headers.dropped`` instead of the originals.

    confluent-kafka (2.16) turns a header key that is not UTF-8 into a tuple with a NULL item, returned
    WITH an exception set.  Called as ``msg.headers()`` in a warm loop, CPython 3.11's specialised call
    path skips the check for that and hands the broken list over (the exception then surfaces in some
    later, unrelated call); later calls return the cached list; touching the NULL item crashes the
    interpreter.  So: the call goes through ``operator.methodcaller`` (the generic call path always
    checks, so ``SystemError`` is raised here), every tuple is checked without touching its items
    (``gc.get_referents`` skips NULL slots), and a broken list is replaced on the message (the old one
    is freed safely) so that no later reader of this message can meet it.
    """
    try:
        headers = _read_headers(msg)
    except (SystemError, UnicodeDecodeError, ValueError):
        msg.set_headers([_UNDECODABLE])
        return None
    if not headers:
        return []
    for item in headers:
        if type(item) is not tuple or len(gc.get_referents(item)) != len(item):
            msg.set_headers([_UNDECODABLE])
            return None
    if headers[0] == _UNDECODABLE:  # replaced by an earlier read
        return None
    return list(headers)
