"""The test network of tests/support/netns.py: nodes reach each other only as the faults allow, and nothing is
left behind.

Skipped (with the reason) where network namespaces cannot be made: not root, no iproute2/nftables.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.support.helpers import wait_until
from tests.support.netns import SUBNET, Topology, _remove_netns, sweep_orphans, unavailable

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces: {WHY}")


def _namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def _guard_route() -> str:
    return subprocess.run(["ip", "route", "show", f"{SUBNET}.0/24"], capture_output=True, text=True).stdout


class _Echo:
    """A TCP echo server inside one node (its socket made there), on the node's address or its loopback."""

    def __init__(self, topo: Topology, node: str, host: str) -> None:
        with topo.entered(node):
            self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(conn.recv(100))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _reaches(topo: Topology, src: str, host: str, port: int, timeout: float = 1.5) -> bool:
    """A round trip from node ``src`` (its socket made there) to host:port."""
    with topo.entered(src):
        sock = socket.socket()
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
            sock.sendall(b"ping")
            return sock.recv(100) == b"ping"
        except OSError:
            return False


@pytest.fixture()
def topo() -> Iterator[Topology]:
    with Topology(["a", "b", "c"]) as t:
        yield t


def test_nodes_reach_each_other_by_address_and_faults_cut_exactly_what_they_say(topo: Topology) -> None:
    echo = _Echo(topo, "b", topo.address("b"))
    try:
        assert _reaches(topo, "a", topo.address("b"), echo.port)
        assert _reaches(topo, "c", topo.address("b"), echo.port)
        topo.block("a", ["b"])  # a partial partition: a loses b, c does not
        assert not _reaches(topo, "a", topo.address("b"), echo.port)
        assert _reaches(topo, "c", topo.address("b"), echo.port)
        topo.unblock("a")
        assert _reaches(topo, "a", topo.address("b"), echo.port, timeout=5)
        topo.cut("b")  # b's link down: nobody reaches it
        assert not _reaches(topo, "a", topo.address("b"), echo.port)
        assert not _reaches(topo, "c", topo.address("b"), echo.port)
        topo.heal("b")
        assert _reaches(topo, "a", topo.address("b"), echo.port, timeout=5)
    finally:
        echo.close()


def test_the_root_namespace_gets_no_address_only_a_blackhole_guard(topo: Topology) -> None:
    """The test subnet is not routed anywhere from the root namespace (a forgotten client fails at once)."""
    assert "blackhole" in _guard_route()
    addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert SUBNET not in addresses
    with pytest.raises(OSError):
        socket.create_connection((topo.address("b"), 9), timeout=1)


def test_a_forward_reaches_a_nodes_loopback_even_while_it_is_cut(topo: Topology) -> None:
    echo = _Echo(topo, "b", "127.0.0.1")
    try:
        port = topo.forward("b", echo.port)
        topo.cut("b")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"mgmt")
            assert sock.recv(100) == b"mgmt"
    finally:
        echo.close()


def test_everything_is_removed_even_when_the_test_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Topology(["x", "y"]) as t:
            proc = subprocess.Popen(t.command("x", ["sleep", "600"]))  # lives until the cleanup kills it
            made = {n.netns for n in t.nodes.values()} | {t.switch}
            assert made <= _namespaces()
            raise RuntimeError("boom")
    assert proc.wait(10) != 0  # what ran inside was stopped
    assert not made & _namespaces()


def test_a_topology_of_a_dead_owner_is_swept_a_live_ones_is_not(topo: Topology) -> None:
    """A test run killed before its cleanup leaves namespaces named after its pid: the next run removes them."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"sie{dead.pid}x0000-left"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        swept = sweep_orphans()
        assert name in swept and name not in _namespaces()
        assert topo.switch in _namespaces() and topo.switch not in swept  # ours: its owner (we) still runs
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_process_that_outlives_the_cleanup_deadline_is_named_and_its_namespace_still_goes() -> None:
    """The cleanup waits for the processes inside a namespace to exit after SIGKILL, up to a deadline: past it,
    the failure names the namespace and the processes left, and the namespace is deleted all the same."""
    name = f"sie{os.getpid()}x0001-slow"  # our pid: a sweep by another run leaves it alone
    subprocess.run(["ip", "netns", "add", name], check=True)
    proc = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])  # `ip netns exec` execs: pid is sleep's
    try:
        wait_until(lambda: str(proc.pid) in _pids(name), 10, message=f"sleep {proc.pid} inside {name}")
        with pytest.raises(AssertionError, match=rf"network namespace {name} to exit .*left: \[{proc.pid}\]"):
            _remove_netns(name, timeout_s=0)  # deadline at once: the one SIGKILL sent, its exit not yet seen
        assert name not in _namespaces()
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _pids(name: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
