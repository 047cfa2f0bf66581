"""Real-process cluster harness: `sie control` + `sie agent` subprocesses on a real broker.

Used by tests/test_cluster_e2e.py and bench/bench_failover.py. Every cluster gets its own
SIE_TOPIC_PREFIX (system topics, model topics and consumer groups all derive from it), so parallel
runs on the shared broker never meet. Processes are tracked by PID and stopped by PID only: other
engineers run `sie` processes on the same machine, so nothing here ever matches processes by name.

Waiting is always on a condition with a deadline (HTTP API, /proc, or Kafka records), never a sleep.

``Cluster(..., hosts=topology)`` places processes on the nodes of a private test network
(tests/support/netns.py): ``start_control(..., host="c1")`` runs the control plane inside node c1's network
namespace, its HTTP API reached through a loopback forward (``Proc.port`` is the forward's), and ``sie``
CLI commands run on ``cli_host``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from sie.kernel.settings import Settings
from tests.support.helpers import (
    OPERATOR_TOKEN,
    TopicTail,
    behind,
    end_offsets,
    read_up_to,
    wait_until,
    with_api_tokens,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- helpers


def wait_for(predicate: Callable[[], Any], timeout: float, message: str | Callable[[], str] = "condition",
             interval: float = 0.05) -> Any:
    """Poll until truthy (returned); AssertionError naming ``message`` at the deadline."""
    return wait_until(predicate, timeout, interval, message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, method: str, path: str, body: Any = None, timeout: float = 10.0,
         token: str | None = OPERATOR_TOKEN) -> tuple[int, Any]:
    """One HTTP call to a control plane (as the harness's operator unless ``token`` says otherwise);
    (status, JSON or text). Connection errors raise OSError."""
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            is_json = resp.headers.get("Content-Type", "").startswith("application/json")
            return resp.status, (json.loads(raw) if is_json else raw.decode())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


def try_get(port: int, path: str) -> Any | None:
    """GET that answers None while the instance is not up (or not answering)."""
    try:
        status, body = http(port, "GET", path, timeout=5)
    except (OSError, ValueError):
        return None
    return body if status == 200 else None


def pid_alive(pid: int) -> bool:
    """Running; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except FileNotFoundError:
                continue
    except FileNotFoundError:
        pass
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return []


#: the entry points of an agent's replica processes (a model's worker, a connector's stage)
REPLICA_MODULES = ("sie.workers.worker_main", "sie.connectors.worker")


def _is_replica(args: list[str]) -> bool:
    return any(m in args for m in REPLICA_MODULES)


def worker_pids(agent_pid: int) -> dict[str, int]:
    """replica id -> PID of the live worker processes an agent spawned (its direct children)."""
    found: dict[str, int] = {}
    for child in _children(agent_pid):
        args = _cmdline(child)
        if _is_replica(args) and "--replica-id" in args and pid_alive(child):
            found[args[args.index("--replica-id") + 1]] = child
    return found


# ------------------------------------------------------------------------------------------ processes


class Hosts(Protocol):
    """Where a process runs (tests/support/netns.py ``Topology``): a command prefix per node, and a loopback port
    here that reaches a port on a node's own loopback."""

    def prefix(self, name: str) -> list[str]: ...

    def forward(self, name: str, port: int) -> int: ...


@dataclass
class Proc:
    """One `sie control` or `sie agent` subprocess, its log file and (control) HTTP port."""

    name: str
    kind: str
    popen: subprocess.Popen
    log_path: Path
    port: int | None = None
    seen_workers: set[int] = field(default_factory=set)
    #: the test-network node it runs on (``Cluster(hosts=...)``), None: this host
    host: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def workers(self) -> dict[str, int]:
        found = worker_pids(self.pid) if self.alive() else {}
        self.seen_workers.update(found.values())
        return found


class Cluster:
    """Starts and stops real processes for one test (or bench run) under a unique topic prefix."""

    def __init__(self, settings: Settings, root: Path, prefix: str | None = None,
                 extra_env: dict[str, str] | None = None, *, hosts: Hosts | None = None,
                 cli_host: str | None = None) -> None:
        from sie.kernel.admin import ensure_topics
        from sie.kernel.topics import system_topics

        self.prefix = prefix or f"e2e{uuid.uuid4().hex[:8]}"
        self.settings = settings.with_overrides(topic_prefix=self.prefix)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        #: more environment for every process started from now on (e.g. SIE_ALLOWED_MODULES of a test's own
        #: model packages, SIE_ADVERTISE_HOST)
        self.extra_env: dict[str, str] = dict(extra_env or {})
        self.hosts, self.cli_host = hosts, cli_host
        ensure_topics(self.settings, system_topics(self.prefix))

    # -- environment -------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
               "SIE_TOPIC_PREFIX": self.prefix, "PYTHONUNBUFFERED": "1"}
        # The control planes accept the harness's known tokens (no token file written into ~/.cache);
        # `sie` CLI commands run by the harness send the operator token.
        env["SIE_API_TOKENS"] = json.dumps([e.model_dump() for e in with_api_tokens(self.settings).api_tokens])
        env["SIE_API_TOKEN"] = OPERATOR_TOKEN
        # The demo models' code (examples/models) is installed on these nodes, as a user's model package
        # would be: a spec POSTed without a file (no directory to search) still finds its callable.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "examples"), env.get("PYTHONPATH", "")) if p)
        env.update(self.extra_env)
        return env

    def _where(self, host: str | None) -> list[str]:
        if host is None:
            return []
        if self.hosts is None:
            raise ValueError(f"host={host!r}: this Cluster has no test network (Cluster(hosts=...))")
        return self.hosts.prefix(host)

    def _spawn(self, name: str, kind: str, args: list[str], port: int | None = None,
               env: dict[str, str] | None = None, cwd: Path | None = None, host: str | None = None) -> Proc:
        log_path = self.root / f"{kind}-{name}-{len(self.procs)}.log"
        log = open(log_path, "wb")
        try:
            popen = subprocess.Popen([*self._where(host), sys.executable, "-m", "sie", *args], cwd=cwd or REPO,
                                     env={**self.env, **(env or {})},
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        if host is not None and port is not None:
            port = self.hosts.forward(host, port)  # type: ignore[union-attr] - _where checked it
        proc = Proc(name, kind, popen, log_path, port, host=host)
        self.procs.append(proc)
        return proc

    def start_control(self, instance: str, *, node_timeout: float | None = None, extra: Iterable[str] = (),
                      host: str | None = None) -> Proc:
        port = free_port()
        args = ["control", "--http-port", str(port), "--http-host", "127.0.0.1", "--instance", instance,
                "--no-ensure-topics"]
        if node_timeout is not None:
            args += ["--node-timeout", str(node_timeout)]
        return self._spawn(instance, "control", args + list(extra), port, host=host)

    def start_agent(self, node: str, *, gpus: str | None = "1xL4-24GB", tier: str | None = None,
                    labels: str | None = None, heartbeat_s: float = 2.0, extra: Iterable[str] = (),
                    env: dict[str, str] | None = None, cwd: Path | None = None, host: str | None = None) -> Proc:
        args = ["agent", "--node", node, "--heartbeat-s", str(heartbeat_s), "--work-dir", str(self.root / "agents"),
                "--drain-grace-s", "5"]
        if gpus:
            args += ["--simulate-gpus", gpus]
        if tier:
            args += ["--tier", tier]
        if labels:
            args += ["--labels", labels]
        return self._spawn(node, "agent", args + list(extra), env=env, cwd=cwd, host=host)

    def sie(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run one `sie` CLI command against this cluster (its prefix and broker)."""
        return subprocess.run([*self._where(self.cli_host), sys.executable, "-m", "sie", *args], cwd=REPO,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    # -- specs ---------------------------------------------------------------------------------------

    def write_spec(self, example: str, *, name: str | None = None, replicas: int | None = None,
                   **spec_changes: Any) -> Path:
        """Copy examples/<example>.yaml into this cluster's dir with changes (article document style).

        ``replicas`` sets sla.min_replicas/max_replicas; ``spec_changes`` are merged into ``spec``
        one level deep (e.g. ``resources={"cpu": 0.5}``). Relative artifact paths are made absolute.
        """
        src = REPO / "examples" / f"{example}.yaml"
        doc = yaml.safe_load(src.read_text())
        spec = doc["spec"]
        if name is not None:
            doc["metadata"]["name"] = name
            spec["model"]["name"] = name
        if replicas is not None:
            spec["sla"]["min_replicas"] = spec["sla"]["max_replicas"] = replicas
        for key, value in spec_changes.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        artifact = spec["backend"].get("artifact")
        if artifact and not Path(artifact).is_absolute():
            spec["backend"]["artifact"] = str((src.parent / artifact).resolve())
        path = self.root / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def spec_topics(self, model: str) -> dict[str, str]:
        from sie.kernel.names import ModelTopics

        t = ModelTopics.default_for(model, self.prefix)
        return {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters}

    # -- control plane ---------------------------------------------------------------------------------

    def controls(self) -> list[Proc]:
        return [p for p in self.procs if p.kind == "control" and p.alive()]

    def agents(self) -> list[Proc]:
        return [p for p in self.procs if p.kind == "agent" and p.alive()]

    def agent(self, node: str) -> Proc:
        return next(p for p in reversed(self.procs) if p.kind == "agent" and p.name == node)

    def leader(self) -> Proc | None:
        for p in self.controls():
            health = try_get(p.port, "/healthz")
            if health and health.get("role") == "leader" and health.get("state_caught_up", True):
                return p
        return None

    def wait_leader(self, timeout: float = 60) -> Proc:
        return wait_for(self.leader, timeout, lambda: "a leading control plane; logs:\n" + self.logs("control"))

    def api(self) -> int:
        """Port of a live control plane (the leader if there is one)."""
        lead = self.leader()
        if lead is not None:
            return lead.port
        live = self.controls()
        if not live:
            raise AssertionError("no control plane is running")
        return live[0].port

    def model(self, name: str, port: int | None = None) -> dict | None:
        return try_get(port or self.api(), f"/v1/models/{name}")

    def ready_model(self, name: str, replicas: int, port: int | None = None) -> dict | None:
        """The model's status when it is Ready with ``replicas`` READY replicas, else None."""
        m = self.model(name, port)
        if not m or m.get("phase") != "Ready" or m.get("ready_replicas") != replicas:
            return None
        if any(r["state"] != "READY" for r in m["replicas"]):
            return None
        return m

    def settled(self, name: str, version: str, replicas: int) -> dict | None:
        """The model's status once it is Ready with exactly ``replicas`` READY replicas, all at ``version``."""
        m = self.ready_model(name, replicas)
        if not m or len(m["replicas"]) != replicas or any(r["version"] != version for r in m["replicas"]):
            return None
        return m

    def post_model(self, doc: dict) -> dict:
        """POST a ModelService document to the control API (202 expected: AssertionError otherwise)."""
        status, body = http(self.api(), "POST", "/v1/models", yaml.safe_dump(doc))
        assert status == 202, f"POST /v1/models: {status} {body}"
        return body

    def wait_ready(self, name: str, replicas: int, timeout: float = 90, port: int | None = None) -> dict:
        return wait_for(lambda: self.ready_model(name, replicas, port), timeout,
                        lambda: f"{name} Ready with {replicas} replicas; status {self.model(name, port)}\n"
                                + self.logs())

    def placement(self, name: str, port: int | None = None) -> dict[str, str]:
        """replica id -> node from the model's status."""
        m = self.model(name, port) or {}
        return {r["replica_id"]: r["node"] for r in m.get("replicas", [])}

    def all_workers(self) -> dict[str, tuple[str, int]]:
        """replica id -> (node, pid) over every live agent."""
        out: dict[str, tuple[str, int]] = {}
        for a in self.agents():
            for rid, pid in a.workers().items():
                out[rid] = (a.name, pid)
        return out

    def logs(self, kind: str | None = None, lines: int = 25) -> str:
        return "\n".join(f"--- {p.kind} {p.name} (pid {p.pid}, rc {p.popen.poll()})\n{p.log_tail(lines)}"
                         for p in self.procs if kind is None or p.kind == kind)

    # -- teardown ------------------------------------------------------------------------------------

    def stop(self, proc: Proc, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Signal one process by PID and wait for it; SIGKILL after ``timeout``."""
        proc.workers()
        proc.kill(sig)
        try:
            return proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill(signal.SIGKILL)
            return proc.popen.wait(10)

    def close(self) -> None:
        """SIGTERM every process we started (agents first: they drain their workers), then SIGKILL
        whatever is left, workers included (only PIDs this harness saw as children of its agents)."""
        for p in self.procs:
            if p.alive():
                p.workers()
        for kind in ("agent", "control"):
            live = [p for p in self.procs if p.kind == kind and p.alive()]
            for p in live:
                p.kill(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for p in live:
                try:
                    p.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill(signal.SIGKILL)
                    p.popen.wait(10)
        for p in self.procs:
            for pid in p.seen_workers:
                if pid_alive(pid) and _is_replica(_cmdline(pid)):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ------------------------------------------------------------------------------------- request traffic


class RequestStream:
    """Produces requests to one topic at a steady rate from a thread; remembers id -> partition.

    Every request id is unique (``<tag>-<n>``); delivery reports give the partition, so a result can be
    traced back to the request partition it came from (stall per partition).
    """

    def __init__(self, settings: Settings, topic: str, example: dict[str, Any], tag: str, rate_per_s: float = 20.0,
                 keys: int | None = None, vary: Callable[[int], dict[str, Any]] | None = None) -> None:
        """``keys``: the record key repeats over this many keys (``<tag>-k<n % keys>``, so a key's answers over
        time can be compared); default: the request id is the key.  ``vary``: request n's inputs are the example
        updated with ``vary(n)`` (e.g. a field that makes 1 row in 20 one a bad version cannot score)."""
        from confluent_kafka import Producer

        self.topic, self.example, self.tag, self.rate, self.keys = topic, example, tag, rate_per_s, keys
        self.vary = vary
        self._producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True,
                                                                  "linger.ms": 5}))
        self.partition_of: dict[str, int] = {}
        self.errors: list[str] = []
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _delivered(self, err: Any, msg: Any, rid: str | None = None) -> None:
        rid = rid or msg.key().decode()
        with self._lock:
            if err is not None:
                self.errors.append(f"{rid}: {err}")
            else:
                self.partition_of[rid] = msg.partition()

    def send(self, count: int) -> list[str]:
        """Produce ``count`` requests now (synchronously flushed); AssertionError if any is not delivered."""
        ids = [self._produce_one() for _ in range(count)]
        left = self._producer.flush(30)
        if left or self.errors:
            raise AssertionError(f"producing to {self.topic}: {left} undelivered, errors {self.errors[:3]}")
        return ids

    def _produce_one(self) -> str:
        rid = f"{self.tag}-{self._n}"
        self._n += 1
        inputs = {**self.example, "amount": float(10 + self._n % 5000)}
        if self.vary is not None:
            inputs.update(self.vary(self._n))
        key = f"{self.tag}-k{(self._n - 1) % self.keys}" if self.keys else rid
        self._producer.produce(self.topic, json.dumps({"id": rid, "inputs": inputs}).encode(), key=key.encode(),
                               on_delivery=lambda err, msg, rid=rid: self._delivered(err, msg, rid))
        self._producer.poll(0)
        return rid

    def start(self) -> RequestStream:
        self._thread = threading.Thread(target=self._run, name=f"stream-{self.tag}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._produce_one()
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> int:
        """Stop producing, flush; returns how many were sent in all."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        left = self._producer.flush(30)
        if left or self.errors:
            raise AssertionError(f"producing to {self.topic}: {left} undelivered, errors {self.errors[:3]}")
        return self._n

    @property
    def sent(self) -> int:
        return self._n


class ResultTail:
    """read_committed tail of a model's results and dead-letter topics in a thread.

    ``arrivals[id]`` = list of (monotonic arrival time, topic kind) per request id: more than one entry
    is a duplicate; none is a loss.  Call ``read_to_end()`` before ``audit`` so a duplicate committed after
    the awaited count is seen.
    """

    def __init__(self, settings: Settings, topics: dict[str, str], **consumer_overrides: Any) -> None:
        """``consumer_overrides``: more librdkafka properties of the tail's consumer (the fault campaign gives
        it short request timeouts, so the instrument is not what stalls when a broker freezes)."""
        from confluent_kafka import Consumer, TopicPartition

        from sie.kernel.admin import ensure_model_topics

        ensure_model_topics(settings, [topics["requests"], topics["results"], topics["dead_letters"]],
                            settings.request_partitions)
        self.kinds = {topics["results"]: "result", topics["dead_letters"]: "dlq"}
        self.arrivals: dict[str, list[tuple[float, str]]] = {}
        self.order: list[tuple[float, str]] = []
        #: request id -> the partition its first output landed on (a scorer answers on the request's partition)
        self.output_partition: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._config = settings.kafka_client_config(**{
            "group.id": f"tail-{uuid.uuid4().hex[:10]}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.partition.eof": True,
            **consumer_overrides})
        self._consumer = Consumer(self._config)
        self._partitions: dict[str, list[int]] = {}
        self._reached: dict[str, dict[int, int]] = {topic: {} for topic in self.kinds}
        for topic in self.kinds:
            self._partitions[topic] = sorted(self._consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        self._consumer.assign([TopicPartition(t, p, -2) for t, parts in self._partitions.items() for p in parts])
        self._thread = threading.Thread(target=self._run, name="result-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import KafkaError

        while not self._stop.is_set():
            for msg in self._consumer.consume(200, timeout=0.1):
                if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                    continue
                rid = None
                if msg.error() is None and msg.value() is not None:
                    try:
                        rid = str(json.loads(msg.value()).get("id"))
                    except ValueError:
                        rid = f"<unparseable {msg.topic()}:{msg.partition()}@{msg.offset()}>"
                now = time.monotonic()
                with self._lock:  # the arrival is in before the offset counts as read (read_to_end)
                    if rid is not None:
                        self.arrivals.setdefault(rid, []).append((now, self.kinds[msg.topic()]))
                        self.order.append((now, rid))
                        self.output_partition.setdefault(rid, msg.partition())
                    read_up_to(self._reached[msg.topic()], msg)

    def read_to_end(self, timeout: float = 30.0) -> None:
        """Wait until the tail has read both topics on to the end they have now (the last stable offset);
        AssertionError naming the partitions short of it at the deadline."""
        from confluent_kafka import Consumer

        probe = Consumer(self._config)  # the tail's own consumer belongs to its thread
        try:
            ends = {t: end_offsets(probe, t, parts) for t, parts in self._partitions.items()}
        finally:
            probe.close()

        def short() -> dict[str, dict[int, str]]:
            with self._lock:
                return {t: b for t in ends if (b := behind(self._reached[t], ends[t]))}

        wait_until(lambda: not short(), timeout,
                   message=lambda: f"the result tail to read to the end (read up to/end: {short()})")

    def count(self, ids: Iterable[str] | None = None) -> int:
        with self._lock:
            if ids is None:
                return len(self.arrivals)
            return sum(1 for i in ids if i in self.arrivals)

    def first_after(self, t: float) -> float | None:
        with self._lock:
            return next((at for at, _ in self.order if at > t), None)

    def audit(self, ids: Iterable[str]) -> tuple[list[str], dict[str, int], list[str]]:
        """(lost ids, duplicated id -> count, ids that are not ours) for the given request ids."""
        wanted = set(ids)
        with self._lock:
            lost = sorted(i for i in wanted if i not in self.arrivals)
            dups = {i: len(v) for i, v in self.arrivals.items() if len(v) > 1}
            stray = sorted(i for i in self.arrivals if i not in wanted)
        return lost, dups, stray

    def stalls(self, partition_of: dict[str, int], start: float, end: float) -> dict[int, float]:
        """Per request partition: the longest gap between consecutive result arrivals in [start, end]
        (the window edges count as arrivals, so a partition silent since ``start`` shows the whole gap)."""
        with self._lock:
            times: dict[int, list[float]] = {}
            for at, rid in self.order:
                p = partition_of.get(rid)
                if p is not None and start <= at <= end:
                    times.setdefault(p, []).append(at)
        out: dict[int, float] = {}
        for p in set(partition_of.values()):
            seq = [start, *sorted(times.get(p, [])), end]
            out[p] = max(b - a for a, b in zip(seq, seq[1:]))
        return out

    def gaps(self, start: float, end: float, partition_of: dict[str, int] | None = None
             ) -> tuple[float, dict[int, float]]:
        """(the longest gap between consecutive committed outputs of any partition, the longest per request
        partition) in [start, end]; the window edges count as arrivals, so silence since ``start`` shows.
        ``partition_of``: request id -> partition (``RequestStream.partition_of``); default: the partition
        each output landed on (a scorer answers on the request's partition number)."""
        with self._lock:
            times = [at for at, _ in self.order if start <= at <= end]
            where = dict(self.output_partition) if partition_of is None else partition_of
        seq = [start, *times, end]
        overall = max(b - a for a, b in zip(seq, seq[1:]))
        return overall, self.stalls(where, start, end)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def example_input(model_spec_path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(Path(model_spec_path).read_text())
    return dict(doc["spec"]["exampleInput"])


class StatusTail(TopicTail):
    """Tail of the ``replica-status`` topic (the agents' state changes, published at once, unlike the
    2 s heartbeat): ``ready_after(replica, t, node)`` = agent timestamp (epoch s) of the first READY."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, f"{settings.topic_prefix}.replica-status")

    def ready_after(self, replica_id: str, t: float, node: str | None = None) -> float | None:
        for r in self.values():
            if (r["replica_id"] == replica_id and r["state"] == "READY" and r["ts_ms"] / 1000 > t
                    and (node is None or r["node"] == node)):
                return r["ts_ms"] / 1000
        return None
