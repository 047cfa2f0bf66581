"""Health/readiness ports are bounded (issue 37, item 6): 100 idle connections held 100 threads with no
timeout on the agent's and control plane's readiness port (``serve_readiness``) and the operator's health
port.  Now an idle connection times out and at most ``MAX_CONNECTIONS`` are served at once (the oldest is
evicted), so a probe is still answered while someone holds connections open."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import httpx
import pytest

from sie.commands.operator import _serve_health
from sie.kernel import probe_http
from sie.kernel.startup import Readiness, serve_readiness
from tests.support.helpers import wait_until

IDLE = 100


def _readiness_port() -> int:
    readiness = Readiness("agent")
    readiness.set_ready()
    return serve_readiness(readiness, "127.0.0.1", 0)


def _operator_port() -> int:
    return _serve_health(SimpleNamespace(lease=None, passes=0, last_loop=time.monotonic()), "127.0.0.1", 0)


def _metrics_port() -> int:
    from sie.workers.metrics import AgentMetrics

    return AgentMetrics("n1").serve(0, "127.0.0.1")


PORTS: dict[str, tuple[Callable[[], int], str]] = {
    "agent/control readiness": (_readiness_port, "/livez"),
    "operator health": (_operator_port, "/healthz"),
    "agent metrics": (_metrics_port, "/metrics"),  # the workers', scorer's and CDC stage's use the same server
}


def _wait(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    wait_until(condition, deadline_s, 0.05, what)


def _handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


@pytest.fixture
def idle() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


@pytest.mark.parametrize("which", sorted(PORTS))
def test_idle_connections_hold_a_bounded_number_of_threads_and_a_probe_is_still_answered(
        which: str, idle: list[socket.socket]):
    start, path = PORTS[which]
    port = start()
    before = _handler_threads()
    for _ in range(IDLE):
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    # every accept has been handled once the server answers a probe after them (accepts are served in order)
    answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    assert answer.status_code == 200, answer.text
    # an evicted connection's thread ends once it sees its socket shut down: wait for that, with a deadline
    _wait(lambda: _handler_threads() - before <= probe_http.MAX_CONNECTIONS,
          f"at most {probe_http.MAX_CONNECTIONS} handler threads for {IDLE} idle connections")
    # the evicted ones were closed by the server: a read sees EOF (or a reset), not a hang
    closed = 0
    for s in idle[: IDLE - probe_http.MAX_CONNECTIONS]:
        s.settimeout(10)
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
    assert closed == IDLE - probe_http.MAX_CONNECTIONS


def test_an_idle_connection_times_out(monkeypatch: pytest.MonkeyPatch, idle: list[socket.socket]):
    monkeypatch.setattr(probe_http.ProbeHandler, "timeout", 0.5)
    port = _readiness_port()
    idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
    began = time.monotonic()
    assert idle[0].recv(1) == b""  # the server hung up on its own (the client's 30 s timeout never fires)
    assert time.monotonic() - began < 20
    _wait(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200, "a probe answered")
