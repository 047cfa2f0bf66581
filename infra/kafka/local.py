"""A real Apache Kafka (KRaft) cluster on loopback, started and stopped by SIE.

``LocalKafka`` is what ``sie kafka up/down/status`` and the test fixtures use.
Brokers are plain ``java ... kafka.Kafka server.properties`` processes started
in their own session (so the CLI can exit and Ctrl-C in a test terminal does
not half-kill a cluster).  A state file ``<data_dir>/cluster.json`` records the
shape, ports, cluster id and pids, so a later ``down``/``status`` (another
process) finds them; pids are only signalled after checking that
``/proc/<pid>/cmdline`` is still this node's broker.

All process side effects go through ``_Processes`` so the rest reads as the
cluster's state machine: read state -> check ports -> fetch jars -> format ->
start -> wait until every broker is in the metadata.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sie.infra.kafka.fetch import LOG4J_CONFIG, Echo, ensure_jars, require_tool
from sie.infra.kafka.layout import HOST, ClusterLayout, NodeLayout, render_properties
from sie.infra.kafka.security import (
    ADMIN,
    LOOPBACK,
    MECHANISM,
    SCRAM_ITERATIONS,
    USERS,
    SecurityFiles,
    secure_server_properties,
)
from sie.kernel.clients import scram_client_security
from sie.kernel.errors import ConfigError, KafkaUnavailable, SieError
from sie.kernel.settings import Settings

STATE_FILE = "cluster.json"
Clock = Callable[[], float]


def _quiet(*_: Any) -> None:
    """Default echo for library use: say nothing."""


@dataclass(frozen=True)
class ClusterState:
    """What ``cluster.json`` holds: enough for another process to find and stop the brokers."""

    brokers: int
    base_port: int
    cluster_id: str
    kafka_version: str
    pids: dict[int, int] = field(default_factory=dict)
    #: SASL_SSL + SCRAM + ACLs (``sie kafka up --secure``); secrets in ``<data_dir>/secrets``
    secure: bool = False
    #: each node's address (empty: all on 127.0.0.1; ``ClusterLayout.hosts``)
    hosts: tuple[str, ...] = ()

    def with_pid(self, node_id: int, pid: int | None) -> ClusterState:
        pids = {k: v for k, v in self.pids.items() if k != node_id}
        if pid is not None:
            pids[node_id] = pid
        return replace(self, pids=pids)

    def stopped(self) -> ClusterState:
        return replace(self, pids={})

    def layout(self, root: Path) -> ClusterLayout:
        return ClusterLayout(self.brokers, self.base_port, root, self.hosts)

    @classmethod
    def load(cls, path: Path) -> ClusterState | None:
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return cls(raw["brokers"], raw["base_port"], raw["cluster_id"], raw["kafka_version"],
                   {int(k): int(v) for k, v in raw.get("pids", {}).items()}, bool(raw.get("secure", False)),
                   tuple(raw.get("hosts", ())))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)


def new_cluster_id() -> str:
    """A Kafka cluster id (what ``StorageTool random-uuid`` prints), without starting a JVM."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids that look like CLI flags
            return text


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something listens on (or otherwise holds) host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like the JVM: ignore TIME_WAIT
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_base_port(count: int, low: int = 20000, high: int = 32000, attempts: int = 200) -> int:
    """A base port with ``count`` consecutive free ports, for test clusters.

    Picked at random below Linux's ephemeral range (32768+), so outgoing
    connections never grab a port the cluster will want.
    """
    import random

    for _ in range(attempts):
        base = random.randrange(low, high - count)
        if not any(port_in_use(p) for p in range(base, base + count)):
            return base
    raise ConfigError(f"no {count} consecutive free ports between {low} and {high}")


