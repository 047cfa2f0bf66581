"""The in-flight window: every consumed record not yet committed, per partition, in offset order.

A record enters when it is consumed (``add``) and is *finished* once its outputs are known (a result,
or a dead letter).  Generations finish in any order; what may be committed is only each partition's
**contiguous finished prefix** (``take_ready``): committing offset ``o + 1`` says every record up to
``o`` is answered, so a result for a record beyond an unfinished one is held back until the hole fills.
Producing it earlier would be wrong: after a crash the consumer restarts at the hole and answers the
held record again (a duplicate).

Each partition has an *epoch*, bumped whenever its records are dropped (revoked, lost, or a reset after
a failed transaction): a generation that finishes for an old epoch is ignored (``finish`` -> False);
its record is read again from the committed offset and answered then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TP = tuple[str, int]


@dataclass(slots=True)
class Entry:
    """One record in the window; ``outputs`` is None until it is finished."""

    msg: Any
    epoch: int
    outputs: list[Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Window:
    """Records in flight per partition (module docstring).  Used by the stage's thread only."""

    def __init__(self) -> None:
        self._parts: dict[TP, OrderedDict[int, Entry]] = {}
        self._epochs: dict[TP, int] = {}
        self.size = 0
        self.finished = 0

    def epoch(self, tp: TP) -> int:
        return self._epochs.get(tp, 0)

    def add(self, msg: Any) -> Entry:
        tp = (msg.topic(), msg.partition())
        entry = Entry(msg, self.epoch(tp))
        self._parts.setdefault(tp, OrderedDict())[msg.offset()] = entry
        self.size += 1
        return entry

    def get(self, tp: TP, offset: int, epoch: int) -> Entry | None:
        """The unfinished entry of a record of the current epoch, else None."""
        if epoch != self.epoch(tp):
            return None
        entry = self._parts.get(tp, {}).get(offset)  # type: ignore[call-overload]
        return entry if entry is not None and entry.outputs is None else None

    def finish(self, tp: TP, offset: int, epoch: int, outputs: list[Any], info: dict[str, Any] | None = None) -> bool:
        """Record ``outputs`` for a record; False if it belongs to a dropped epoch (then ignored)."""
        if epoch != self.epoch(tp):
            return False
        entry = self._parts.get(tp, {}).get(offset)  # type: ignore[call-overload]
        if entry is None or entry.outputs is not None:
            return False
        entry.outputs = outputs
        if info:
            entry.info = info
        self.finished += 1
        return True

    def count(self, topic: str) -> int:
        """Records of ``topic`` in the window (finished or not)."""
        return sum(len(entries) for tp, entries in self._parts.items() if tp[0] == topic)

    def pending(self, topic: str) -> dict[int, int]:
        """Records of ``topic`` in the window (read, not committed) per partition."""
        return {tp[1]: len(entries) for tp, entries in self._parts.items() if tp[0] == topic and entries}

    def ready(self) -> int:
        """How many records ``take_ready`` would return now."""
        n = 0
        for entries in self._parts.values():
            for entry in entries.values():
                if entry.outputs is None:
                    break
                n += 1
        return n

    def take_ready(self) -> list[Entry]:
        """Remove and return every partition's contiguous finished prefix (partition order, then offset)."""
        out: list[Entry] = []
        for entries in self._parts.values():
            while entries:
                offset, entry = next(iter(entries.items()))
                if entry.outputs is None:
                    break
                del entries[offset]
                out.append(entry)
        self.size -= len(out)
        self.finished -= len(out)
        return out

    def first_offsets(self) -> dict[TP, int]:
        """The oldest uncommitted offset per partition (where a rewind falls back to if none is committed)."""
        return {tp: next(iter(entries)) for tp, entries in self._parts.items() if entries}

    def drop(self, tps: Iterable[TP]) -> int:
        """Forget the records of ``tps`` (their generations finishing later are ignored); returns how many."""
        dropped = 0
        for tp in tps:
            entries = self._parts.pop(tp, None)
            self._epochs[tp] = self.epoch(tp) + 1
            if entries:
                dropped += len(entries)
                self.finished -= sum(1 for e in entries.values() if e.outputs is not None)
        self.size -= dropped
        return dropped

    def reset(self) -> int:
        """Forget everything (after a transaction failed: the committed offsets are the truth again)."""
        return self.drop(list(self._parts))
