"""A background thread that is restarted when it dies, and says so.

WHY: a daemon thread that raises simply ends; nothing in Python notices.  The control plane's state
reader, leader elector, reconcile loop and HTTP server are such threads, and one of them ending
silently would leave a control plane answering ``/healthz`` while it no longer read, led or
reconciled anything.  ``SupervisedThread`` runs ``target`` on a daemon thread; when ``target``
raises, or returns although no stop was asked for, it is run again after an exponential backoff
(``backoff_initial_s`` doubling up to ``backoff_max_s``; reset once a run lasted ``healthy_after_s``),
and every death is counted and kept (``status()``) so health can report it.

A restart is the right reaction only for a thread that can start from scratch: ``target`` must build
its own clients at the top of each run (the supervisor never re-uses anything of a dead run).  A
thread whose death leaves the process unable to go on should exit the process instead; the user of
this class decides per thread (docs/reliability.md lists the choices).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThreadStatus:
    """What health shows of one supervised thread."""

    name: str
    #: running: ``target`` is running; restarting: it died and waits out its backoff; stopped: asked to stop
    state: str
    restarts: int
    last_error: str | None
    #: monotonic time of the last death (None: never died)
    last_error_at: float | None

    @property
    def ok(self) -> bool:
        return self.state == "running"

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "state": self.state, "restarts": self.restarts, "last_error": self.last_error}


class SupervisedThread:
    """Runs ``target()`` on a daemon thread until ``stop()``; restarts it with backoff when it dies."""

    def __init__(
        self,
        name: str,
        target: Callable[[], None],
        stop: threading.Event,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        healthy_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._target = target
        self._stop = stop
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._healthy_after_s = healthy_after_s
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._state = "stopped"
        self.restarts = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None

    def start(self) -> SupervisedThread:
        self._state = "running"
        self._thread = threading.Thread(target=self._supervise, name=self.name, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (the caller sets the ``stop`` event first)."""
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> ThreadStatus:
        state = self._state
        if state != "stopped" and not self.alive:  # the supervisor itself cannot die, but say so if it did
            state = "dead"
        return ThreadStatus(self.name, state, self.restarts, self.last_error, self.last_error_at)

    def _supervise(self) -> None:
        delay = self._backoff_initial_s
        while not self._stop.is_set():
            self._state = "running"
            started = self._clock()
            try:
                self._target()
                if self._stop.is_set():
                    break
                problem = "returned although no stop was requested"
            except Exception as exc:  # whatever ended the run is reported, then the run is retried
                if self._stop.is_set():
                    log.debug("%s ended while stopping: %s", self.name, exc)
                    break
                problem = f"{type(exc).__name__}: {exc}"
                log.exception("%s died; restarting it", self.name)
            if self._clock() - started >= self._healthy_after_s:
                delay = self._backoff_initial_s  # it ran well for a while: a fresh failure starts the backoff over
            self.restarts += 1
            self.last_error = problem
            self.last_error_at = self._clock()
            self._state = "restarting"
            log.error("%s died (%s); restart %d in %.1fs", self.name, problem, self.restarts, delay)
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self._backoff_max_s)
        self._state = "stopped"
