"""Policy ``delay``: requests held in the window for their caller's quota, released fairly.

Every request of a model with ``quotas.policy: delay`` enters its caller's queue here (in offset order
per caller) and stays an *unfinished* record of the window (``sie.streams.llm.window``) until it is
sent: it is never dropped or dead-lettered, and the commit rule is unchanged (a held record holds back
its partition's prefix, only while it is held).  ``release(room)`` runs on the stage's thread every
loop turn and hands out up to ``room`` requests (the stage keeps about C submitted and not yet taken by
a worker, so the workers never idle and the order below decides who goes next):

* **round robin over callers** whose quota allows a request now (``Quotas.wait_s`` is 0): one request
  per caller per turn, so a caller with a deep backlog cannot push the others' requests back; a caller
  over its quota is skipped until its buckets refill, and does not delay anyone else's turn;
* **limits** on how long held requests may hold the window: a caller whose oldest held request waited
  ``max_delay_s`` (default 10 s), and every caller while more than ``max_delayed`` (default half of
  ``max_pending``) are held in all or the window is full, takes part in the round robin *over* its quota (counted: ``overrun``;
  the bucket's debt then delays its later requests further).  It still gets one turn per round like any
  other caller and only within ``room``, so going over quota never pushes the others' requests back;
  what the limits bound is how long held records hold the window: without them one throttled caller
  could fill the window with held records and finished records behind them, and consumption would
  pause for everyone.

Records of a partition that left the window (revoke, reset: a new epoch) are forgotten (``drop``).

A *deferred* request (read back from the model's deferred topic, ``sie.streams.llm.defer``) is held the
same way but is due only when its caller's quota allows and its ``not_before`` passed (or the window is
full): the ``max_delay_s`` / ``max_delayed`` limits count only requests of the request partitions, since
deferred ones are bounded apart (``deferred_window``) and cannot hold the request partitions back.
``take_fresh`` hands a caller's held requests of the request partitions to the stage to be deferred.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from sie.streams.llm.dispatch import Job
from sie.streams.llm.quota import Quotas


@dataclass(slots=True)
class Held:
    job: Job
    caller: str
    since: float
    deferred: bool = False  # read back from the deferred topic
    not_before: float = 0.0  # clock time before which it is not sent (deferred only)


@dataclass(slots=True)
class Released:
    job: Job
    caller: str
    estimate: float  # tokens charged up front (Quotas.take); the stage passes it back to Quotas.charge
    overrun: bool  # sent at a limit while its caller was over quota


class FairQueue:
    """Per-caller queues of held requests (module docstring).  Used by the stage's thread only."""

    def __init__(self, quotas: Quotas, max_delay_s: float, max_delayed: int, clock: Callable[[], float]) -> None:
        self._quotas = quotas
        self.max_delay_s = max_delay_s
        self.max_delayed = max(1, max_delayed)
        self._clock = clock
        self._queues: OrderedDict[str, deque[Held]] = OrderedDict()  # the round robin's order
        self.size = 0
        self.fresh = 0  # held requests of the request partitions (not deferred)
        self.overruns = 0

    def hold(self, job: Job, caller: str, deferred: bool = False, not_before: float = 0.0) -> None:
        self._queues.setdefault(caller, deque()).append(Held(job, caller, self._clock(), deferred, not_before))
        self.size += 1
        self.fresh += not deferred

    def fresh_held(self) -> dict[str, tuple[int, float]]:
        """Per caller: its held requests of the request partitions and when the oldest was held."""
        out: dict[str, tuple[int, float]] = {}
        for caller, queue in self._queues.items():
            fresh = [h.since for h in queue if not h.deferred]
            if fresh:
                out[caller] = (len(fresh), min(fresh))
        return out

    def take_fresh(self, caller: str) -> list[Held]:
        """Remove and return ``caller``'s held requests of the request partitions (they are deferred)."""
        queue = self._queues.get(caller)
        if not queue:
            return []
        taken = [h for h in queue if not h.deferred]
        kept = deque(h for h in queue if h.deferred)
        if kept:
            self._queues[caller] = kept
        else:
            del self._queues[caller]
        self.size -= len(taken)
        self.fresh -= len(taken)
        return taken

    def drop(self, keep: Callable[[Job], bool]) -> int:
        """Forget held jobs ``keep`` rejects (their records left the window); returns how many."""
        dropped = 0
        for caller in list(self._queues):
            kept = deque(h for h in self._queues[caller] if keep(h.job))
            dropped += len(self._queues[caller]) - len(kept)
            self.fresh -= sum(1 for h in self._queues[caller] if not h.deferred) - sum(1 for h in kept if not h.deferred)
            if kept:
                self._queues[caller] = kept
            else:
                del self._queues[caller]
        self.size -= dropped
        return dropped

    def _pop(self, caller: str) -> Held:
        queue = self._queues[caller]
        held = queue.popleft()
        if not queue:
            del self._queues[caller]
        self.size -= 1
        self.fresh -= not held.deferred
        return held

    def _send(self, held: Held, out: list[Released]) -> None:
        overrun = self._quotas.wait_s(held.caller) > 0  # it goes at a limit, not by its quota
        self.overruns += overrun
        out.append(Released(held.job, held.caller, self._quotas.take(held.caller), overrun))

    def _due(self, caller: str, now: float, full: bool) -> bool:
        """``caller``'s next request may go now: its quota allows it, or a limit is reached (its oldest
        held request waited ``max_delay_s``, more than ``max_delayed`` are held in all, or the window is
        ``full``).  A deferred head: its quota allows it and its ``not_before`` passed, or ``full``."""
        head = self._queues[caller][0]
        if head.deferred:
            return full or (now >= head.not_before and self._quotas.wait_s(caller) <= 0)
        return (self._quotas.wait_s(caller) <= 0 or full or self.fresh > self.max_delayed
                or now - head.since >= self.max_delay_s)

    def release(self, room: int, full: bool = False) -> list[Released]:
        """Up to ``room`` requests to send now, one per due caller per turn of the round robin; ``full``:
        the window is at ``max_pending`` (consumption paused), so every caller is due."""
        out: list[Released] = []
        now = self._clock()
        while len(out) < room and self._queues:
            turn = [c for c in self._queues if self._due(c, now, full)]
            if not turn:
                break
            for caller in turn:
                if len(out) >= room:
                    break
                self._send(self._pop(caller), out)
                if caller in self._queues:
                    self._queues.move_to_end(caller)  # served: the others go first next time
        return out
