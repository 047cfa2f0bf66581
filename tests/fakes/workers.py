"""Fakes of the node agent's process side (``sie.workers.process``) and clock (``sie.workers.supervisor.Clock``):
the supervisor and the agent run against them with no processes and no waiting."""

from __future__ import annotations

import threading
from typing import Any

from sie.workers.process import LaunchSpec, describe_exit
from sie.workers.replica import ExitInfo


class FakeClock:
    """``Clock``: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeHandle:
    """A process the test drives: it emits events, exits, and records the signals it got.

    ``exit_on_term``: a SIGTERM makes it exit with code 0 (a worker that drains at once).
    Thread-safe: the agent's loop drains events while the test emits them.
    """

    def __init__(self, pid: int, spec: LaunchSpec, exit_on_term: bool = False) -> None:
        self.pid = pid
        self.spec = spec
        self.signals: list[str] = []
        self.exit_on_term = exit_on_term
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._exit: ExitInfo | None = None

    # test controls
    def emit(self, **event: Any) -> None:
        with self._lock:
            self._events.append(event)

    def exit(self, returncode: int) -> None:
        self._exit = describe_exit(returncode)

    # ProcessHandle
    def poll(self) -> ExitInfo | None:
        return self._exit

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            drained, self._events = self._events, []
        return drained

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.exit_on_term:
            self.exit(0)

    def kill(self) -> None:
        self.signals.append("KILL")

    def hand_over(self) -> None:
        self.signals.append("USR2")
        if self.exit_on_term:
            self.exit(0)

    def serve(self) -> None:
        self.signals.append("USR1")

    def log_tail(self, lines: int = 5) -> str:
        return ""


class FakeLauncher:
    """``ProcessLauncher``: hands out ``FakeHandle``s (pids 100, 101, ...); ``fail_next`` makes one start fail."""

    def __init__(self, exit_on_term: bool = False) -> None:
        self.started: list[FakeHandle] = []
        self.fail_next: Exception | None = None
        self.exit_on_term = exit_on_term

    def start(self, spec: LaunchSpec) -> FakeHandle:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        handle = FakeHandle(100 + len(self.started), spec, self.exit_on_term)
        self.started.append(handle)
        return handle

    @property
    def last(self) -> FakeHandle:
        return self.started[-1]
