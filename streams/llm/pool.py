"""An endpoint pool: which server a request goes to, and which servers are out for a while.

Each endpoint (an SGLang child, a server on another node, an external URL) has a concurrency limit
and a weight.  ``acquire(key)`` blocks until some endpoint has a free slot and returns it:

* **key-sticky**: among the endpoints in service, the one preferred for ``key`` is chosen by weighted
  rendezvous hashing (the same key -> the same endpoint while it is up, so its prefix cache is hit; only
  the keys of an endpoint that leaves move).  If the preferred one is full, the least loaded endpoint
  with a free slot takes the request (throughput over locality).  No key: least loaded (in-flight /
  concurrency / weight);
* **priority** (``acquire(..., priority=)``, 0 = P0): slots an endpoint reserves for P0
  (``reserved``) are taken by P0 requests only, so P1/P2 load never fills the server's last slots; and
  while a more urgent request waits for a slot, a less urgent one does not take a slot that frees (P0
  goes first in dispatch order).  Across processes (a P0 and a P2 scorer sending to the same server,
  each with its own pool) only the reservation works: the P2 scorer's pool stops at ``concurrency -
  reserved`` on that endpoint, leaving the server's last slots to the P0 scorer;
* **ejection**: ``failed(endpoint)`` (connection refused or reset, a timeout, a 5xx) takes the endpoint
  out of service for a backoff that doubles per failure (``backoff_s`` .. ``backoff_max_s``); failures
  reported while it is already out do not count again (a burst of in-flight requests failing together
  is one failure).  When the backoff ends it is *half-open*: one request at a time until one succeeds,
  then its full concurrency again.  The request that failed is re-dispatched by its caller
  (``sie.streams.llm.dispatch``), never dead-lettered: an endpoint outage is not the request's fault.

Weights are plain numbers a traffic director may change at run time (``set_weight``).  Thread-safe:
one lock, one condition that every slot release notifies.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("sie.llm")


@dataclass
class Endpoint:
    """One server; the counters are guarded by the pool's lock."""

    url: str
    concurrency: int
    weight: float = 1.0
    in_flight: int = 0
    failures: int = 0  # consecutive failures; > 0 means half-open once the backoff has ended
    out_until: float = 0.0
    served: int = 0
    last_error: str = ""
    reserved: int = 0  # slots only P0 requests may take (module docstring)
    #: (when, seconds) of its recent answers: the traffic director's p99 of this endpoint
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=512))
    #: the configured weight; the director scales it (``weight`` = base x its multiplier)
    base_weight: float = -1.0

    def __post_init__(self) -> None:
        if self.base_weight < 0:
            self.base_weight = self.weight

    def up(self, now: float) -> bool:
        return now >= self.out_until

    def limit(self, priority: int = 0) -> int:
        if self.failures:
            return 1  # half-open: one probe at a time, whatever its priority
        return self.concurrency if priority <= 0 else max(self.concurrency - self.reserved, 0)


def _rendezvous(key: bytes, url: str, weight: float) -> float:
    digest = hashlib.blake2b(key + b"\x00" + url.encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 1) / (2**64 + 2)  # in (0, 1)
    return -weight / math.log(u)


