"""A private test network on this machine: every node in its own network namespace, on its own address.

Issue 27: crashes and freezes are not the common production fault, partitions are, and every process on
one host shares one loopback.  ``Topology`` builds, as root, a network that exists only inside namespaces
it creates itself::

    switch namespace "<tag>-sw":  bridge br0, one port "p-<node>" per node (the node's link)
    node namespace "<tag>-<node>": lo (up) and eth0 = the other end of its port, address 10.203.0.N/24

The root namespace gets no interface and no address; its only change is a ``blackhole`` route for the test
subnet while any topology exists (``guard_root``), so that a client the test forgot to create inside a
node fails at once instead of sending the test's traffic out of the machine's default route.  No namespace has a default route and
nothing is forwarded anywhere: the subnet is reachable only from inside the topology's namespaces.  Processes
are started in a node with ``command(node, argv)`` (``ip netns exec``: the pid is the program's own);
the test's own Kafka clients are created inside a node with ``entered(node)`` (the calling thread joins
the namespace, ``setns(2)``; librdkafka's threads, created by that call, stay there); a node's loopback
service (a control plane's HTTP API) is reached through ``forward(node, port)``, a loopback port in the
caller's namespace proxied into the node: the test's management path, never cut by a partition.

Faults (each undone by its counterpart; ``heal_all`` undoes every one):

=====================  ===============================================  ==========================================
call                   what it does                                     what the node's peers see
=====================  ===============================================  ==========================================
``cut(node)``          its bridge port goes down (the link is gone)     silence: sends are dropped, no RST/ICMP;
                                                                        new connects fail after ARP gives up (~3 s)
``block(node, peers)`` nft drops every packet between it and ``peers``  silence both ways, ARP still answers:
                       (in the node's namespace, both directions)       connects hang until their own timeout
``flap(node, ...)``    ``cut``/``heal`` every ``period_s`` for a while  links that come and go
=====================  ===============================================  ==========================================

Cleanup is unconditional: ``close()`` SIGKILLs whatever still runs inside this topology's namespaces (only
processes it started can be there) and deletes them (veths and bridge go with them); a topology left behind
by a test process that was itself killed is swept by the next ``build()`` (namespace names carry the
owner's pid).  ``unavailable()`` says why a machine cannot run it (not root, no ``ip``, no netns/veth/bridge
support); tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tests.support.helpers import wait_until

#: the test subnet (a /24): it exists only inside the namespaces a ``Topology`` creates
SUBNET = "10.203.0"
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/run/netns"
_TAG_RE = re.compile(r"^sie(\d+)x[0-9a-f]{4}-")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _own_netns_fd() -> int:
    return os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None: they can): a skip reason for tests."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth, bridge); run as root or in CI"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    if shutil.which("nft") is None:
        return "the `nft` tool (nftables) is not installed (partial partitions)"
    if not hasattr(_libc(), "setns"):
        return "libc has no setns(2)"
    probe = f"sie{os.getpid()}x{os.urandom(2).hex()}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        for args in (["link", "add", "br0", "type", "bridge"], ["link", "add", "v0", "type", "veth", "peer", "name", "v1"]):
            out = _ip("-n", probe, *args, check=False)
            if out.returncode != 0:
                return f"ip {' '.join(args)} in a namespace failed: {out.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Node:
    name: str
    netns: str
    address: str
    port: str  # its link: the bridge port in the switch namespace


class Topology:
    """Nodes on one bridge, each in its own namespace (module docstring).  ``build()`` first; ``close()`` always."""

    def __init__(self, names: Sequence[str], subnet: str = SUBNET) -> None:
        if len(set(names)) != len(names) or not names or len(names) > 200:
            raise ValueError(f"node names must be distinct, 1-200 of them: {names}")
        for name in names:
            if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", name):
                raise ValueError(f"node name {name!r}: lowercase letters and digits, at most 10")
        self.tag = f"sie{os.getpid()}x{os.urandom(2).hex()}"
        self.subnet = subnet
        self.switch = f"{self.tag}-sw"
        self.nodes = {name: Node(name, f"{self.tag}-{name}", f"{subnet}.{10 + i}", f"p-{name}")
                      for i, name in enumerate(names)}
        self._made: list[str] = []
        self._blocked: set[str] = set()
        self._cut: set[str] = set()
        self._forwards: list[_Forward] = []
        self._lock = threading.Lock()
        self._flappers: list[tuple[threading.Thread, threading.Event]] = []

    # ---- building and tearing down ---------------------------------------------------------------------------
    def build(self) -> Topology:
        sweep_orphans()
        try:
            with _guard_lock():  # the route and our first namespace appear together (see close)
                guard_root(self.subnet)
                self._add_netns(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes.values():
                self._add_netns(node.netns)
                _ip("-n", self.switch, "link", "add", node.port, "type", "veth", "peer", "name", "eth0",
                    "netns", node.netns)
                _ip("-n", self.switch, "link", "set", node.port, "master", "br0", "up")
                _ip("-n", node.netns, "link", "set", "lo", "up")
                _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
                _ip("-n", node.netns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def close(self) -> None:
        """Stop flappers and forwards, SIGKILL what still runs inside, delete every namespace and (the last
        topology) the guard route, whatever fails; then AssertionError if a process outlived its SIGKILL."""
        for thread, stop in self._flappers:
            stop.set()
            thread.join(10)
        for fwd in self._forwards:
            fwd.close()
        made, self._made = list(reversed(self._made)), []
        try:
            _remove_all(made)
        finally:
            with _guard_lock():
                if not _live_topologies():
                    _ip("route", "del", "blackhole", f"{self.subnet}.0/24", check=False)

    def __enter__(self) -> Topology:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- where things are ------------------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r} in this topology (nodes: {', '.join(self.nodes)})") from None

    def address(self, name: str) -> str:
        return self.node(name).address

    def name_of(self, address: str) -> str:
        return next(n.name for n in self.nodes.values() if n.address == address)

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``name`` (``ip netns exec`` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.node(name).netns, *argv]

    def prefix(self, name: str) -> list[str]:
        return self.command(name, [])

    def pids(self, name: str) -> list[int]:
        out = _ip("netns", "pids", self.node(name).netns, check=False)
        return [int(p) for p in out.stdout.split()]

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[Node]:
        """The calling thread inside node ``name`` until the block ends (sockets, Kafka clients and threads
        created meanwhile live there for good)."""
        node = self.node(name)
        home = _own_netns_fd()
        target = os.open(f"{_NETNS_DIR}/{node.netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield node
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)

    def forward(self, name: str, port: int) -> int:
        """A loopback port here (the caller's namespace) proxied to 127.0.0.1:``port`` inside node ``name``."""
        fwd = _Forward(self, name, port)
        self._forwards.append(fwd)
        return fwd.port

    # ---- faults ----------------------------------------------------------------------------------------------
    def cut(self, name: str) -> None:
        """Take node ``name``'s link down: it reaches nobody and nobody reaches it."""
        with self._lock:
            _ip("-n", self.switch, "link", "set", self.node(name).port, "down")
            self._cut.add(name)

    def heal(self, name: str) -> None:
        with self._lock:
            _ip("-n", self.switch, "link", "set", self.node(name).port, "up")
            self._cut.discard(name)

    def block(self, name: str, peers: Iterable[str]) -> None:
        """Drop every packet between node ``name`` and ``peers`` (both directions), silently: a partial partition."""
        node = self.node(name)
        addrs = ", ".join(self.address(p) for p in peers)
        if not addrs:
            raise ValueError("block: name at least one peer")
        rules = (f"table inet siepart {{\n"
                 f"  chain in {{ type filter hook input priority 0; policy accept; ip saddr {{ {addrs} }} drop; }}\n"
                 f"  chain out {{ type filter hook output priority 0; policy accept; ip daddr {{ {addrs} }} drop; }}\n"
                 f"}}\n")
        with self._lock:
            self._unblock(node)
            out = subprocess.run(["ip", "netns", "exec", node.netns, "nft", "-f", "-"], input=rules,
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"nft in {node.netns}: {out.stderr.strip()}")
            self._blocked.add(name)

    def unblock(self, name: str) -> None:
        with self._lock:
            self._unblock(self.node(name))
            self._blocked.discard(name)

    def _unblock(self, node: Node) -> None:
        subprocess.run(["ip", "netns", "exec", node.netns, "nft", "delete", "table", "inet", "siepart"],
                       capture_output=True, text=True)

    def flap(self, name: str, period_s: float, duration_s: float) -> threading.Thread:
        """Cut and heal node ``name`` every ``period_s`` for ``duration_s`` (from a thread; healed at the end).
        ``join()`` the returned thread to wait for the end."""
        stop = threading.Event()

        def run() -> None:
            end = time.monotonic() + duration_s
            try:
                while not stop.is_set() and time.monotonic() < end:
                    self.cut(name)
                    if stop.wait(min(period_s, max(0.0, end - time.monotonic()))):
                        break
                    self.heal(name)
                    stop.wait(min(period_s, max(0.0, end - time.monotonic())))
            finally:
                self.heal(name)

        thread = threading.Thread(target=run, name=f"flap-{name}", daemon=True)
        self._flappers.append((thread, stop))
        thread.start()
        return thread

    def heal_all(self) -> None:
        for name in list(self._cut):
            self.heal(name)
        for name in list(self._blocked):
            self.unblock(name)


def _remove_netns(name: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process inside ``name`` (a process keeps a deleted namespace alive) until none is left, then
    delete it; the namespace is deleted in any case, and AssertionError names the processes that outlived
    ``timeout_s``."""
    left: list[int] = []

    def none_left() -> bool:
        left[:] = [int(p) for p in _ip("netns", "pids", name, check=False).stdout.split()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not left

    try:
        wait_until(none_left, timeout_s, interval=0.1,
                   message=lambda: f"the processes in network namespace {name} to exit after SIGKILL (left: {left})")
    finally:
        _ip("netns", "del", name, check=False)


def _remove_all(names: Iterable[str]) -> None:
    """``_remove_netns`` for each of ``names``, whatever happens to the others; then one AssertionError naming
    every namespace whose processes outlived the deadline."""
    failures = []
    for name in names:
        try:
            _remove_netns(name)
        except AssertionError as exc:
            failures.append(str(exc))
    if failures:
        raise AssertionError("; ".join(failures))


@contextlib.contextmanager
def _guard_lock() -> Iterator[None]:
    """Serialises adding/removing the root guard route with creating/deleting topologies (other test runs)."""
    import fcntl

    with open("/run/sie-netns.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _live_topologies() -> list[str]:
    try:
        return [n for n in os.listdir(_NETNS_DIR) if _TAG_RE.match(n)]
    except FileNotFoundError:
        return []


def guard_root(subnet: str = SUBNET) -> None:
    """A blackhole route for the test subnet in the root namespace (idempotent; the last topology's
    ``close`` removes it): traffic to the subnet from outside the topology's namespaces fails locally
    ("network unreachable") and never leaves the machine."""
    route = _ip("route", "show", f"{subnet}.0/24", check=False).stdout
    if "blackhole" not in route:
        _ip("route", "replace", "blackhole", f"{subnet}.0/24")


def sweep_orphans() -> list[str]:
    """Delete the namespaces of topologies whose owning process is gone (a killed test run); returns them."""
    try:
        names = os.listdir(_NETNS_DIR)
    except FileNotFoundError:
        return []
    swept = [name for name in names if (m := _TAG_RE.match(name)) and not _pid_alive(int(m.group(1)))]
    _remove_all(swept)
    return swept


class _Forward:
    """Loopback listener here -> 127.0.0.1:port inside a node (a tiny TCP proxy, one thread)."""

    def __init__(self, topo: Topology, name: str, port: int) -> None:
        self._topo, self._name, self._target = topo, name, port
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fwd-{name}-{port}", daemon=True)
        self._thread.start()

    def _upstream(self) -> socket.socket | None:
        home = _own_netns_fd()
        target = os.open(f"{_NETNS_DIR}/{self._topo.node(self._name).netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                sock = socket.socket()  # created inside the node: its 127.0.0.1 is the node's loopback
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", self._target))
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        peers: dict[socket.socket, socket.socket] = {}
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    try:
                        client, _addr = self._listener.accept()
                    except OSError:
                        continue
                    up = self._upstream()
                    if up is None:
                        client.close()
                        continue
                    client.setblocking(False)
                    peers[client], peers[up] = up, client
                    self._sel.register(client, selectors.EVENT_READ, None)
                    self._sel.register(up, selectors.EVENT_READ, None)
                    continue
                other = peers.get(sock)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data and other is not None:
                    try:
                        other.setblocking(True)
                        other.sendall(data)
                        other.setblocking(False)
                        continue
                    except OSError:
                        pass
                for s in (sock, other):
                    if s is not None and s in peers:
                        self._sel.unregister(s)
                        peers.pop(s, None)
                        s.close()
        for s in list(peers):
            s.close()
        self._listener.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
