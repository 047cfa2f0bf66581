"""``SupervisedThread``: a background thread that dies is restarted with backoff, and says why."""

from __future__ import annotations

import threading

from sie.kernel.supervised import SupervisedThread
from tests.support.helpers import wait_until


def test_a_run_that_raises_is_restarted_with_growing_backoff_and_reported():
    runs: list[int] = []
    healthy = threading.Event()

    def target() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError(f"boom {len(runs)}")
        healthy.set()
        stop.wait()

    waits: list[float] = []

    class RecordingStop(threading.Event):
        """Records each backoff wait and skips it (the test does not sleep through the backoff)."""

        def wait(self, timeout: float | None = None) -> bool:
            if timeout is not None:
                waits.append(timeout)
            return super().wait(0 if timeout is not None else None)

    stop = RecordingStop()
    thread = SupervisedThread("t", target, stop, backoff_initial_s=0.5, backoff_max_s=0.8).start()
    wait_until(healthy.is_set, message="the third run")
    status = thread.status()
    assert (status.state, status.restarts, status.last_error, status.ok) == ("running", 2, "RuntimeError: boom 2", True)
    assert waits[:2] == [0.5, 0.8]  # doubled, capped
    stop.set()
    thread.join(5)
    assert not thread.alive and thread.status().state == "stopped"


def test_a_run_that_returns_without_a_stop_counts_as_a_death():
    stop = threading.Event()
    calls: list[int] = []

    def target() -> None:
        calls.append(1)
        if len(calls) >= 2:
            stop.wait()

    thread = SupervisedThread("t", target, stop, backoff_initial_s=0.01).start()
    wait_until(lambda: len(calls) == 2, message="restarted")
    assert thread.status().last_error == "returned although no stop was requested"
    stop.set()
    thread.join(5)


def test_while_waiting_to_restart_it_is_not_ok():
    stop = threading.Event()

    def target() -> None:
        raise ValueError("no broker")

    thread = SupervisedThread("t", target, stop, backoff_initial_s=30).start()
    wait_until(lambda: thread.status().state == "restarting", message="waiting out the backoff")
    status = thread.status()
    assert not status.ok and status.to_json() == {"ok": False, "state": "restarting", "restarts": 1,
                                                  "last_error": "ValueError: no broker"}
    stop.set()
    thread.join(5)
    assert thread.status().state == "stopped"
