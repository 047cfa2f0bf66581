"""Bounded, stop-aware waits on client calls that may block past their own timeout.

librdkafka calls take a timeout, but some block far longer while a coordinator
is down (adding offsets to a transaction, librdkafka #5456) and some take none
at all (``Consumer.close()``).  A loop that must keep recovering until the broker
is back, and must honour SIGTERM within seconds, cannot sit inside such a call.
The call runs on a daemon thread and the caller waits at most ``limit_s``, or
until ``stop`` is set; an abandoned call keeps running on its own thread
(holding its client) and its outcome is discarded.

``call_bounded`` starts a thread per call (rare calls: start-up, close, rewind);
``BoundedWorker`` keeps one thread for a caller that makes such calls on its hot
path (a transactional producer: one per commit).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

_TICK_S = 0.1  # how often a stop request is looked at while waiting


class CallAbandoned(Exception):
    """A bounded call was given up: it outlived ``limit_s`` (``stopped`` False) or a stop was requested."""

    def __init__(self, what: str, waited_s: float, stopped: bool) -> None:
        reason = "stop requested" if stopped else "no answer"
        super().__init__(f"{what}: {reason} after {waited_s:.0f}s")
        self.what = what
        self.waited_s = waited_s
        self.stopped = stopped


class _Job:
    """One call handed to another thread: its outcome, and an event set when there is one."""

    __slots__ = ("fn", "done", "ok", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None

    def run(self) -> None:
        try:
            self.value = self.fn()
            self.ok = True
        except BaseException as exc:  # re-raised in the caller's thread
            self.value = exc
        finally:
            self.done.set()

    def outcome(self, what: str, started: float, limit_s: float, stop: threading.Event | None,
                clock: Callable[[], float], deadline_of: Callable[[], float] | None = None) -> Any:
        """The call's value (or its exception, re-raised here); ``CallAbandoned`` once ``limit_s`` passed since
        ``started`` (or, with ``deadline_of``, once the clock passed the deadline it gives now: a call made of
        steps moves it at each step) or on ``stop``."""
        while not self.done.is_set():
            deadline = started + limit_s if deadline_of is None else deadline_of()
            left = deadline - clock()
            if left <= 0:
                raise CallAbandoned(what, clock() - started, stopped=False)
            if stop is not None and stop.is_set():
                raise CallAbandoned(what, clock() - started, stopped=True)
            self.done.wait(min(left, _TICK_S) if stop is not None else left)
        if self.ok:
            return self.value
        raise self.value


def call_bounded(fn: Callable[[], Any], what: str, limit_s: float, stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> Any:
    """``fn()``'s value (or its exception, re-raised here); ``CallAbandoned`` after ``limit_s`` or on ``stop``."""
    job = _Job(fn)
    started = clock()
    threading.Thread(target=job.run, name=f"bounded-{what}", daemon=True).start()
    return job.outcome(what, started, limit_s, stop, clock)


class Pending:
    """A call started on a ``BoundedWorker``: ``wait`` for it, then take its outcome with ``result``.

    ``limit_s`` counts from the start, not from ``result``: a caller may do other work first (pipelined
    commits prepare the next batch meanwhile)."""

    __slots__ = ("_job", "_what", "_started", "_limit_s", "_clock", "_worker", "_jobs", "_deadline_of")

    def __init__(self, job: _Job, what: str, limit_s: float, clock: Callable[[], float], worker: BoundedWorker,
                 jobs: queue.SimpleQueue[_Job | None], deadline_of: Callable[[], float] | None = None) -> None:
        self._job, self._what, self._limit_s, self._clock = job, what, limit_s, clock
        self._started = clock()
        self._worker, self._jobs = worker, jobs
        self._deadline_of = deadline_of

    def done(self) -> bool:
        return self._job.done.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Whether the call returned within ``timeout_s`` (its return wakes this at once)."""
        return self._job.done.wait(timeout_s)

    def result(self, stop: threading.Event | None = None) -> Any:
        """The call's value (or its exception); ``CallAbandoned`` after ``limit_s`` or on ``stop``."""
        try:
            return self._job.outcome(self._what, self._started, self._limit_s, stop, self._clock, self._deadline_of)
        except CallAbandoned:
            self._worker._forget(self._jobs)
            raise


class BoundedWorker:
    """Bounded calls on one long-lived daemon thread: ``call_bounded``'s contract without a thread start per call.

    For callers with a bounded call on their hot path: a transactional producer commits through one, once
    per batch, and a thread start there cost CPU and a wait for the GIL on every commit.  Calls run one at a
    time, in the order submitted (one caller at a time is the intended use).  A call that is abandoned may
    never return, so its thread is left to it (told to exit if it ever does) and the next call starts a
    fresh one.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any], what: str, limit_s: float,
               clock: Callable[[], float] = time.monotonic,
               deadline_of: Callable[[], float] | None = None) -> Pending:
        """Start ``fn`` on the worker's thread; its outcome comes from the returned ``Pending`` (given up after
        ``limit_s``, or at the deadline ``deadline_of()`` gives at each look when set)."""
        job = _Job(fn)
        with self._lock:
            jobs = self._jobs
            if jobs is None:
                jobs = self._jobs = queue.SimpleQueue()
                threading.Thread(target=_serve, args=(jobs,), name=f"bounded-{self._name}", daemon=True).start()
            pending = Pending(job, what, limit_s, clock, self, jobs, deadline_of)
            jobs.put(job)
        return pending

    def call(self, fn: Callable[[], Any], what: str, limit_s: float, stop: threading.Event | None = None,
             clock: Callable[[], float] = time.monotonic) -> Any:
        """``fn()``'s value (or its exception); ``CallAbandoned`` after ``limit_s`` or on ``stop``."""
        return self.submit(fn, what, limit_s, clock).result(stop)

    def close(self) -> None:
        """Let the thread exit once its queue is empty (a later call starts a new one)."""
        with self._lock:
            if self._jobs is not None:
                self._jobs.put(None)
                self._jobs = None

    def _forget(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        """A call on ``jobs``' thread was abandoned: that thread exits after it, if it ever returns."""
        with self._lock:
            if self._jobs is jobs:
                self._jobs = None
                jobs.put(None)


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()