def _write_private_text(path: Path, text: str) -> None:
    """Write a file only its owner can read (server.properties of a secured node holds the admin password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def log_tail(path: Path, lines: int = 25) -> str:
    if not path.is_file():
        return f"(no log at {path})"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def probe_brokers(bootstrap: str, timeout: float, security: dict[str, Any] | None = None) -> set[int] | None:
    """Node ids in the cluster metadata as seen through ``bootstrap``; None if nobody answered.

    ``security``: librdkafka properties of a secured cluster (an admin's SASL_SSL settings).
    """
    from confluent_kafka import KafkaException

    from sie.kernel.clients import KafkaClients, broker_probe_config

    # log_level 0: refused connections while a broker boots are expected, not worth printing
    admin = KafkaClients().admin(broker_probe_config(bootstrap, security, timeout_s=timeout, log_level=0))
    try:
        return set(admin.list_topics(timeout=timeout).brokers)
    except KafkaException:
        return None


class _Processes:
    """The one wrapper around OS processes: start java, signal pids, check liveness."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, cmd: list[str], cwd: Path, log: Path, detach: bool) -> int:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=detach)
        self._children[proc.pid] = proc
        return proc.pid

    def run(self, cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)

    def alive(self, pid: int, marker: str) -> bool:
        """Running (not a zombie) and its command line still contains ``marker`` (pid reuse guard).

        Our own children are judged by ``poll()`` alone: while the java launcher
        re-execs itself, ``/proc/<pid>/cmdline`` reads empty for a moment.
        """
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        for _ in range(5):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                return False
            if cmdline:
                return marker in cmdline
            time.sleep(0.05)  # mid-exec: look again
        return False

    def signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class LocalKafka:
    """A 1- or 3-broker KRaft cluster on 127.0.0.1 whose files live under ``data_dir``.

    ``brokers`` and ``base_port`` matter for ``up``; the other methods read the
    shape from the state file, so ``LocalKafka(settings, data_dir=d).down()``
    stops whatever runs there.

    ``hosts`` and ``launcher`` (the partition campaign, tests/support/netns.py): node i listens on and
    advertises ``hosts[i]`` and is started as ``launcher(node) + java ...`` (e.g. ``ip netns exec
    <its namespace>``).  Its ports are then not checked here (they are free in its own namespace; a
    broker that cannot bind exits and ``up`` quotes its log), and ``up``/``start_broker`` probe the
    brokers from the calling thread's network, so call them from where the hosts are reachable.

    ``properties(node, props)``: the node's ``server.properties`` as they will be written (tests: a second
    listener that advertises a fault-injecting proxy, tests/support/kafka_proxy.py).
    """

    def __init__(
        self,
        settings: Settings,
        brokers: int = 1,
        base_port: int = 9092,
        data_dir: Path | None = None,
        *,
        secure: bool = False,
        hosts: Sequence[str] = (),
        launcher: Callable[[NodeLayout], Sequence[str]] | None = None,
        properties: Callable[[NodeLayout, dict[str, str]], dict[str, str]] | None = None,
        detach: bool = True,
        echo: Echo = _quiet,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.data_dir = Path(data_dir or settings.kafka_data_dir).resolve()
        self._requested = ClusterLayout(brokers, base_port, self.data_dir, tuple(hosts))
        self._launcher = launcher
        self._properties = properties
        self._secure_requested = secure
        self.security = SecurityFiles(self.data_dir / "secrets")
        self._detach = detach
        self._echo = echo
        self._clock = clock
        self._sleep = sleep
        self._procs = _Processes()

    # ---- state ---------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.data_dir / STATE_FILE

    def _state(self) -> ClusterState | None:
        return ClusterState.load(self.state_file)

    @property
    def layout(self) -> ClusterLayout:
        """The running/recorded cluster's layout, else the one ``up`` would create."""
        state = self._state()
        if state is None:
            return self._requested
        return state.layout(self.data_dir)

    @property
    def bootstrap_servers(self) -> str:
        return self.layout.bootstrap_servers

    @property
    def secure(self) -> bool:
        state = self._state()
        return state.secure if state is not None else self._secure_requested

    def settings_for_clients(self, user: str = ADMIN) -> Settings:
        """``settings`` pointing at this cluster; on a secured one, as ``user`` (default the super user
        ``admin``; ``sie-scorer`` etc. for a role's least-privilege principal)."""
        if not self.secure:
            return self.settings.with_overrides(bootstrap_servers=self.bootstrap_servers)
        return self.security.client_settings(self.settings, user, self.bootstrap_servers)

    def _probe_security(self) -> dict[str, Any] | None:
        if not self.secure:
            return None
        return self._security_as(ADMIN)

    def _security_as(self, user: str) -> dict[str, Any]:
        return scram_client_security(MECHANISM, user, self.security.password(user), str(self.security.ca_cert))

    def _alive(self, node: NodeLayout, state: ClusterState | None) -> bool:
        pid = state.pids.get(node.node_id) if state else None
        return pid is not None and self._procs.alive(pid, str(node.properties_file))

    # ---- cluster lifecycle ---------------------------------------------------------------
    def up(self, timeout: float = 90.0) -> str:
        """Start the cluster (or the nodes of it that are down) and return the bootstrap servers.

        A cluster of the same shape already running here is left as it is.
        """
        state = self._state()
        layout = self._requested
        if state is not None:
            recorded = state.layout(self.data_dir)
            running = [n.node_id for n in recorded.nodes if self._alive(n, state)]
            if state.secure != self._secure_requested:
                raise ConfigError(
                    f"{self.data_dir} holds a {'secured' if state.secure else 'plaintext'} cluster: run "
                    f"`sie kafka down --wipe --data-dir {self.data_dir}` first or pass another --data-dir"
                )
            if (state.brokers, state.base_port, state.hosts) != (layout.brokers, layout.base_port, layout.hosts):
                if running:
                    raise ConfigError(
                        f"a {state.brokers}-broker cluster already runs from {self.data_dir} "
                        f"({recorded.bootstrap_servers}): run `sie kafka down --data-dir {self.data_dir}` first "
                        "or pass another --data-dir"
                    )
                raise ConfigError(
                    f"{self.data_dir} holds a stopped {state.brokers}-broker cluster on base port {state.base_port}: "
                    f"run `sie kafka down --wipe --data-dir {self.data_dir}` to delete it or pass another --data-dir"
                )
            if len(running) == layout.brokers:
                self._echo(f"already running: {layout.bootstrap_servers} (data in {self.data_dir})")
                self._wait_ready(layout, state, timeout)
                return layout.bootstrap_servers
        else:
            state = ClusterState(layout.brokers, layout.base_port, new_cluster_id(), self.settings.kafka_version,
                                 secure=self._secure_requested, hosts=layout.hosts)
        if state.secure and layout.brokers > 1 and any(n.host != LOOPBACK for n in layout.nodes):
            raise ConfigError("a secured cluster keeps its controller listener (PLAINTEXT, a super user) on "
                              "loopback: 3 brokers on other addresses cannot form a quorum there; secure one "
                              "broker, or run the 3 on 127.0.0.1")
        to_start = [n for n in layout.nodes if not self._alive(n, state)]
        for node in to_start if self._launcher is None else ():  # a launched node's ports are its own
            for port, host in ((node.broker_port, node.host),
                               (node.controller_port, LOOPBACK if state.secure else node.host)):
                if port_in_use(port, host):
                    raise ConfigError(
                        f"{node.host}:{port} is already in use: run `sie kafka down` or pass --base-port"
                    )
        lib = ensure_jars(self.settings, echo=self._echo)
        java = require_tool("java")
        if state.secure:
            self.security.ensure(layout.hosts)  # the broker's certificate names the addresses it listens on
        state.save(self.state_file)
        self._format(layout, to_start, state, lib, java)
        started = time.monotonic()
        for node in to_start:
            state = self._start_node(node, state, lib, java)
        self._echo(f"started {len(to_start)} broker(s), waiting for the cluster to answer ...")
        try:
            self._wait_ready(layout, state, timeout)
        except SieError:
            for node in to_start:
                self._stop_node(node, self._state(), signal.SIGKILL, timeout=10)
            raise
        if state.secure:
            self._create_users(timeout)
        self._echo(f"cluster ready in {time.monotonic() - started:.1f}s (data and logs in {self.data_dir})")
        return layout.bootstrap_servers

    def create_user(self, name: str, timeout: float = 30.0) -> Path:
        """Another SCRAM user (e.g. one principal per test); returns its password file (mode 0600)."""
        if not self.secure:
            raise ConfigError(f"{self.data_dir} is not a secured cluster: users need `sie kafka up --secure`")
        self.security.add_user(name)
        self._create_users(timeout, [name])
        return self.security.password_file(name)

    def _create_users(self, timeout: float, users: list[str] | None = None) -> None:
        """SCRAM credentials of every SIE role's user (the admin's came with the storage format); idempotent."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialAlteration,
            UserScramCredentialUpsertion,
        )

        from sie.kernel.clients import KafkaClients, broker_probe_config

        admin = KafkaClients().admin(broker_probe_config(self.bootstrap_servers, self._probe_security()))
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        users = users or [u for u in USERS if u != ADMIN]
        upserts: list[UserScramCredentialAlteration] = [UserScramCredentialUpsertion(u, info, self.security.password(u).encode()) for u in users]
        for user, future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).items():
            try:
                future.result(timeout=timeout)
            except Exception as exc:
                raise SieError(f"creating SCRAM user {user} on {self.bootstrap_servers} failed: {exc}") from None
        deadline = self._clock() + timeout
        while True:  # the brokers learn new credentials from the metadata log: wait until they can log in
            as_user = self._security_as(users[-1])
            if probe_brokers(self.bootstrap_servers, 2.0, as_user) is not None:
                break
            if self._clock() >= deadline:
                raise KafkaUnavailable(f"SCRAM users not usable on {self.bootstrap_servers} after {timeout:.0f}s")
            self._sleep(0.2)
        self._echo(f"SCRAM-SHA-512 users: {', '.join(users)} (passwords in {self.security.root / 'users'}, mode 0600)")

    def down(self, timeout: float = 30.0, wipe: bool = False) -> list[int]:
        """Stop every broker (SIGTERM, SIGKILL after ``timeout``); return the node ids stopped.

        ``wipe`` also deletes the data dir (topics, offsets, logs).
        """
        state = self._state()
        stopped: list[int] = []
        if state is not None:
            layout = self.layout
            live = [n for n in layout.nodes if self._alive(n, state)]
            for node in live:  # signal all first, so the nodes shut down in parallel
                self._procs.signal(state.pids[node.node_id], signal.SIGTERM)
            for node in live:
                self._stop_node(node, state, signal.SIGTERM, timeout)
                stopped.append(node.node_id)
            state = self._state()
            if state is not None:
                state.stopped().save(self.state_file)
        if wipe and self.data_dir.exists():
            import shutil

            shutil.rmtree(self.data_dir)
        return stopped

    def status(self, timeout: float = 3.0) -> dict[str, Any]:
        """Shape, bootstrap servers and per-node pid / process alive / answers metadata."""
        state = self._state()
        if state is None:
            return {"data_dir": str(self.data_dir), "running": False, "brokers": 0,
                    "bootstrap_servers": None, "nodes": []}
        layout = self.layout
        nodes = []
        for node in layout.nodes:
            alive = self._alive(node, state)
            answers = alive and probe_brokers(node.bootstrap, timeout, self._probe_security()) is not None
            nodes.append({"node_id": node.node_id, "pid": state.pids.get(node.node_id), "port": node.broker_port,
                          "controller_port": node.controller_port, "alive": alive, "answers": answers,
                          "log": str(node.server_log)})
        return {"data_dir": str(self.data_dir), "running": all(n["answers"] for n in nodes),
                "brokers": layout.brokers, "bootstrap_servers": layout.bootstrap_servers,
                "cluster_id": state.cluster_id, "kafka_version": state.kafka_version, "nodes": nodes,
                "secure": state.secure, "secrets_dir": str(self.security.root) if state.secure else None}

    # ---- fault-test controls -------------------------------------------------------------
    def kill_broker(self, node_id: int) -> None:
        """SIGKILL one node (a crash: no controlled shutdown, no flush) and wait until it is gone."""
        self._stop_node(self.layout.node(node_id), self._state(), signal.SIGKILL, timeout=10)

    def stop_broker(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGTERM one node (controlled shutdown) and wait until it exits (SIGKILL after ``timeout``)."""
        self._stop_node(self.layout.node(node_id), self._state(), signal.SIGTERM, timeout)

    def pause_broker(self, node_id: int) -> None:
        """SIGSTOP one node: a broker that is there but answers nothing (GC pause, stalled VM), so calls
        time out instead of failing fast.  ``resume_broker`` lets it go on where it stopped."""
        state = self._state()
        node = self.layout.node(node_id)
        if state is None or not self._alive(node, state):
            raise ConfigError(f"broker {node_id} of {self.data_dir} is not running: nothing to pause")
        self._procs.signal(state.pids[node_id], signal.SIGSTOP)

    def resume_broker(self, node_id: int) -> None:
        """SIGCONT a node paused by ``pause_broker``."""
        state = self._state()
        if state is not None and node_id in state.pids:
            self._procs.signal(state.pids[node_id], signal.SIGCONT)

    def start_broker(self, node_id: int, timeout: float = 60.0) -> None:
        """Restart a stopped node of this cluster and wait until it answers and is back in the metadata."""
        state = self._state()
        if state is None:
            raise ConfigError(f"no cluster in {self.data_dir}: run `sie kafka up` first")
        layout = self.layout
        node = layout.node(node_id)
        if self._alive(node, state):
            return
        lib = ensure_jars(self.settings, echo=self._echo)
        state = self._start_node(node, state, lib, require_tool("java"))
        self._wait_ready(layout, state, timeout, must_answer=(node,))

    # ---- steps -----------------------------------------------------------------------------
    def _java_cmd(self, node: NodeLayout, lib: Path, java: str, main: str, heap: str) -> list[str]:
        jit = ["-XX:TieredStopAtLevel=1"] if self.settings.kafka_jit == "quick" else []  # Settings.kafka_jit
        return [java, f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", *jit, "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={node.logs_dir}", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                "-cp", f"{lib}/*", main]

    def _format(self, layout: ClusterLayout, nodes: list[NodeLayout], state: ClusterState, lib: Path,
                java: str) -> None:
        """Write server.properties and format the storage of nodes never formatted (in parallel)."""
        pending = []
        for node in nodes:
            node.logs_dir.mkdir(parents=True, exist_ok=True)
            props = layout.server_properties(node)
            if self._properties is not None:
                props = self._properties(node, props)
            if state.secure:
                props.update(secure_server_properties(self.security, node.broker_port, node.controller_port, node.host))
                if layout.brokers == 1:  # its controller listener is on loopback (secure_server_properties)
                    props["controller.quorum.bootstrap.servers"] = f"{LOOPBACK}:{node.controller_port}"
            _write_private_text(node.properties_file, render_properties(props))  # holds the admin's password
            if not (node.data_dir / "meta.properties").is_file():
                cmd = self._java_cmd(node, lib, java, "kafka.tools.StorageTool", "256m") + [
                    "format", "-t", state.cluster_id, "-c", str(node.properties_file)]
                if layout.brokers == 1:
                    cmd.append("--standalone")
                if state.secure:  # the brokers' own principal must exist before they can talk to each other
                    cmd += ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self.security.password(ADMIN)}]"]
                pending.append((node, subprocess.Popen(cmd, cwd=node.dir, stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        if pending:
            self._echo(f"formatting storage of {len(pending)} node(s) (cluster id {state.cluster_id}) ...")
        for node, proc in pending:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                text = out.strip()[-2000:]
                if state.secure:
                    text = text.replace(self.security.password(ADMIN), "********")
                raise SieError(f"formatting node {node.node_id} in {node.data_dir} failed: {text}")

    def _start_node(self, node: NodeLayout, state: ClusterState, lib: Path, java: str) -> ClusterState:
        cmd = self._java_cmd(node, lib, java, "kafka.Kafka", self.settings.kafka_heap) + [str(node.properties_file)]
        if self._launcher is not None:
            cmd = [*self._launcher(node), *cmd]
        pid = self._procs.start(cmd, cwd=node.dir, log=node.stdout_log, detach=self._detach)
        state = state.with_pid(node.node_id, pid)
        state.save(self.state_file)
        return state

    def _stop_node(self, node: NodeLayout, state: ClusterState | None, sig: signal.Signals, timeout: float) -> None:
        if state is None or not self._alive(node, state):
            return
        pid = state.pids[node.node_id]
        self._procs.signal(pid, sig)
        deadline = self._clock() + timeout
        while self._alive(node, state):
            if self._clock() >= deadline:
                self._procs.signal(pid, signal.SIGKILL)
                deadline = self._clock() + 10
            self._sleep(0.05)
        latest = self._state()
        if latest is not None:
            latest.with_pid(node.node_id, None).save(self.state_file)

    def _wait_ready(self, layout: ClusterLayout, state: ClusterState, timeout: float,
                    must_answer: tuple[NodeLayout, ...] = ()) -> None:
        """Until every node is in the metadata (and each of ``must_answer`` answers itself).

        Fails fast, quoting its log, when a broker process exits during the wait.
        """
        deadline = self._clock() + timeout
        expected = {n.node_id for n in layout.nodes}
        seen: set[int] | None = None
        while True:
            for node in layout.nodes:
                if node.node_id in state.pids and not self._alive(node, state):
                    raise SieError(
                        f"broker {node.node_id} ({node.bootstrap}) exited during startup; "
                        f"tail of {node.server_log}:\n{log_tail(node.server_log)}\n"
                        f"stdout ({node.stdout_log}):\n{log_tail(node.stdout_log, 10)}"
                    )
            security = self._probe_security()
            seen = probe_brokers(layout.bootstrap_servers, timeout=1.0, security=security)
            if seen is not None and expected <= seen and all(
                probe_brokers(n.bootstrap, timeout=1.0, security=security) is not None for n in must_answer
            ):
                return
            if self._clock() >= deadline:
                first = layout.nodes[0]
                raise KafkaUnavailable(
                    f"cluster {layout.bootstrap_servers} not ready after {timeout:.0f}s "
                    f"(brokers in metadata: {sorted(seen) if seen is not None else 'none answered'}); "
                    f"tail of {first.server_log}:\n{log_tail(first.server_log)}"
                )
            self._sleep(0.2)
