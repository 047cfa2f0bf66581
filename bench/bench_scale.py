"""The control plane at scale: real `sie control` leader + standby on a real broker, simulated agents.

    python bench/bench_scale.py                          # the default sizes (below), a private broker
    python bench/bench_scale.py --sizes 200x1000         # one size: NODESxMODELS
    python bench/bench_scale.py --bootstrap 127.0.0.1:9092 --sizes 5x10 --no-write    # an existing broker
    python bench/bench_scale.py --profile-leader 20      # py-spy the leader for 20 s in the steady window

Per size (NODESxMODELS, each model ``--replicas`` fixed replicas, half on a shared GPU, half CPU-only, P0/P1/P2
mixed), on a fresh topic prefix:

1. simulated agents (``bench/scale_sim.py``: many nodes per process, the agent's own records and client
   configurations) register and heartbeat; two `sie control` processes start (leader + warm standby);
2. **populate**: every model applied through ``POST /v1/models`` (4 at a time), until all are Ready;
3. **steady window** (``--window`` s, nothing applied): leader and standby CPU (seconds of CPU per second) and
   RSS, reconcile pass time (the leader's ``sie_control_reconcile_seconds``), records/s and bytes/s per
   topic (a read_committed tail of every system topic), the simulators' and the broker's CPU;
4. **probes**: ``--probes`` new models applied one every ``--probe-interval`` s: apply -> assignment visible
   to agents (read_committed) -> Ready in ModelStatus (every replica READY), p50/p99;
5. **API**: ``/v1/replicas``, ``/v1/models``, ``/v1/nodes`` whole, the status page's refresh (its six routes, a page of 100 each),
   ``sie get replicas`` (from Kafka, and through the API);
6. **agent restart**: the real agent (``sie.workers.agent.loop.Agent``, no worker launched) of the busiest node
   replays the assignments topic to its end and takes its replica set;
7. **leader SIGKILL**: kill -> the standby elected -> its first acting pass; then that no assignment changed
   (every node's replica set, byte for byte apart from the epoch), no placed/moved/removed event and no
   simulated replica started or drained;
8. **node loss** (the busiest node stops heartbeating, its replicas die): last heartbeat -> node_offline ->
   every replica assigned elsewhere -> every model Ready again;
9. **cold start**: a third `sie control` from nothing -> its state caught up (what a restart replays);
10. **topic sizes**: every system topic read from its beginning: records and bytes a reader replays, distinct
    keys and the bytes of the latest value per key (what compaction would leave).

The machine is shared: every CPU figure is CPU seconds (from /proc), reported with the load average.  Each size
stops itself (``--size-timeout``).  Results: bench/results/scale.txt and scale.json, with the growth per
doubling of nodes and of models.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_sim import SimConfig, sim_main  # noqa: E402

DEFAULT_SIZES = "50x1000,100x1000,200x1000,200x100,200x500"
TARGETS = {"apply_to_assignment_p99_s": 2.0, "takeover_s": 10.0}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ helpers


def percentile(values: Iterable[float], q: float) -> float | None:
    data = sorted(values)
    if not data:
        return None
    k = (len(data) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def summary(values: Iterable[float]) -> dict[str, Any]:
    data = list(values)
    if not data:
        return {"n": 0}
    return {"n": len(data), "p50": round(percentile(data, 0.5) or 0, 3), "p99": round(percentile(data, 0.99) or 0, 3),
            "max": round(max(data), 3)}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)  # polling a condition with a deadline (a bench, not a test)


def proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def proc_mem_mb(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {"rss_mb": round(out.get("VmRSS", 0.0), 1), "hwm_mb": round(out.get("VmHWM", 0.0), 1)}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def model_doc(name: str, i: int, replicas: int, version: str = "1.0.0") -> dict[str, Any]:
    """A model of the mix: every other one on a shared GPU (4, 8 or 12 GiB), the rest CPU-only; each replica 1.5 CPU
    and 2 GiB host memory (+ the process overhead placement adds); P0 10 %, P1 30 %, P2 60 %.  On the simulated
    nodes (8x A100-80GB, 128 CPUs, 1 TiB) binpack puts ~85 replicas on a node (CPU-bound): 3,000 replicas fill
    ~36 nodes, 71 % of 50 nodes."""
    priority = "P0" if i % 10 == 0 else "P1" if i % 10 in (1, 4, 7) else "P2"
    gpu_mb = 4096 * (1 + (i // 2) % 3) if i % 2 else 0
    return {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": version}, "priorityLevel": priority,
                     "serviceType": "classification",
                     "backend": {"type": "python", "callable": "models.fraud.rules:score"},
                     "resources": {"gpuMemoryMb": gpu_mb, "cpu": 1.5, "memoryMb": 2048},
                     "inputSchema": {"type": "json", "fields": [{"name": "amount", "type": "float"},
                                                                {"name": "hour", "type": "int", "range": [0, 23]}]},
                     "outputSchema": {"type": "json", "fields": [{"name": "risk_score", "type": "float"}]},
                     "sla": {"p99_latency_ms": 100, "min_replicas": replicas, "max_replicas": replicas}}}


# ------------------------------------------------------------------------------------------ the broker


class Broker:
    """A private single-node broker (``LocalKafka`` on free ports, data on /dev/shm when it exists) or one given."""

    def __init__(self, bootstrap: str | None, tmp: Path) -> None:
        self.kafka: Any = None
        self.pid: int | None = None
        self.data: Path | None = None  # the private broker's log directories (on-disk topic sizes)
        if bootstrap:
            self.bootstrap = bootstrap
            return
        from sie.infra.kafka.local import LocalKafka, free_base_port
        from sie.kernel.settings import Settings

        shm = Path("/dev/shm")
        data = Path(tempfile.mkdtemp(prefix="sie-scale-kafka-", dir=shm if shm.is_dir() else None))
        self._data = data
        self.kafka = LocalKafka(Settings(), brokers=1, base_port=free_base_port(2), data_dir=data)
        self.bootstrap = self.kafka.up(timeout=180)
        state = json.loads(self.kafka.state_file.read_text())
        self.pid = int(next(iter(state["pids"].values())))
        self.data = data
        log(f"private broker at {self.bootstrap} (pid {self.pid}, data in {data})")

    def close(self) -> None:
        if self.kafka is not None:
            try:
                self.kafka.down(wipe=True)
            except Exception as exc:  # noqa: BLE001 - best effort
                log(f"broker shutdown: {exc}")
            shutil.rmtree(self._data, ignore_errors=True)


# ------------------------------------------------------------------------------------------ control planes


class ControlProc:
    """One `sie control` process of this run."""

    def __init__(self, run: SizeRun, instance: str) -> None:
        self.run, self.instance = run, instance
        self.port = _free_port()
        self.log_path = run.tmp / f"{instance}.log"
        nice = run.args.control_nice
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sie", "control", "--http-port", str(self.port), "--instance", instance,
                 "--no-ensure-topics", *run.args.control_args],
                cwd=ROOT, env=run.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, timeout: float = 30.0) -> tuple[Any, float, int]:
        """(parsed JSON or text, seconds, bytes)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     headers={"Authorization": f"Bearer {self.run.viewer}"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            kind = resp.headers.get("Content-Type", "")
        took = time.perf_counter() - t0
        return (json.loads(raw) if kind.startswith("application/json") else raw.decode()), took, len(raw)

    def health(self) -> dict[str, Any] | None:
        try:
            return self.get("/healthz", timeout=5)[0]
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def post(self, doc: dict[str, Any], timeout: float = 60.0) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/models", data=json.dumps(doc).encode(),
                                     method="POST", headers={"Authorization": f"Bearer {self.run.operator}",
                                                             "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"POST {doc['metadata']['name']}: {exc.code} {exc.read()[:300]!r}") from None

    def metric(self, name: str) -> dict[str, float]:
        """Every sample of a metric family from /metrics: {'<name><suffix>{labels}': value}."""
        text = self.get("/metrics")[0]
        out = {}
        for line in text.splitlines():
            if line.startswith(name):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def cpu_s(self) -> float | None:
        return proc_cpu_s(self.pid)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait(5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ the tail


@dataclass
class TopicCount:
    records: int = 0
    bytes: int = 0


class Tail:
    """One read_committed consumer over every system topic of the run, from the beginning.

    Counts records and bytes (key + value) per topic; decodes assignments (each node's latest replica set and
    when each replica id was first visible in one), model-status (when each model version was first Ready with
    every replica READY) and events."""

    def __init__(self, settings: Any) -> None:
        from sie.kernel.clients import KafkaClients, state_reader_config
        from sie.kernel.names import SYSTEM_TOPICS

        self.names = {settings.names.system_topic(s): s for s in SYSTEM_TOPICS}
        self.counts: dict[str, TopicCount] = {s: TopicCount() for s in SYSTEM_TOPICS}
        self.consumer = KafkaClients().consumer(state_reader_config(
            settings, f"{settings.topic_prefix}.bench-tail", "bench-tail", partition_eof=False))
        self.lock = threading.Lock()
        #: node -> its latest Assignment: ((replica_id, version, gpu_indices, gpu_memory_mb, spec_json, companions)...)
        self.assignment: dict[str, tuple] = {}
        self.assignment_epoch: dict[str, int] = {}
        #: replica id -> (first visible, node), and its latest node; the leader's stamp (CreateTime) of that record
        self.first_assigned: dict[str, float] = {}
        self.first_stamped: dict[str, float] = {}
        #: model -> when its latest spec record was visible
        self.spec_seen: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        #: model -> version -> first time Ready with ready == desired > 0; model -> latest (phase, desired, ready)
        self.ready_at: dict[str, dict[str, float]] = {}
        self.status: dict[str, tuple[str, int, int]] = {}
        self.events: list[tuple[float, str, str | None, str | None, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-tail", daemon=True)

    def start(self) -> Tail:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        meta = self.consumer.list_topics(timeout=10)
        parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in self.names if t in meta.topics
                 for p in meta.topics[t].partitions]
        self.consumer.assign(parts)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()

    def snapshot_counts(self) -> dict[str, TopicCount]:
        with self.lock:
            return {k: TopicCount(v.records, v.bytes) for k, v in self.counts.items()}

    def _run(self) -> None:
        from sie.schemas.avro_codec import decode

        while not self._stop.is_set():
            for msg in self.consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is not None:
                    continue
                now = time.time()
                suffix = self.names.get(msg.topic(), "")
                key, value = msg.key() or b"", msg.value()
                with self.lock:
                    c = self.counts[suffix]
                    c.records += 1
                    c.bytes += len(key) + len(value or b"")
                    if value is None:
                        continue
                    if suffix == "assignments":
                        self._assignment(key.decode(), decode(value), now, msg.timestamp()[1] / 1000)
                    elif suffix == "specs":
                        self.spec_seen[key.decode()] = now
                    elif suffix == "model-status":
                        self._status(decode(value), now)
                    elif suffix == "events":
                        e = decode(value)
                        self.events.append((now, e["kind"], e.get("replica_id"), e.get("node"), e.get("detail") or ""))

    def _assignment(self, node: str, record: dict[str, Any], now: float, stamped: float) -> None:
        replicas = tuple(sorted((r["replica_id"], r["version"], tuple(r["gpu_indices"]), r["gpu_memory_mb"],
                                 r["spec_json"], tuple(r.get("companions") or ())) for r in record["replicas"]))
        self.assignment[node] = replicas
        self.assignment_epoch[node] = int(record.get("epoch") or 0)
        for r in replicas:
            if r[0] not in self.first_assigned:
                self.first_assigned[r[0]] = now
                self.first_stamped[r[0]] = stamped
            self.node_of[r[0]] = node

    def _status(self, record: dict[str, Any], now: float) -> None:
        name, desired, ready = record["name"], int(record["desired_replicas"]), int(record["ready_replicas"])
        self.status[name] = (record["phase"], desired, ready)
        if record["phase"] == "Ready" and desired > 0 and ready == desired:
            self.ready_at.setdefault(name, {}).setdefault(record["version"], now)

    # -- queries ---------------------------------------------------------------------------------------

    def assigned_at(self, model: str, replicas: int) -> float | None:
        with self.lock:
            times = [self.first_assigned.get(f"{model}-{i}") for i in range(replicas)]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)

    def ready(self, model: str, version: str = "1.0.0") -> float | None:
        with self.lock:
            return self.ready_at.get(model, {}).get(version)

    def events_since(self, t: float, kinds: Iterable[str]) -> list[tuple]:
        wanted = set(kinds)
        with self.lock:
            return [e for e in self.events if e[0] >= t and e[1] in wanted]


# ------------------------------------------------------------------------------------------ simulators


class Sims:
    """The simulator processes (``bench/scale_sim.py``), one pipe each."""

    def __init__(self, run: SizeRun, nodes: list[str], processes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        self.node_pipe: dict[str, Any] = {}
        chunks = [nodes[i::processes] for i in range(processes)]
        env = (("SIE_CACHE_DIR", str(run.tmp / "cache")),)
        for i, chunk in enumerate(chunks):
            parent, child = ctx.Pipe()
            cfg = SimConfig(run.bootstrap, run.prefix, tuple(chunk), index=i, heartbeat_s=run.args.heartbeat_s,
                            start_s=run.args.start_s, seed=run.args.seed, extra_env=env)
            p = ctx.Process(target=sim_main, args=(cfg, child, self.stop_event), name=f"sim-{i}", daemon=True)
            p.start()
            self.procs.append(p)
            self.pipes.append(parent)
            for n in chunk:
                self.node_pipe[n] = parent
        for proc, pipe in zip(self.procs, self.pipes):
            deadline = time.monotonic() + 180
            while not pipe.poll(1):
                if not proc.is_alive():
                    raise RuntimeError(f"simulator {proc.name} died before registering its nodes (exit {proc.exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"simulator {proc.name} did not register its nodes within 180 s")
            kind, _ = pipe.recv()
            assert kind == "ready", kind

    def ask(self, pipe: Any, cmd: str, arg: Any = None) -> Any:
        pipe.send((cmd, arg))
        if not pipe.poll(60):
            raise TimeoutError(f"simulator did not answer {cmd!r}")
        return pipe.recv()[1]

    def stats(self) -> list[dict[str, Any]]:
        return [self.ask(p, "stats") for p in self.pipes]

    def mark(self) -> None:
        for p in self.pipes:
            self.ask(p, "mark")

    def kill_node(self, node: str) -> float:
        return float(self.ask(self.node_pipe[node], "kill", node))

    def cpu_s(self) -> float:
        return sum(s["cpu_s"] for s in self.stats())

    def close(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            p.join(15)
            if p.is_alive():
                p.kill()


# ------------------------------------------------------------------------------------------ one size


@dataclass
class SizeRun:
    args: argparse.Namespace
    bootstrap: str
    nodes: int
    models: int
    broker_pid: int | None = None
    broker_data: Path | None = None
    prefix: str = field(default_factory=lambda: f"scale{uuid.uuid4().hex[:8]}")
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sie-scale-")))
    operator: str = field(default_factory=lambda: "sie_" + secrets.token_urlsafe(32))
    viewer: str = field(default_factory=lambda: "sie_" + secrets.token_urlsafe(32))
    result: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from sie.kernel.settings import ApiTokenEntry, Settings

        tokens = [ApiTokenEntry(name=r, role=r, sha256=hashlib.sha256(t.encode()).hexdigest())
                  for r, t in (("operator", self.operator), ("viewer", self.viewer))]
        self.settings = Settings().with_overrides(bootstrap_servers=self.bootstrap, topic_prefix=self.prefix,
                                                  api_tokens=tokens, cache_dir=self.tmp / "cache")
        self.env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": self.bootstrap, "SIE_TOPIC_PREFIX": self.prefix,
                    "SIE_API_TOKENS": json.dumps([e.model_dump() for e in tokens]),
                    "SIE_CACHE_DIR": str(self.tmp / "cache"), "PYTHONPATH": str(ROOT)}
        self.env.pop("SIE_API_TOKEN", None)
        self.controls: list[ControlProc] = []
        self.sims: Sims | None = None
        self.tail: Tail | None = None
        self.node_names = [f"node-{i:03d}" for i in range(self.nodes)]
        self.model_names = [f"m{i:04d}" for i in range(self.models)]

    # -- lifecycle ---------------------------------------------------------------------------------------

    def leader(self) -> ControlProc | None:
        for c in self.controls:
            if c.alive() and (c.health() or {}).get("role") == "leader":
                return c
        return None

    def standby(self) -> ControlProc | None:
        lead = self.leader()
        return next((c for c in self.controls if c.alive() and c is not lead), None)

    def execute(self) -> dict[str, Any]:
        from sie.kernel.admin import ensure_topics
        from sie.kernel.topics import system_topics

        r = self.result
        r.update(nodes=self.nodes, models=self.models, replicas=self.models * self.args.replicas,
                 heartbeat_s=self.args.heartbeat_s, load_start=loadavg(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
        t0 = time.time()
        ensure_topics(self.settings, system_topics(self.prefix))
        self.tail = Tail(self.settings).start()
        procs = self.args.sim_processes or max(1, math.ceil(self.nodes / 100))
        self.sims = Sims(self, self.node_names, procs)
        r["sim_processes"] = procs
        log(f"{self.nodes} nodes registered by {procs} simulator process(es)")
        self.controls = [ControlProc(self, "cp-1")]
        lead = wait_for(self.leader, 120, "a leader")
        self.controls.append(ControlProc(self, "cp-2"))
        wait_for(lambda: (self.controls[1].health() or {}).get("state_caught_up"), 120, "the standby caught up")
        log(f"leader {lead.instance} (pid {lead.pid}), standby cp-2 up")
        self.populate(lead)
        phases: list[tuple[str, Callable[[], None]]] = [
            ("steady", lambda: self.steady(lead)), ("probes", lambda: self.probes(lead)), ("api", lambda: self.api(lead)),
            ("agent_replay", self.agent_replay), ("takeover", self.takeover), ("node_loss", self.node_loss),
            ("cold_start", self.cold_start), ("topic_sizes", self.topic_sizes)]
        for name, phase in phases:  # a phase that fails is reported as such; the next ones still run
            try:
                phase()
            except Exception as exc:  # noqa: BLE001 - one phase's failure (or bug) is its result, not the run's end
                log(f"phase {name} failed: {type(exc).__name__}: {exc}")
                r[name] = {**r.get(name, {}), "error": f"{type(exc).__name__}: {exc}"}
        r["duration_s"] = round(time.time() - t0, 1)
        r["load_end"] = loadavg()
        return r

    def abort(self) -> None:
        """Stop every process of this size at once (the size's watchdog)."""
        for c in self.controls:
            c.kill()
        if self.sims is not None:
            self.sims.close()

    def close(self) -> None:
        for c in self.controls:
            c.stop()
        if self.sims is not None:
            self.sims.close()
        if self.tail is not None:
            self.tail.stop()
        if self.args.keep_logs:
            dest = Path(self.args.keep_logs) / f"{self.nodes}x{self.models}"
            dest.mkdir(parents=True, exist_ok=True)
            for f in self.tmp.glob("*.log"):
                shutil.copy(f, dest / f.name)
        with contextlib.suppress(Exception):
            from sie.kernel.admin import delete_topics
            from sie.kernel.names import SYSTEM_TOPICS

            delete_topics(self.settings, [self.settings.names.system_topic(s) for s in SYSTEM_TOPICS], timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- phases ------------------------------------------------------------------------------------------

    def populate(self, lead: ControlProc) -> None:
        from concurrent.futures import ThreadPoolExecutor

        assert self.tail is not None
        n = self.args.replicas
        applied: dict[str, float] = {}
        cpu0 = lead.cpu_s() or 0.0
        t0 = time.time()

        def apply(i: int) -> None:
            name = self.model_names[i]
            applied[name] = time.time()
            lead.post(model_doc(name, i, n))

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(apply, range(self.models)))
        t_applied = time.time()
        log(f"populate: {self.models} models applied in {t_applied - t0:.1f}s")
        timeout = self.args.populate_timeout

        def all_ready() -> bool:
            return all(self.tail.ready(m) is not None for m in self.model_names)  # type: ignore[union-attr]

        try:
            wait_for(all_ready, timeout, f"all {self.models} models Ready", interval=0.5)
        except TimeoutError:
            missing = [m for m in self.model_names if self.tail.ready(m) is None]
            log(f"populate: {len(missing)} models not Ready (e.g. {missing[:3]}: "
                f"{[self.tail.status.get(m) for m in missing[:3]]})")
            raise
        t_ready = time.time()
        assigned = {m: self.tail.assigned_at(m, n) for m in self.model_names}
        self.result["populate"] = {
            "apply_s": round(t_applied - t0, 1), "applies_per_s": round(self.models / max(1e-9, t_applied - t0), 1),
            "all_assigned_s": round(max(a for a in assigned.values() if a is not None) - t0, 1),
            "all_ready_s": round(t_ready - t0, 1),
            "apply_to_assigned_s": summary(assigned[m] - applied[m] for m in self.model_names if assigned[m]),
            "leader_cpu_s": round((lead.cpu_s() or 0.0) - cpu0, 1),
        }
        with self.tail.lock:
            used = [len(a) for a in self.tail.assignment.values() if a]
        self.result["populate"].update(nodes_in_use=len(used), most_replicas_on_a_node=max(used, default=0))
        log(f"populate: all Ready {t_ready - t0:.1f}s after the first apply; {self.result['populate']}")

    def steady(self, lead: ControlProc) -> None:
        assert self.tail is not None and self.sims is not None
        time.sleep(self.args.settle)  # let the last statuses land (a bench pause, not synchronisation)
        window = self.args.window
        standby = self.standby()
        counts0 = self.tail.snapshot_counts()
        cpu0 = {"leader": lead.cpu_s(), "standby": standby.cpu_s() if standby else None,
                "sims": self.sims.cpu_s(), "broker": proc_cpu_s(self.broker_pid) if self.broker_pid else None}
        rec0 = lead.metric("sie_control_reconcile_")
        load0 = loadavg()
        t0 = time.time()
        profile = None
        if self.args.profile_leader:
            profile = self._profile(lead, min(self.args.profile_leader, window))
        time.sleep(max(0.0, window - (time.time() - t0)))
        took = time.time() - t0
        counts1 = self.tail.snapshot_counts()
        cpu1 = {"leader": lead.cpu_s(), "standby": standby.cpu_s() if standby else None,
                "sims": self.sims.cpu_s(), "broker": proc_cpu_s(self.broker_pid) if self.broker_pid else None}
        rec1 = lead.metric("sie_control_reconcile_")
        cpu = {k: round((cpu1[k] - cpu0[k]) / took, 3) for k in cpu0 if cpu0[k] is not None and cpu1[k] is not None}
        passes = rec1.get("sie_control_reconcile_seconds_count", 0) - rec0.get("sie_control_reconcile_seconds_count", 0)
        total = rec1.get("sie_control_reconcile_seconds_sum", 0) - rec0.get("sie_control_reconcile_seconds_sum", 0)
        cpu_key = "sie_control_reconcile_cpu_seconds_total"
        pass_cpu = rec1.get(cpu_key, 0) - rec0.get(cpu_key, 0)
        buckets = sorted((float(k.split('le="')[1].split('"')[0]), rec1[k] - rec0.get(k, 0))
                         for k in rec1 if k.startswith("sie_control_reconcile_seconds_bucket") and 'le="+Inf"' not in k)
        p99_bucket = next((le for le, c in buckets if passes and c >= 0.99 * passes), None)
        topics = {}
        for name, c1 in counts1.items():
            c0 = counts0[name]
            if c1.records - c0.records:
                topics[name] = {"records_per_s": round((c1.records - c0.records) / took, 1),
                                "bytes_per_s": round((c1.bytes - c0.bytes) / took)}
        health = lead.health() or {}
        self.result["steady"] = {
            "window_s": round(took, 1), "load": [load0, loadavg()],
            "cpu_cores": cpu,
            "leader_mem": proc_mem_mb(lead.pid), "standby_mem": proc_mem_mb(standby.pid) if standby else None,
            "reconcile": {"passes": int(passes), "per_s": round(passes / took, 2),
                          "mean_s": round(total / passes, 3) if passes else None, "p99_bucket_le_s": p99_bucket,
                          # None: a control plane without the metric (before it existed)
                          "cpu_mean_s": round(pass_cpu / passes, 3) if passes and cpu_key in rec1 else None,
                          "last_pass_ms": health.get("subsystems", {}).get("reconcile_loop", {}).get("last_pass_ms")},
            "topics": topics,
            "total": {"records_per_s": round(sum(t["records_per_s"] for t in topics.values()), 1),
                      "bytes_per_s": sum(t["bytes_per_s"] for t in topics.values())},
        }
        if profile is not None:
            self.result["steady"]["profile"] = profile
        log(f"steady: {json.dumps(self.result['steady'])[:600]}")

    def _profile(self, lead: ControlProc, seconds: float) -> dict[str, Any] | None:
        """py-spy's view of the leader (``--profile-leader``): the functions the thread holding the GIL (running
        Python) spent its samples in (leaf frames) and under (inclusive), from a sampling of ``seconds``."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            log("py-spy not installed (pip install py-spy): no profile")
            return None
        raw = self.tmp / f"profile-{self.nodes}x{self.models}.collapsed"
        cmd = [spy, "record", "--pid", str(lead.pid), "--duration", str(int(seconds)), "--format", "raw",
               "--output", str(raw), "--rate", "50", "--nonblocking", "--gil"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        if done.returncode != 0 or not raw.exists():
            log(f"py-spy failed: {done.stderr[-300:]}")
            return None
        return profile_summary(raw.read_text())

    def probes(self, lead: ControlProc) -> None:
        assert self.tail is not None
        n = self.args.replicas
        applied: dict[str, float] = {}
        for k in range(self.args.probes):
            name = f"probe{k:03d}"
            t = time.time()
            applied[name] = t
            lead.post(model_doc(name, self.models + k, n))
            time.sleep(max(0.0, self.args.probe_interval - (time.time() - t)))
        try:
            wait_for(lambda: all(self.tail.ready(m) for m in applied), self.args.phase_timeout,  # type: ignore[union-attr]
                     "every probe Ready", interval=0.2)
        except TimeoutError as exc:
            log(f"probes: {exc}; reporting those that got there")
        assigned = {m: self.tail.assigned_at(m, n) for m in applied}
        ready = {m: self.tail.ready(m) for m in applied}
        with self.tail.lock:  # where the time went: spec visible, assignment produced by the leader, visible
            spec_seen = {m: self.tail.spec_seen.get(m) for m in applied}
            stamped = {m: max((self.tail.first_stamped.get(f"{m}-{i}") or 0.0) for i in range(n)) for m in applied}
        self.result["probes"] = {
            "n": len(applied), "interval_s": self.args.probe_interval,
            "not_assigned": sum(1 for a in assigned.values() if a is None),
            "not_ready": sum(1 for a in ready.values() if a is None),
            "apply_to_assignment_s": summary(assigned[m] - applied[m] for m in applied if assigned[m]),  # type: ignore[operator]
            "apply_to_ready_s": summary(ready[m] - applied[m] for m in applied if ready[m]),  # type: ignore[operator]
            "split_s": {
                "apply_to_spec_visible": summary(spec_seen[m] - applied[m] for m in applied if spec_seen[m]),  # type: ignore[operator]
                "spec_visible_to_leader_produced": summary(stamped[m] - spec_seen[m] for m in applied  # type: ignore[operator]
                                                           if spec_seen[m] and stamped[m]),
                "produced_to_visible": summary(assigned[m] - stamped[m] for m in applied  # type: ignore[operator]
                                               if assigned[m] and stamped[m]),
            },
        }
        log(f"probes: {self.result['probes']}")

    def api(self, lead: ControlProc) -> None:
        # the whole lists, then what the status page asks for on each refresh (a page of each table: static/app.js)
        page = ["/healthz", "/v1/nodes?limit=100", "/v1/models?limit=100", "/v1/replicas?limit=100",
                "/v1/events?limit=30", "/v1/rollouts", "/status"]
        routes = ["/v1/replicas", "/v1/models", "/v1/nodes", *page]
        out: dict[str, Any] = {}
        for path in routes:
            times, size = [], 0
            for _ in range(self.args.api_repeats):
                _body, took, size = lead.get(path, timeout=120)
                times.append(took)
            out[path] = {**summary(times), "bytes": size}
        out["status_page_refresh_s"] = round(sum(out[p]["p50"] for p in page), 3)
        cli: dict[str, Any] = {}
        base = [sys.executable, "-m", "sie", "get", "replicas", "-o", "json"]
        for label, extra, env in (("kafka", [], self.env),
                                  ("api", ["--control-url", f"http://127.0.0.1:{lead.port}"],
                                   {**self.env, "SIE_API_TOKEN": self.viewer})):
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                done = subprocess.run([*base, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
                times.append(time.perf_counter() - t0)
                if done.returncode != 0:
                    raise RuntimeError(f"sie get replicas ({label}) failed: {done.stderr[-500:]}")
                rows = len(json.loads(done.stdout))
            cli[label] = {**summary(times), "rows": rows}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sie", "--help"], cwd=ROOT, env=self.env, capture_output=True, timeout=120)
        cli["cli_start_s"] = round(time.perf_counter() - t0, 3)
        out["sie_get_replicas"] = cli
        self.result["api"] = out
        log(f"api: {json.dumps(out)[:600]}")

    def busiest_node(self) -> str:
        assert self.tail is not None
        with self.tail.lock:
            return max(self.tail.assignment, key=lambda n: (len(self.tail.assignment[n]), n))  # type: ignore[union-attr]

    def agent_replay(self) -> None:
        """The real agent's start: assignments replayed to the end, its replica set taken (no worker launched)."""
        from sie.workers.agent.loop import Agent, AgentConfig

        node = self.busiest_node()
        times = []
        for _ in range(3):
            cfg = AgentConfig(node=node, simulate_gpus="8xA100-80GB", work_dir=self.tmp / "agent")
            agent = Agent(cfg, self.settings, launcher=_NoLauncher())
            t0 = time.perf_counter()
            if not agent._open(threading.Event()):  # noqa: SLF001 - its start-up, without registering or heartbeating
                raise RuntimeError(f"agent {node} could not open its clients")
            try:
                deadline = time.monotonic() + 120
                while agent.replaying or not len(agent.supervisor.table):
                    agent._poll_assignments()  # noqa: SLF001
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"agent {node} did not replay the assignments in 120 s")
                times.append(time.perf_counter() - t0)
                replicas = len(agent.supervisor.table)
            finally:
                agent._close()  # noqa: SLF001
                agent.artifacts.close()
        self.result["agent_replay"] = {"node": node, "replicas": replicas, **summary(times)}
        log(f"agent replay: {self.result['agent_replay']}")

    def takeover(self) -> None:
        assert self.tail is not None and self.sims is not None
        lead, standby = self.leader(), self.standby()
        assert lead is not None and standby is not None
        with self.tail.lock:
            before = dict(self.tail.assignment)
        self.sims.mark()
        epoch0 = (standby.health() or {}).get("epoch")
        t_kill = time.time()
        lead.kill()
        elected = wait_for(lambda: (standby.health() or {}).get("role") == "leader" and time.time(), self.args.phase_timeout,
                           "the standby elected", interval=0.05)

        def acting() -> float | None:
            h = standby.health() or {}
            last = h.get("last_reconcile_ms")
            loaded = (h.get("takeover") or {}).get("loaded_s")
            ok = loaded is not None and last and last / 1000 > t_kill and h.get("epoch") != epoch0 \
                and not str(h.get("subsystems", {}).get("reconcile_loop", {}).get("detail", "")).startswith("not acting")
            return time.time() if ok else None

        first_pass = wait_for(acting, self.args.phase_timeout, "the new leader's first acting pass", interval=0.05)
        health = standby.health() or {}
        time.sleep(self.args.settle)  # passes after the takeover: what would they change? (a bench pause)
        with self.tail.lock:
            after = dict(self.tail.assignment)
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        moves = self.tail.events_since(t_kill, ("placed", "moved", "removed", "preempted"))
        counters = self.sims.stats()
        self.result["takeover"] = {
            "elected_s": round(elected - t_kill, 2), "first_pass_s": round(first_pass - t_kill, 2),
            "takeover": health.get("takeover"), "assignments_changed": len(changed),
            "placement_events": len(moves), "replicas_started": sum(c["starts"] for c in counters),
            "replicas_drained": sum(c["drains"] for c in counters),
            "standby_mem": proc_mem_mb(standby.pid),
        }
        log(f"takeover: {self.result['takeover']}")
        if changed:
            log(f"takeover changed assignments of {changed[:5]}")

    def node_loss(self) -> None:
        assert self.tail is not None and self.sims is not None
        node = self.busiest_node()
        with self.tail.lock:
            lost = [r[0] for r in self.tail.assignment[node]]
        models = sorted({rid.rsplit("-", 1)[0] for rid in lost})
        self.sims.mark()
        last_hb = self.sims.kill_node(node)
        t_kill = time.time()

        def replaced() -> float | None:
            with self.tail.lock:  # type: ignore[union-attr]
                ok = all(self.tail.node_of.get(rid) not in (None, node) for rid in lost)  # type: ignore[union-attr]
            return time.time() if ok else None

        t_replaced = wait_for(replaced, self.args.phase_timeout, f"the replicas of {node} re-assigned", interval=0.05)

        def offline() -> float | None:
            found = [e[0] for e in self.tail.events_since(last_hb, ("node_offline",)) if e[3] == node]  # type: ignore[union-attr]
            return found[0] if found else None

        t_offline = wait_for(offline, self.args.phase_timeout, f"{node} offline")

        def ready_again() -> float | None:
            with self.tail.lock:  # type: ignore[union-attr]
                ok = all(self.tail.status.get(m, ("", 0, 0))[0] == "Ready" for m in models)  # type: ignore[union-attr]
            return time.time() if ok else None

        t_ready = wait_for(ready_again, self.args.phase_timeout, f"the models of {node} Ready again", interval=0.1)
        counters = self.sims.stats()
        self.result["node_loss"] = {
            "node": node, "replicas": len(lost), "models": len(models),
            "offline_after_last_heartbeat_s": round(t_offline - last_hb, 2),
            "replaced_after_last_heartbeat_s": round(t_replaced - last_hb, 2),
            "ready_after_last_heartbeat_s": round(t_ready - last_hb, 2),
            "kill_to_replaced_s": round(t_replaced - t_kill, 2),
            "replicas_started_elsewhere": sum(c["starts"] for c in counters),
        }
        log(f"node loss: {self.result['node_loss']}")

    def cold_start(self) -> None:
        """A control plane started from nothing: how long its state feeder needs to read the topics."""
        cp = ControlProc(self, "cp-3")
        self.controls.append(cp)
        t = wait_for(lambda: (cp.health() or {}).get("state_caught_up") and time.time(), 300, "cp-3 caught up")
        self.result["cold_start"] = {"caught_up_s": round(t - cp.started, 2), "mem": proc_mem_mb(cp.pid)}
        cp.stop()
        log(f"cold start: {self.result['cold_start']}")

    def topic_sizes(self) -> None:
        """Every system topic read from its beginning (what a new reader replays) vs what compaction would keep."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

        from sie.kernel.clients import KafkaClients, state_reader_config
        from sie.kernel.names import SYSTEM_TOPICS

        consumer = KafkaClients().consumer(state_reader_config(
            self.settings, f"{self.prefix}.bench-sizes", "bench-sizes", partition_eof=True))
        try:
            meta = consumer.list_topics(timeout=10)
            parts = []
            for s in SYSTEM_TOPICS:
                t = self.settings.names.system_topic(s)
                if t in meta.topics:
                    parts += [TopicPartition(t, p, OFFSET_BEGINNING) for p in meta.topics[t].partitions]
            consumer.assign(parts)
            left = {(tp.topic, tp.partition) for tp in parts}
            sizes: dict[str, dict[str, Any]] = {}
            latest: dict[str, dict[bytes, int]] = {}
            deadline = time.monotonic() + 300
            while left and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=2000, timeout=0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            left.discard((msg.topic(), msg.partition()))
                        continue
                    s = msg.topic()[len(self.prefix) + 1:]
                    d = sizes.setdefault(s, {"records": 0, "bytes": 0})
                    size = len(msg.key() or b"") + len(msg.value() or b"")
                    d["records"] += 1
                    d["bytes"] += size
                    latest.setdefault(s, {})[msg.key() or b""] = size if msg.value() is not None else 0
            for s, d in sizes.items():
                keys = latest.get(s, {})
                d["keys"] = len(keys)
                d["latest_bytes"] = sum(keys.values())
                if self.broker_data is not None:  # what the broker stores (compressed batches, not yet cleaned)
                    d["disk_bytes"] = sum(f.stat().st_size for f in self.broker_data.glob(
                        f"*/data/{self.prefix}.{s}-*/*.log"))
            self.result["topic_sizes"] = sizes
        finally:
            consumer.close()
        log(f"topic sizes: {json.dumps(self.result['topic_sizes'])[:600]}")


def profile_summary(collapsed: str, top: int = 25) -> dict[str, Any]:
    """Top functions of py-spy's collapsed stacks (``frame;frame;... count``): by own (leaf) and inclusive samples,
    idle samples (a thread waiting) counted apart."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = idle = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  for f in stack.split(";")[1:]]  # the first frame is the thread
        leaf = frames[-1] if frames else "?"
        if any(w in leaf for w in ("wait (threading", "poll (", "select (", "sleep", "_wait", "acquire")):
            idle += n
            continue
        total += n
        own[leaf] = own.get(leaf, 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    pick = lambda d: [(k, round(v / max(1, total), 3)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]  # noqa: E731
    return {"busy_samples": total, "idle_samples": idle, "own": pick(own), "inclusive": pick(incl)}


class _NoLauncher:
    """The replay measurement hands the replica set to the supervisor and never runs a pass: nothing starts."""

    def start(self, spec: Any) -> Any:
        raise OSError("the scale bench launches no worker")


# ------------------------------------------------------------------------------------------ reporting


def growth(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric: the ratio per doubling of nodes (at the most models) and of models (at the most nodes)."""
    metrics: dict[str, Callable[[dict[str, Any]], float | None]] = {
        "probe apply->assignment p50 s": lambda r: r.get("probes", {}).get("apply_to_assignment_s", {}).get("p50"),
        "probe apply->assignment p99 s": lambda r: r.get("probes", {}).get("apply_to_assignment_s", {}).get("p99"),
        "probe apply->READY p99 s": lambda r: r.get("probes", {}).get("apply_to_ready_s", {}).get("p99"),
        "leader CPU (cores)": lambda r: r.get("steady", {}).get("cpu_cores", {}).get("leader"),
        "leader RSS MB": lambda r: (r.get("steady", {}).get("leader_mem") or {}).get("rss_mb"),
        "reconcile pass mean s": lambda r: r.get("steady", {}).get("reconcile", {}).get("mean_s"),
        "reconcile pass CPU s": lambda r: r.get("steady", {}).get("reconcile", {}).get("cpu_mean_s"),
        "broker bytes/s": lambda r: r.get("steady", {}).get("total", {}).get("bytes_per_s"),
        "takeover first pass s": lambda r: r.get("takeover", {}).get("first_pass_s"),
        "agent replay p50 s": lambda r: r.get("agent_replay", {}).get("p50"),
        "/v1/replicas p50 s": lambda r: r.get("api", {}).get("/v1/replicas", {}).get("p50"),
        "/v1/models p50 s": lambda r: r.get("api", {}).get("/v1/models", {}).get("p50"),
        "cold start caught up s": lambda r: r.get("cold_start", {}).get("caught_up_s"),
        "assignments bytes (log)": lambda r: r.get("topic_sizes", {}).get("assignments", {}).get("bytes"),
    }
    out: dict[str, dict[str, Any]] = {}
    most_models = max((r["models"] for r in results), default=0)
    most_nodes = max((r["nodes"] for r in results), default=0)
    for name, get in metrics.items():
        row: dict[str, Any] = {}
        for axis, fixed_key, fixed, vary in (("nodes", "models", most_models, "nodes"),
                                             ("models", "nodes", most_nodes, "models")):
            pts = sorted((r[vary], get(r)) for r in results if r[fixed_key] == fixed and get(r) is not None)
            if len(pts) >= 2 and pts[0][1] and pts[0][0] != pts[-1][0]:
                (x0, y0), (x1, y1) = pts[0], pts[-1]
                row[f"per_doubling_{axis}"] = round((y1 / y0) ** (1 / math.log2(x1 / x0)), 2) if y0 > 0 and y1 > 0 else None
                row[f"points_{axis}"] = pts
        out[name] = row
    return out


#: the rows of the before/after table (``--compare``)
COMPARED: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("populate: applies/s", lambda r: r["populate"]["applies_per_s"]),
    ("populate: first apply -> all Ready, s", lambda r: r["populate"]["all_ready_s"]),
    ("probe apply -> assignment p50, s", lambda r: r["probes"]["apply_to_assignment_s"]["p50"]),
    ("probe apply -> assignment p99, s", lambda r: r["probes"]["apply_to_assignment_s"]["p99"]),
    ("probe apply -> Ready p99, s", lambda r: r["probes"]["apply_to_ready_s"]["p99"]),
    ("steady: leader CPU, cores", lambda r: r["steady"]["cpu_cores"]["leader"]),
    ("steady: leader CPU-s per pass (all threads)",
     lambda r: round(r["steady"]["cpu_cores"]["leader"] / r["steady"]["reconcile"]["per_s"], 3)),
    ("steady: reconcile pass mean (wall), s", lambda r: r["steady"]["reconcile"]["mean_s"]),
    ("GET /v1/models p50, s", lambda r: r["api"]["/v1/models"]["p50"]),
    ("status page refresh, s", lambda r: r["api"]["status_page_refresh_s"]),
    ("sie get replicas (Kafka) p50, s", lambda r: r["api"]["sie_get_replicas"]["kafka"]["p50"]),
    ("sie get replicas (API) p50, s", lambda r: r["api"]["sie_get_replicas"]["api"]["p50"]),
    ("leader SIGKILL -> first acting pass, s", lambda r: r["takeover"]["first_pass_s"]),
    ("node loss: last heartbeat -> re-placed, s", lambda r: r["node_loss"]["replaced_after_last_heartbeat_s"]),
    ("cold start: caught up, s", lambda r: r["cold_start"]["caught_up_s"]),
    ("agent restart: replay p50, s", lambda r: r["agent_replay"]["p50"]),
    ("assignments topic: MB a replay decodes", lambda r: round(r["topic_sizes"]["assignments"]["bytes"] / 1e6, 1)),
    ("assignments topic: MB on the broker's disk",
     lambda r: round(r["topic_sizes"]["assignments"]["disk_bytes"] / 1e6, 2)),
    ("load average (start/end)", lambda r: f"{r['load_start']:.0f}/{r['load_end']:.0f}"),
]


def render_compare(before: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """Before (another run's JSON, e.g. bench/results/scale-before.json) vs this run, for the sizes both have."""
    lines = [f"before ({before.get('label') or 'an earlier run'}) vs after (this run), same sizes"]
    for b in before.get("results", []):
        a = next((r for r in results if (r["nodes"], r["models"]) == (b["nodes"], b["models"])), None)
        if a is None or "error" in b:
            continue
        lines.append(f"{'size ' + str(b['nodes']) + 'x' + str(b['models']):<44}{'before':>14}{'after':>14}")
        for label, get in COMPARED:
            cells = []
            for r in (b, a):
                try:
                    v = get(r)
                except (KeyError, TypeError, ZeroDivisionError):
                    v = None
                cells.append("-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
            lines.append(f"{label:<44}{cells[0]:>14}{cells[1]:>14}")
    return "\n".join(lines) + "\n"


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = ["SIE control plane at scale (python bench/bench_scale.py " + " ".join(args.argv) + ")"
             + (f"; control planes at nice {args.control_nice}" if args.control_nice else ""),
             f"each model {args.replicas} fixed replicas; heartbeats every {args.heartbeat_s:g} s; simulated replica "
             f"start {args.start_s[0]:g}-{args.start_s[1]:g} s; 2-core machine shared with other sessions: CPU is CPU "
             "seconds per second (cores), load average per size", ""]
    cols = [f"{r['nodes']}x{r['models']}" for r in results]

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> str:
        cells = []
        for r in results:
            try:
                v = get(r)
            except (KeyError, TypeError):
                v = None
            cells.append("-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
        return f"{label:<44}" + "".join(f"{c:>14}" for c in cells)

    lines.append(f"{'size (nodes x models)':<44}" + "".join(f"{c:>14}" for c in cols))
    spec = [
        ("replicas", lambda r: r["replicas"]),
        ("load average at start / end", lambda r: f"{r['load_start']:.0f}/{r['load_end']:.0f}"),
        ("populate: applies/s (4 parallel POSTs)", lambda r: r["populate"]["applies_per_s"]),
        ("populate: first apply -> all Ready, s", lambda r: r["populate"]["all_ready_s"]),
        ("nodes in use / most replicas on a node", lambda r: f"{r['populate']['nodes_in_use']}/{r['populate']['most_replicas_on_a_node']}"),
        ("probe apply -> assignment p50, s", lambda r: r["probes"]["apply_to_assignment_s"]["p50"]),
        ("probe apply -> assignment p99, s", lambda r: r["probes"]["apply_to_assignment_s"]["p99"]),
        ("  p50: spec seen|leader wrote|agents saw, s", lambda r: "|".join(
            f"{r['probes']['split_s'][k]['p50']:.1f}" for k in
            ("apply_to_spec_visible", "spec_visible_to_leader_produced", "produced_to_visible"))),
        ("  p99: spec seen|leader wrote|agents saw, s", lambda r: "|".join(
            f"{r['probes']['split_s'][k]['p99']:.1f}" for k in
            ("apply_to_spec_visible", "spec_visible_to_leader_produced", "produced_to_visible"))),
        ("probe apply -> Ready p50, s", lambda r: r["probes"]["apply_to_ready_s"]["p50"]),
        ("probe apply -> Ready p99, s", lambda r: r["probes"]["apply_to_ready_s"]["p99"]),
        ("steady: leader CPU, cores", lambda r: r["steady"]["cpu_cores"]["leader"]),
        ("steady: standby CPU, cores", lambda r: r["steady"]["cpu_cores"].get("standby")),
        ("steady: simulators CPU, cores", lambda r: r["steady"]["cpu_cores"].get("sims")),
        ("steady: broker CPU, cores", lambda r: r["steady"]["cpu_cores"].get("broker")),
        ("steady: leader RSS / peak, MB", lambda r: f"{r['steady']['leader_mem']['rss_mb']:.0f}/{r['steady']['leader_mem']['hwm_mb']:.0f}"),
        ("steady: reconcile passes/s", lambda r: r["steady"]["reconcile"]["per_s"]),
        ("steady: reconcile pass mean, s", lambda r: r["steady"]["reconcile"]["mean_s"]),
        ("steady: reconcile pass CPU mean, s", lambda r: r["steady"]["reconcile"]["cpu_mean_s"]),
        ("steady: reconcile pass p99 <= (bucket), s", lambda r: r["steady"]["reconcile"]["p99_bucket_le_s"]),
        ("steady: broker records/s (all topics)", lambda r: r["steady"]["total"]["records_per_s"]),
        ("steady: broker KB/s (all topics)", lambda r: round(r["steady"]["total"]["bytes_per_s"] / 1024, 1)),
    ]
    for topic in ("heartbeats", "replica-status", "assignments", "model-status", "events"):
        spec.append((f"  {topic} records/s | KB/s", lambda r, t=topic: (
            f"{r['steady']['topics'][t]['records_per_s']:g}|{r['steady']['topics'][t]['bytes_per_s'] / 1024:.0f}"
            if t in r["steady"]["topics"] else "0")))
    spec += [
        ("GET /v1/replicas p50, s", lambda r: r["api"]["/v1/replicas"]["p50"]),
        ("GET /v1/models p50, s", lambda r: r["api"]["/v1/models"]["p50"]),
        ("GET /v1/nodes p50, s", lambda r: r["api"]["/v1/nodes"]["p50"]),
        ("status page refresh (its 6 paged routes + page), s", lambda r: r["api"]["status_page_refresh_s"]),
        ("sie get replicas (Kafka) p50, s", lambda r: r["api"]["sie_get_replicas"]["kafka"]["p50"]),
        ("sie get replicas (API) p50, s", lambda r: r["api"]["sie_get_replicas"]["api"]["p50"]),
        ("  (CLI start-up alone, s)", lambda r: r["api"]["sie_get_replicas"]["cli_start_s"]),
        ("agent restart: replay p50, s", lambda r: r["agent_replay"]["p50"]),
        ("leader SIGKILL -> standby elected, s", lambda r: r["takeover"]["elected_s"]),
        ("leader SIGKILL -> first acting pass, s", lambda r: r["takeover"]["first_pass_s"]),
        ("  takeover loading (barrier+rollouts), s", lambda r: (r["takeover"]["takeover"] or {}).get("loaded_s")),
        ("  assignments changed / placement events", lambda r: f"{r['takeover']['assignments_changed']}/{r['takeover']['placement_events']}"),
        ("  replicas started / drained", lambda r: f"{r['takeover']['replicas_started']}/{r['takeover']['replicas_drained']}"),
        ("node loss: replicas on the node", lambda r: r["node_loss"]["replicas"]),
        ("node loss: last heartbeat -> offline, s", lambda r: r["node_loss"]["offline_after_last_heartbeat_s"]),
        ("node loss: last heartbeat -> re-placed, s", lambda r: r["node_loss"]["replaced_after_last_heartbeat_s"]),
        ("node loss: last heartbeat -> Ready, s", lambda r: r["node_loss"]["ready_after_last_heartbeat_s"]),
        ("cold start: caught up, s", lambda r: r["cold_start"]["caught_up_s"]),
        ("cold start: RSS MB", lambda r: r["cold_start"]["mem"]["rss_mb"]),
    ]
    for topic in ("assignments", "model-status", "specs", "nodes", "heartbeats", "replica-status", "events"):
        spec.append((f"topic {topic}: records | MB in log", lambda r, t=topic: (
            f"{r['topic_sizes'][t]['records']}|{r['topic_sizes'][t]['bytes'] / 1e6:.1f}" if t in r["topic_sizes"] else "-")))
        spec.append(("  MB on the broker's disk", lambda r, t=topic: (
            round(r["topic_sizes"][t]["disk_bytes"] / 1e6, 2) if "disk_bytes" in r["topic_sizes"].get(t, {}) else "-")))
        spec.append(("  keys | MB latest per key", lambda r, t=topic: (
            f"{r['topic_sizes'][t]['keys']}|{r['topic_sizes'][t]['latest_bytes'] / 1e6:.2f}" if t in r["topic_sizes"] else "-")))
    lines += [row(label, get) for label, get in spec]
    lines += ["", "growth per doubling (ratio of the value when nodes, or models, double; 1.0 = flat, 2.0 = linear)"]
    lines.append(f"{'metric':<34}{'nodes x2 (at most models)':>28}{'models x2 (at most nodes)':>28}")
    for name, g in growth(results).items():
        lines.append(f"{name:<34}{str(g.get('per_doubling_nodes', '-')):>28}{str(g.get('per_doubling_models', '-')):>28}")
    big = max(results, key=lambda r: (r["nodes"], r["models"]))
    p99 = big.get("probes", {}).get("apply_to_assignment_s", {}).get("p99")
    take = big.get("takeover", {}).get("first_pass_s")
    lines += ["", f"targets at {big['nodes']}x{big['models']}: apply -> assignment p99 {p99} s (<= {TARGETS['apply_to_assignment_p99_s']:g}: "
                  f"{'met' if p99 is not None and p99 <= TARGETS['apply_to_assignment_p99_s'] else 'MISSED'}); "
                  f"leader SIGKILL -> acting {take} s (<= {TARGETS['takeover_s']:g}: "
                  f"{'met' if take is not None and take <= TARGETS['takeover_s'] else 'MISSED'})"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ main


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        nodes, _, models = item.strip().partition("x")
        out.append((int(nodes), int(models)))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"NODESxMODELS,... (default {DEFAULT_SIZES})")
    p.add_argument("--replicas", type=int, default=3, help="replicas per model (fixed)")
    p.add_argument("--bootstrap", default=None, help="an existing broker (default: start a private one)")
    p.add_argument("--heartbeat-s", type=float, default=2.0)
    p.add_argument("--start-s", type=lambda s: tuple(float(x) for x in s.split("-")), default=(1.0, 3.0),
                   help="simulated replica start time range, e.g. 1-3")
    p.add_argument("--sim-processes", type=int, default=0, help="simulator processes (default: one per 100 nodes)")
    p.add_argument("--window", type=float, default=30.0, help="steady window, seconds")
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--probe-interval", type=float, default=1.5)
    p.add_argument("--api-repeats", type=int, default=5)
    p.add_argument("--populate-timeout", type=float, default=900.0)
    p.add_argument("--phase-timeout", type=float, default=300.0, help="longest wait of one phase (seconds)")
    p.add_argument("--size-timeout", type=float, default=2400.0, help="a size that runs longer is stopped (seconds)")
    p.add_argument("--profile-leader", type=float, default=0.0, help="py-spy the leader this many seconds (steady window)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--control-args", nargs="*", default=[], help="extra `sie control` options")
    p.add_argument("--control-nice", type=int, default=0,
                   help="run the control planes at this nice value (e.g. -10, as root): on a machine shared with "
                        "other work, as if they had a host of their own (the simulators and broker are not changed)")
    p.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    p.add_argument("--name", default="scale", help="result file stem (scale.txt, scale.json)")
    p.add_argument("--keep-logs", default=None, help="copy the control planes' logs here")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--render", default=None, help="write the text report of a results JSON again (no run)")
    p.add_argument("--compare", default=None, help="a results JSON of an earlier run: a before/after table of the "
                                                     "sizes both ran (e.g. bench/results/scale-before.json)")
    return p


class SizeTimeout(Exception):
    pass


def run_size(args: argparse.Namespace, broker: Broker, nodes: int, models: int) -> dict[str, Any]:
    """One size, stopped (SizeTimeout) when it runs past ``--size-timeout``: the harness never hangs."""
    run = SizeRun(args, broker.bootstrap, nodes, models, broker_pid=broker.pid, broker_data=broker.data)
    expired = threading.Event()

    def expire() -> None:  # what the size waits on dies: its next wait or request fails, and it unwinds
        expired.set()
        log(f"size {nodes}x{models}: over {args.size_timeout:.0f}s, stopping it")
        run.abort()

    timer = threading.Timer(args.size_timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        log(f"=== size {nodes} nodes x {models} models (prefix {run.prefix}) ===")
        return run.execute()
    except Exception as exc:
        if expired.is_set():
            raise SizeTimeout(f"over --size-timeout {args.size_timeout:.0f}s ({type(exc).__name__}: {exc})") from None
        raise
    finally:
        timer.cancel()
        run.close()


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = build_parser().parse_args(argv)
    if args.render:  # the report of an earlier run, with this version's rendering
        saved = json.loads(Path(args.render).read_text())
        rerun = build_parser().parse_args(saved["args"])
        rerun.argv = saved["args"]
        done = [r for r in saved["results"] if "error" not in r]
        text = render(done, rerun)
        if rerun.compare:
            text += "\n" + render_compare(json.loads((ROOT / rerun.compare).read_text()), done)
        print(text)
        if not args.no_write:
            Path(args.render).with_suffix(".txt").write_text(text)
        return saved["results"]
    if threading.current_thread() is threading.main_thread():
        # SIGTERM, and SIGINT even when a shell started the bench in the background (which ignores it), stop the
        # bench through its clean-up: the control planes, the simulators and the private broker go with it
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    tmp = Path(tempfile.mkdtemp(prefix="sie-scale-run-"))
    broker = Broker(args.bootstrap, tmp)
    results: list[dict[str, Any]] = []
    try:
        for nodes, models in parse_sizes(args.sizes):
            try:
                results.append(run_size(args, broker, nodes, models))
            except (TimeoutError, RuntimeError, SizeTimeout, OSError) as exc:
                log(f"size {nodes}x{models} failed: {type(exc).__name__}: {exc}")
                results.append({"nodes": nodes, "models": models, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)
    done = [r for r in results if "error" not in r]
    text = render(done, args) if done else "no size completed\n"
    if args.compare and done:
        text += "\n" + render_compare(json.loads(Path(args.compare).read_text()), done)
    failed = [r for r in results if "error" in r]
    if failed:
        text += "".join(f"size {r['nodes']}x{r['models']} FAILED: {r['error']}\n" for r in failed)
    print(text)
    if not args.no_write:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.name}.txt").write_text(text)
        (out / f"{args.name}.json").write_text(json.dumps({"args": args.argv, "results": results,
                                                           "growth": growth(done)}, indent=1, default=str) + "\n")
    return results


if __name__ == "__main__":
    main()
