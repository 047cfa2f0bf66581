"""Policy ``delay``, Kafka-native: a caller over its quota that holds too much of the window has its held
requests MOVED to the model's deferred topic (``Names.llm_deferred_topic``), like a retry topic.

Why: the window (``sie.streams.llm.window``) holds at most ``max_pending`` records of the request
partitions.  A caller's backlog larger than that fills it with held records, and the other callers'
records sit behind it *in Kafka*, in the same partitions: they wait whatever the fair queue decides.
Moving the held records out of the request partitions lets the consumer reach the records behind them.

How a record moves, exactly once: it is *finished* in the window with one output, a copy of it (value
and key unchanged) for the deferred topic with its origin in ``sie.deferred.*`` headers (``Origin``).
The window's commit rule is unchanged: the copy is produced in the SAME transaction that commits the
request partition's offset past it.  So the request is either still uncommitted in its partition (a
crash, an abort: it is read again and decided again) or committed there *and* in the deferred topic,
never both visible as work and never lost (the deferred topic is read ``read_committed``).

The stage consumes the deferred topic with the same consumer and group as the request topic.  A
deferred record is parsed with its origin's coordinates and timestamp (so its default id, its result's
``source``, its ``queue_ms``/expiry and its dead letter's ``sie.source.*`` are the original request's),
held in its caller's queue like any request and sent only when its caller's quota allows and not before
``sie.deferred.not_before_ms``; it is committed, in the deferred partition, with its result.  Bounds:

* ``defer_over`` / ``defer_after_s``: a caller is moved out when its quota says wait AND it holds more
  than ``defer_over`` requests of the request partitions, or its oldest one waited ``defer_after_s``;
* ``deferred_window``: at most this many deferred records are in the window (beyond it the deferred
  partitions are paused), so deferred records can never fill the window for the request partitions;
* a deferred record is never deferred again: it is held in the window until its quota allows (the
  re-deferral bound is 0).  The window's limits still apply to it when the window is full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sie.streams.eos.records import Headers

PREFIX = "sie.deferred."
_FIELDS = ("topic", "partition", "offset", "timestamp_ms", "caller", "not_before_ms")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a deferred record came from, and the earliest wall-clock time (ms) it may be sent."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    caller: str
    not_before_ms: int

    def headers(self, original: Iterable[tuple[str, Any]] | None) -> Headers:
        """The deferred copy's headers: the original's (less any older ``sie.deferred.*``) + the origin."""
        kept: Headers = [(k, v) for k, v in original or () if not k.startswith(PREFIX)]
        ts = "" if self.timestamp_ms is None else str(self.timestamp_ms)
        values = (self.topic, str(self.partition), str(self.offset), ts, self.caller[:200], str(self.not_before_ms))
        return kept + [(PREFIX + name, v.encode()) for name, v in zip(_FIELDS, values, strict=True)]

    @classmethod
    def read(cls, headers: Iterable[tuple[str, Any]] | None) -> Origin | None:
        """The origin in a deferred record's headers; None when absent or malformed (never raises)."""
        found = {k[len(PREFIX):]: v for k, v in headers or () if k.startswith(PREFIX) and isinstance(v, bytes)}
        try:
            got = {name: found[name].decode() for name in _FIELDS}
            return cls(got["topic"], int(got["partition"]), int(got["offset"]),
                       int(got["timestamp_ms"]) if got["timestamp_ms"] else None, got["caller"],
                       int(got["not_before_ms"]))
        except (KeyError, ValueError, UnicodeDecodeError):
            return None


class AtOrigin:
    """A consumed deferred record seen at its origin's coordinates (for its dead letter: ``sie.source.*``
    name the request partition and offset, as for any request)."""

    __slots__ = ("_msg", "_origin")

    def __init__(self, msg: Any, origin: Origin) -> None:
        self._msg, self._origin = msg, origin

    def topic(self) -> str:
        return self._origin.topic

    def partition(self) -> int:
        return self._origin.partition

    def offset(self) -> int:
        return self._origin.offset

    def key(self) -> Any:
        return self._msg.key()

    def value(self) -> Any:
        return self._msg.value()

    def headers(self) -> Any:
        return self._msg.headers()

    def set_headers(self, headers: Any) -> None:
        self._msg.set_headers(headers)

    def timestamp(self) -> tuple[int, int]:
        return self._msg.timestamp()


@dataclass(frozen=True)
class DeferPolicy:
    """When a caller's held requests move to the deferred topic (module docstring)."""

    over: int
    after_s: float
    window: int

    def callers(self, held: Mapping[str, tuple[int, float]], wait_s: Callable[[str], float], now: float) -> list[str]:
        """The callers to move out now: ``held`` maps a caller to (its held requests of the request
        partitions, when the oldest of them was held); only a caller whose quota says wait moves."""
        return [c for c, (count, since) in held.items()
                if count and (count > self.over or now - since >= self.after_s) and wait_s(c) > 0]