class EndpointPool:
    """Endpoints with concurrency, health and key-sticky choice (module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint], *, backoff_s: float = 0.5, backoff_max_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise ValueError("endpoint pool: at least one endpoint is needed (spec.backend.config.endpoints)")
        self.endpoints = list(endpoints)
        self._backoff = backoff_s
        self._backoff_max = backoff_max_s
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: dict[int, int] = {}  # acquirers blocked now, by priority

    @property
    def capacity(self) -> int:
        """Requests the pool serves at once when every endpoint is up."""
        return sum(e.concurrency for e in self.endpoints)

    def set_weight(self, url: str, weight: float) -> None:
        with self._cond:
            for e in self.endpoints:
                if e.url == url:
                    e.weight = max(0.0, weight)
            self._cond.notify_all()

    def choose(self, key: bytes | None, now: float, priority: int = 0) -> Endpoint | None:
        """The endpoint for ``key`` now (a free slot for ``priority``), or None if every endpoint is full
        or out. Lock held."""
        live = [e for e in self.endpoints if e.up(now) and e.weight > 0]
        free = [e for e in live if e.in_flight < e.limit(priority)]
        if not free:
            return None
        if key is not None:
            preferred = max(live, key=lambda e: _rendezvous(key, e.url, e.weight))
            if preferred.in_flight < preferred.limit(priority):
                return preferred
        return min(free, key=lambda e: (e.in_flight / max(e.limit(priority), 1) / e.weight, e.in_flight))

    def acquire(self, key: bytes | None, stop: threading.Event, give_up: Callable[[], bool] = lambda: False,
                priority: int = 0) -> Endpoint | None:
        """A slot on an endpoint (count it in flight), waiting while none is free or a more urgent request
        (lower ``priority``) waits; None once ``stop`` is set or ``give_up()`` says the request is no
        longer wanted."""
        with self._cond:
            self._waiting[priority] = self._waiting.get(priority, 0) + 1
            try:
                while not stop.is_set() and not give_up():
                    now = self._clock()
                    urgent = any(n for p, n in self._waiting.items() if p < priority)
                    chosen = None if urgent else self.choose(key, now, priority)
                    if chosen is not None:
                        chosen.in_flight += 1
                        return chosen
                    back = [e.out_until - now for e in self.endpoints if not e.up(now)]
                    self._cond.wait(min([0.2, *back]) if back else 0.2)
            finally:
                self._waiting[priority] -= 1
                if any(n for p, n in self._waiting.items() if p > priority):
                    self._cond.notify_all()  # a less urgent waiter may go now
        return None

    def release(self, endpoint: Endpoint, latency_s: float | None = None) -> None:
        """The request on ``endpoint`` got an answer (any answer: the server is up) after ``latency_s``."""
        with self._cond:
            endpoint.in_flight -= 1
            endpoint.served += 1
            if latency_s is not None:
                endpoint.recent.append((self._clock(), latency_s))
            if endpoint.failures:  # a warning, like its ejection: an operator reading warnings sees both ends
                log.warning("endpoint %s answers again: back in service after %d failure(s)", endpoint.url,
                            endpoint.failures)
            endpoint.failures = 0
            self._cond.notify_all()

    def failed(self, endpoint: Endpoint, why: str) -> float:
        """The request on ``endpoint`` got no usable answer (the server's fault): take it out for a while.
        Returns the backoff (0 when it was already out: the failure is part of the same outage)."""
        with self._cond:
            endpoint.in_flight -= 1
            endpoint.last_error = why
            now = self._clock()
            backoff = 0.0
            if endpoint.up(now):
                endpoint.failures += 1
                backoff = min(self._backoff * 2 ** (endpoint.failures - 1), self._backoff_max)
                endpoint.out_until = now + backoff
                log.warning("endpoint %s failed (%s): out of service for %.1fs", endpoint.url, why, backoff)
            self._cond.notify_all()
            return backoff

    def signals(self, window_s: float = 10.0) -> list[Any]:
        """Each endpoint now, as the traffic director reads it (``sie.control.reconcile.director.Signal``): a
        remote server's GPU is not visible from here, so its slot occupancy (in flight / concurrency) stands
        for utilisation and its requests in flight (sent, not answered: the server runs or queues them) for
        its queue; p99 over the answers of the last ``window_s``."""
        from sie.control.reconcile.director import Signal

        now = self._clock()
        out = []
        with self._cond:
            for e in self.endpoints:
                times = sorted(s for at, s in e.recent if at >= now - window_s)
                p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000.0 if times else None
                out.append(Signal(e.url, 100.0 * e.in_flight / e.concurrency, float(e.in_flight), p99))
        return out

    def failing(self) -> list[Endpoint]:
        """The endpoints whose last request failed (out of service, or half-open and not yet answering again).
        All of them: the model is in an outage (its requests wait; the stage reports it)."""
        with self._cond:
            return [e for e in self.endpoints if e.failures]

    def in_service(self) -> int:
        now = self._clock()
        with self._cond:
            return sum(1 for e in self.endpoints if e.up(now))
