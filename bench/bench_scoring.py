"""SIE's exactly-once scorer against its baselines, on one private broker, one model, the same requests.

Contestants (each reads the same request records from a fresh 6-partition topic and
writes one result per request; a separate ``read_committed`` reader process times
the results as they become visible):

* (b) ``null``   transactional consume -> produce copying bytes with the scorer's own
                 librdkafka settings, batch size and one transaction per batch
                 (``send_offsets_to_transaction``): no parsing, validation or inference.
                 The practical ceiling of any exactly-once Python pipeline here.
* (a) ``sie``    the real scorer: ``python -m sie score -f <spec>`` (1 and 2 processes
                 in one group), default batching.
* (c) ``naive``  poll one message, json.loads, infer one row, produce, flush, commit
                 synchronously: what people write first. Slow: measured on a subset.
* (d) ``faust``  a faust-streaming agent iterating the stream (json, validate,
                 infer one row per event, send), default at_least_once. Subset.
* (e) ``quix``   a Quix Streams application, ``processing_guarantee="exactly-once"``
                 (json, validate, infer one row per message, to_topic) at its default
                 commit interval (5 s) and (e') tuned for latency; its own virtualenv
                 (``bench/setup_quix_venv.sh``: quixstreams pins confluent-kafka < 2.13). Subset.
* latency        at 200/s, 2,000/s and half of (a)'s measured throughput, same run: the
                 SIE scorer (traced: a per-request time split, see ``latency_split``)
                 and Quix EOS at both commit intervals; end-to-end latency = request
                 record timestamp -> result visible to the read_committed reader.

Throughput of a backlog run: the contestant is started on an empty topic and waited
for until its consumer group is stable with every partition assigned (so start-up and
the first rebalance are not measured), then all requests are produced at once; the
rate is results/s between the first and the last result the reader sees.

Usage: ``python bench/bench_scoring.py [--requests 100000] [--quick] [--only sie,null,quix,latency]``;
writes bench/results/scoring.txt and scoring.json (``--no-write`` for a dry run).
A contestant's own process is started as ``python bench/bench_scoring.py _role NAME JSON``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC_FILE = ROOT / "examples" / "fraud-scorer.yaml"
RESULTS_DIR = ROOT / "bench" / "results"
PARTITIONS = 6
TARGETS = {"vs_null": 0.95, "vs_naive": 10.0, "vs_faust": 3.0,
           # steady-state p99 of the SIE scorer per controlled rate (issue 15)
           "p99_ms": {"200": 25.0, "2000": 50.0, "half": 50.0}}


# =============================================================================================
# Requests: the same records for every contestant
# =============================================================================================
def make_requests(n: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    """``n`` (key, value) request records for the fraud model; id ``r<i>`` lets the reader match results."""
    import orjson

    rng = random.Random(seed)
    out = []
    for i in range(n):
        inputs = {
            "amount": round(min(rng.lognormvariate(4.0, 1.5), 999_999.0), 2),
            "merchant_risk": round(rng.random(), 4),
            "hour": rng.randrange(24),
            "account_age_days": rng.randrange(3650),
            "is_foreign": rng.random() < 0.15,
            "tx_count_24h": rng.randrange(40),
        }
        out.append((f"acct-{i % 5000}".encode(), orjson.dumps({"id": f"r{i}", "inputs": inputs})))
    return out


# =============================================================================================
# Contestant processes (``_role``): null pipeline, naive consumer, faust agent
# =============================================================================================
def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _load_spec(cfg: dict) -> Any:
    from sie.schemas.spec import load_spec

    return load_spec(cfg["spec_file"])


def _load_backend(spec: Any) -> Any:
    from sie.workers.backends import backend_config_from_spec, create_backend

    backend = create_backend(backend_config_from_spec(spec))
    backend.load()
    return backend


def role_null(cfg: dict) -> None:
    """(b) Exactly-once byte copy with the scorer's own client settings and batch size."""
    from confluent_kafka import Consumer, Producer

    from sie.kernel.settings import Settings
    from sie.streams.scorer import ScorerConfig

    spec = _load_spec(cfg)
    sc = ScorerConfig(settings=Settings(bootstrap_servers=cfg["bootstrap"]), spec=spec, instance=cfg["instance"])
    stop = _stop_event()
    producer = Producer({**sc.producer_config(), **cfg.get("producer_extra", {})})
    producer.init_transactions(30)
    consumer = Consumer(sc.consumer_config())
    consumer.subscribe([spec.topics.requests])
    results, wait_s, n_max = spec.topics.results, sc.max_wait_ms / 1000, sc.max_batch
    while not stop.is_set():
        # the scorer's batcher: wait for one record, then take what is already fetched (max_wait 0, adaptive)
        # or fill until full / max_wait after it
        msgs = consumer.consume(1, 0.1)
        if not msgs:
            continue
        msgs += consumer.consume(n_max - 1, wait_s)
        producer.begin_transaction()
        for m in msgs:
            if m.error() is None:
                producer.produce(results, m.value(), m.key(), m.partition())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    consumer.close()
    producer.flush(5)


def role_naive(cfg: dict) -> None:
    """(c) Per message: poll, json.loads, infer one row, produce, flush, synchronous commit."""
    from confluent_kafka import Consumer, Producer

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    stop = _stop_event()
    consumer = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": spec.group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": cfg["bootstrap"]})
    consumer.subscribe([spec.topics.requests])
    results = spec.topics.results
    while not stop.is_set():
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            continue
        request = json.loads(msg.value())
        outputs = backend.infer([request["inputs"]])[0]
        producer.produce(results, json.dumps({"id": request["id"], "status": "ok", "outputs": outputs}).encode(),
                         msg.key())
        producer.flush()
        consumer.commit(message=msg, asynchronous=False)
    consumer.close()


def role_faust(cfg: dict) -> None:
    """(d) A faust-streaming agent iterating the stream: json, validate, infer one row, send."""
    import faust
    from faust.worker import Worker

    from sie.schemas.validation import compile_validator

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    validate = compile_validator(spec.input_schema)
    app = faust.App(spec.group_id, broker=f"kafka://{cfg['bootstrap']}", web_enabled=False,
                    datadir=cfg["datadir"], topic_partitions=PARTITIONS, consumer_auto_offset_reset="earliest",
                    key_serializer="raw", value_serializer="json")
    requests = app.topic(spec.topics.requests, key_type=bytes, partitions=PARTITIONS)
    results = app.topic(spec.topics.results, key_type=bytes, partitions=PARTITIONS)

    @app.agent(requests)
    async def score(stream):  # noqa: ANN001 - faust's idiomatic agent
        async for key, request in stream.items():
            try:
                inputs = validate(request["inputs"])
            except Exception as exc:  # noqa: BLE001 - a real agent would dead-letter it
                await results.send(key=key, value={"id": request.get("id"), "status": "error", "error": str(exc)})
                continue
            outputs = backend.infer([inputs])[0]
            await results.send(key=key, value={"id": request["id"], "status": "ok", "outputs": outputs})

    Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def role_sie_traced(cfg: dict) -> None:
    """(a) the SIE scorer as ``sie score`` runs it (same ``run_scorer``, ``ScorerConfig`` defaults unless
    ``cfg`` overrides pipelined / max_wait_ms), recording every committed batch's offsets and
    ``BatchTimes`` in memory; written to ``cfg["trace"]`` (JSON) at exit, so tracing costs no I/O while
    measured.  The latency phases use it for the time split."""
    from sie.kernel.settings import Settings
    from sie.streams.scorer import ScorerConfig, run_scorer

    spec = _load_spec(cfg)
    stop = _stop_event()
    overrides = {k: cfg[k] for k in ("pipelined", "max_wait_ms", "max_batch") if k in cfg}
    config = ScorerConfig(settings=Settings(bootstrap_servers=cfg["bootstrap"]), spec=spec,
                          instance=cfg["instance"], **overrides)
    trace: list[list] = []

    def traced(scorer: Any) -> None:
        prepare, committed = scorer.prepare, scorer.committed

        def prepare_traced(batch: list) -> Any:
            prepared = prepare(batch)
            span: dict[int, list[int]] = {}
            for m in batch:
                lo_hi = span.setdefault(m.partition(), [m.offset(), m.offset()])
                lo_hi[1] = m.offset()
            prepared.value["_span"] = span
            return prepared

        def committed_traced(stats: dict, n: int) -> None:
            t = scorer._loop.eos.last_times
            trace.append([stats.pop("_span"), t.collected, t.prepared, t.begun, t.produced, t.committed])
            committed(stats, n)

        scorer.prepare, scorer.committed = prepare_traced, committed_traced

    run_scorer(config, _load_backend, stop, on_ready=traced)
    Path(cfg["trace"]).write_text(json.dumps(trace))


def role_quix(cfg: dict) -> None:
    """(e) a Quix Streams application, ``processing_guarantee="exactly-once"``: the same request JSON, the
    same compiled validator and model; Quix processes one message at a time (its API has no batch hook
    short of stateful per-key count windows), so inference is one row per request.  ``commit_interval``
    from ``cfg`` (Quix's default 5 s, or tuned).  Runs in its own virtualenv (``--quix-python``):
    quixstreams pins confluent-kafka < 2.13."""
    from quixstreams import Application

    from sie.schemas.validation import compile_validator

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    validate = compile_validator(spec.input_schema)
    app = Application(broker_address=cfg["bootstrap"], consumer_group=spec.group_id, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", commit_interval=cfg["commit_interval"],
                      state_dir=cfg["state_dir"], loglevel="WARNING", auto_create_topics=False,
                      use_changelog_topics=False)
    requests = app.topic(spec.topics.requests, key_deserializer="bytes", value_deserializer="json")
    results = app.topic(spec.topics.results, key_serializer="bytes", value_serializer="json")

    def score(request: dict) -> dict:
        try:
            inputs = validate(request["inputs"])
        except Exception as exc:  # noqa: BLE001 - a real app would dead-letter it
            return {"id": request.get("id"), "status": "error", "error": str(exc)}
        return {"id": request["id"], "status": "ok", "outputs": backend.infer([inputs])[0]}

    app.dataframe(requests).apply(score).to_topic(results)
    app.run()


ROLES = {"null": role_null, "naive": role_naive, "faust": role_faust, "sie_traced": role_sie_traced,
         "quix": role_quix}


# =============================================================================================
# The reader: a separate process timing results as read_committed consumers see them
# =============================================================================================
def reader_main(bootstrap: str, topic: str, expected: int, want_ids: bool, conn: Any, progress: Any,
                stop: Any, ready: Any) -> None:
    """Read ``topic`` from the beginning until ``expected`` results or ``stop``; send the timings back.

    ``consume(n, 0)`` never waits for a full batch (it would add up to its timeout to every
    measurement); when nothing is queued, ``poll`` returns as soon as one record arrives.
    """
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
                  "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    batches: list[tuple[float, int]] = []
    ids: list[tuple[int, float, float, int, int]] = []  # (request index, seen at, timings.queue_ms, source p, offset)
    count = expired = 0
    c.poll(0.5)  # join the partitions (fetch sessions up) before the contestant gets any request
    ready.set()
    while count < expected and not stop.is_set():
        msgs = c.consume(5000, 0)
        if not msgs:
            one = c.poll(0.05)
            if one is None:
                continue
            msgs = [one]
        t = time.time()
        n = 0
        for m in msgs:
            if m.error() is not None:
                continue
            v = m.value()
            n += 1
            if b'"expired"' in v:
                expired += 1
            if want_ids:
                doc = orjson.loads(v)
                src = doc.get("source") or {}
                ids.append((int(doc["id"][1:]), t, doc.get("timings", {}).get("queue_ms", -1.0),
                            src.get("partition", -1), src.get("offset", -1)))
        if n:
            count += n
            batches.append((t, n))
            progress.value = count
    c.close()
    conn.send({"batches": batches, "ids": ids, "count": count, "expired": expired})
    conn.close()


class Reader:
    """Parent-side handle of the reader process."""

    def __init__(self, bootstrap: str, topic: str, expected: int, want_ids: bool = False) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process that holds librdkafka threads
        self._recv, send = ctx.Pipe(duplex=False)
        self.progress = ctx.Value("q", 0)
        self._stop = ctx.Event()
        ready = ctx.Event()
        self.proc = ctx.Process(target=reader_main, args=(bootstrap, topic, expected, want_ids, send,
                                                          self.progress, self._stop, ready), daemon=True)
        self.proc.start()
        if not ready.wait(60):
            self.proc.kill()
            raise RuntimeError("reader process not ready after 60 s")

    @property
    def count(self) -> int:
        return int(self.progress.value)

    def finish(self, timeout: float = 30.0) -> dict:
        self._stop.set()
        if not self._recv.poll(timeout):
            self.proc.kill()
            raise RuntimeError("reader process sent no result")
        data = self._recv.recv()
        self.proc.join(5)
        return data


# =============================================================================================
# Harness: broker, topics, processes, CPU accounting
# =============================================================================================
def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (0 once it is gone)."""
    try:
        return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))
    except OSError:
        return 0.0


def _stat_cpu_seconds(stat: Path) -> float:
    """utime + stime from a /proc ``stat`` file (a process's or one thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jit_cpu_seconds(pid: int) -> float:
    """CPU seconds the JVM's JIT compiler threads (``C1/C2 CompilerThre...``) of ``pid`` have used so far.

    A freshly started broker spends minutes compiling its hot paths; on 2 cores those compiler threads take
    half a core from everything else, so a latency run on a cold broker measures the JIT (issue 15)."""
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            if (task / "comm").read_text().startswith(("C1 Compiler", "C2 Compiler")):
                total += _stat_cpu_seconds(task / "stat")
        except OSError:  # the thread ended in between
            continue
    return total


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Phase:
    """Outcome of one contestant run."""

    key: str
    label: str
    processes: int
    offered: int  # requests produced for this run
    results: int = 0
    rate: float = 0.0  # results/s, first -> last result seen by the reader
    drain_s: float = 0.0  # first request produced -> last result seen
    burst_s: float = 0.0  # first request produced -> last request acknowledged by the broker
    rate_first_to_last: float = 0.0  # results/s over the whole span, first -> last result
    expired: int = 0
    subset_note: str = ""
    cpu_contestant_pct: float = 0.0  # % of one core, over the measured window
    cpu_broker_pct: float = 0.0
    cpu_reader_pct: float = 0.0
    latency: dict[str, float] = field(default_factory=dict)
    latency_timeline: list[list[float]] = field(default_factory=list)  # [second, requests, p50, p99, max]
    split: dict[str, Any] = field(default_factory=dict)  # latency_split() of the SIE scorer's latency runs
    settings: dict[str, Any] = field(default_factory=dict)
    #: the machine's 1-minute load average when the run started and when it ended (the machine is shared:
    #: a row measured under other people's load says so)
    load_avg: list[float] = field(default_factory=list)
    error: str = ""


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # Broker data on tmpfs when there is one: the shared disk's iowait must not become the benchmark.
        shm = Path("/dev/shm")
        self.tmp = Path(tempfile.mkdtemp(prefix="sie-bench-scoring-",
                                         dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
        self.run_id = uuid.uuid4().hex[:6]
        self.procs: list[subprocess.Popen] = []
        self.kafka: Any = None
        self.bootstrap = ""
        self.broker_pid = 0
        self.admin: Any = None
        self.spec_doc: dict = {}

    # --- broker --------------------------------------------------------------------------
    def start_broker(self) -> None:
        from confluent_kafka.admin import AdminClient

        from sie.infra.kafka.local import LocalKafka, free_base_port
        from sie.kernel.settings import Settings

        base = free_base_port(2)
        self.kafka = LocalKafka(Settings(), brokers=1, base_port=base, data_dir=self.tmp / "kafka")
        self.bootstrap = self.kafka.up(timeout=120)
        state = json.loads(self.kafka.state_file.read_text())
        self.broker_pid = int(next(iter(state["pids"].values())))
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        log(f"broker up at {self.bootstrap} (pid {self.broker_pid}, data in {self.tmp / 'kafka'})")

    def close(self) -> None:
        for p in list(self.procs):
            self._terminate(p)
        self.admin = None  # an admin client is a librdkafka handle: gone before the broker, so it can't complain
        if self.kafka is not None:
            try:
                self.kafka.down(wipe=True)
            except Exception as exc:  # noqa: BLE001 - best effort cleanup
                log(f"broker shutdown: {exc}")
        keep = getattr(self.args, "keep_logs", None)
        if keep:  # the contestants' logs and traces, for a post-mortem
            Path(keep).mkdir(parents=True, exist_ok=True)
            for f in [*self.tmp.glob("*.log"), *self.tmp.glob("*.trace.json")]:
                shutil.copy(f, Path(keep) / f.name)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- topics and specs -------------------------------------------------------------------
    def topics_for(self, phase: str) -> dict[str, str]:
        base = f"bench.{self.run_id}.{phase}"
        names = {"requests": f"{base}.requests", "results": f"{base}.results", "deadLetters": f"{base}.dlq"}
        from confluent_kafka.admin import NewTopic

        futures = self.admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in names.values()])
        for fut in futures.values():
            fut.result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = self.admin.list_topics(timeout=10).topics
            if all(t in md and len(md[t].partitions) == PARTITIONS for t in names.values()):
                return names
            time.sleep(0.1)
        raise RuntimeError(f"topics of {phase} not visible after 30 s")

    def spec_for(self, phase: str, topics: dict[str, str]) -> Path:
        """The demo spec, unchanged except for this run's topics and group (and an absolute artifact path)."""
        import yaml

        if not self.spec_doc:
            self.spec_doc = yaml.safe_load(SPEC_FILE.read_text())
        doc = json.loads(json.dumps(self.spec_doc))
        backend = doc["spec"]["backend"]
        backend["artifact"] = str((SPEC_FILE.parent / backend["artifact"]).resolve())
        doc["spec"]["topics"] = dict(topics)
        doc["spec"]["kafkaInput"] = {"groupId": f"bench.{self.run_id}.{phase}"}
        path = self.tmp / f"{phase}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    # --- processes ----------------------------------------------------------------------------
    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", SIE_BOOTSTRAP_SERVERS=self.bootstrap)
        with open(self.tmp / f"{name}.log", "wb") as logf:
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env)
        p.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def _terminate(self, p: subprocess.Popen, timeout: float = 20.0) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if p in self.procs:
            self.procs.remove(p)

    def log_tail(self, p: subprocess.Popen, lines: int = 15) -> str:
        text = Path(p.log_path).read_text(errors="replace").splitlines()  # type: ignore[attr-defined]
        return "\n".join(text[-lines:])

    def wait_group(self, group: str, topic: str, members: int, procs: list[subprocess.Popen],
                   timeout: float = 120.0) -> None:
        """Until ``group`` is stable with ``members`` members holding every partition of ``topic``."""
        from confluent_kafka import ConsumerGroupState

        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 10
        while True:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"contestant exited with {p.returncode} before it was ready:\n{self.log_tail(p)}")
            try:
                d = self.admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
                assigned = sum(1 for m in d.members if m.assignment
                               for tp in m.assignment.topic_partitions if tp.topic == topic)
                if d.state == ConsumerGroupState.STABLE and len(d.members) == members and assigned == PARTITIONS:
                    return
                status = f"{d.state}, {len(d.members)} member(s), {assigned}/{PARTITIONS} partitions"
            except Exception as exc:  # noqa: BLE001 - group not there yet
                status = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"group {group} not ready after {timeout:.0f}s ({status}):\n"
                                   + "\n".join(self.log_tail(p) for p in procs))
            if time.monotonic() > next_note:
                log(f"  waiting for group {group}: {status}")
                next_note = time.monotonic() + 10
            time.sleep(0.2)

    # --- producing ---------------------------------------------------------------------------------
    def produce_burst(self, topic: str, records: list[tuple[bytes, bytes]]) -> float:
        """All ``records`` as fast as possible; returns the time the first one was handed to librdkafka."""
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                      "queue.buffering.max.messages": 2_000_000, "compression.type": "none", "acks": "all"})
        started = time.time()
        for key, value in records:
            while True:
                try:
                    p.produce(topic, value, key)
                    break
                except BufferError:
                    p.poll(0.01)
        p.flush(60)
        self.burst_done_at = time.time()
        return started

    # --- one backlog run -------------------------------------------------------------------------
    def run_backlog(self, phase: Phase, procs_cmds: list[list[str]], group: str, topics: dict[str, str],
                    records: list[tuple[bytes, bytes]], cap_s: float | None) -> Phase:
        procs = [self.spawn(f"{phase.key}-{i}", cmd) for i, cmd in enumerate(procs_cmds)]
        phase.load_avg = [os.getloadavg()[0]]
        try:
            t0 = time.monotonic()
            self.wait_group(group, topics["requests"], len(procs), procs)
            log(f"  {phase.label}: {len(procs)} process(es) ready in {time.monotonic() - t0:.1f}s; "
                f"producing {len(records):,} requests")
            reader = Reader(self.bootstrap, topics["results"], len(records))
            cpu0 = [cpu_seconds(p.pid) for p in procs], cpu_seconds(self.broker_pid), cpu_seconds(reader.proc.pid)
            w0 = time.monotonic()
            produced_at = time.time()
            self.burst_done_at = 0.0
            threading.Thread(target=self.produce_burst, args=(topics["requests"], records), daemon=True).start()
            self._watch(phase, reader, len(records), procs, cap_s)
            wall = time.monotonic() - w0
            phase.load_avg.append(os.getloadavg()[0])
            cpu1 = [cpu_seconds(p.pid) for p in procs], cpu_seconds(self.broker_pid), cpu_seconds(reader.proc.pid)
            data = reader.finish()
        finally:
            for p in procs:
                self._terminate(p)
        self._fill_throughput(phase, data, produced_at, self.burst_done_at)
        phase.cpu_contestant_pct = 100 * (sum(cpu1[0]) - sum(cpu0[0])) / wall
        phase.cpu_broker_pct = 100 * (cpu1[1] - cpu0[1]) / wall
        phase.cpu_reader_pct = 100 * (cpu1[2] - cpu0[2]) / wall
        log(f"  {phase.label}: {phase.results:,} results at {phase.rate:,.0f}/s after the backlog was in "
            f"({phase.rate_first_to_last:,.0f}/s first -> last result; requests produced in {phase.burst_s:.1f}s, "
            f"drain {phase.drain_s:.1f}s; CPU % of one core: contestant {phase.cpu_contestant_pct:.0f}, broker {phase.cpu_broker_pct:.0f}, "
            f"reader {phase.cpu_reader_pct:.0f}){' ' + phase.subset_note if phase.subset_note else ''}")
        return phase

    def _watch(self, phase: Phase, reader: Reader, expected: int, procs: list[subprocess.Popen],
               cap_s: float | None, stall_s: float = 60.0) -> None:
        """Progress lines until every result is in, the time cap after the first result, or a stall."""
        last_n, last_t, first_t = 0, time.monotonic(), None
        changed = time.monotonic()
        while reader.count < expected:
            time.sleep(0.25)
            now, n = time.monotonic(), reader.count
            if n and first_t is None:
                first_t = now
            if n != last_n and n:
                changed = now
            if now - last_t >= 3.0:
                log(f"  {phase.label}: {n:,}/{expected:,} results, {(n - last_n) / (now - last_t):,.0f}/s")
                last_n, last_t = n, now
            if cap_s is not None and first_t is not None and now - first_t >= cap_s:
                phase.subset_note = f"(time cap {cap_s:.0f}s reached)"
                return
            if now - changed > stall_s:
                phase.error = f"stalled at {n:,}/{expected:,} results for {stall_s:.0f}s"
                log(f"  {phase.label}: {phase.error}")
                return
            for p in procs:
                if p.poll() is not None:
                    phase.error = f"contestant exited with {p.returncode}: {self.log_tail(p, 5)}"
                    log(f"  {phase.label}: {phase.error}")
                    return

    @staticmethod
    def _fill_throughput(phase: Phase, data: dict, produced_at: float, burst_done_at: float) -> None:
        """rate = results/s after the last request was acknowledged by the broker -> the last result.

        Before that moment a fast contestant can catch up with the load generator and wait for input, so
        only the pure backlog drain is counted (``rate_first_to_last`` keeps the whole span for reference).
        """
        batches = data["batches"]
        phase.results = data["count"]
        phase.expired = data["expired"]
        phase.burst_s = max(0.0, burst_done_at - produced_at) if burst_done_at else 0.0
        if len(batches) >= 2:
            (t_first, n_first), t_last = batches[0], batches[-1][0]
            phase.rate_first_to_last = (phase.results - n_first) / max(t_last - t_first, 1e-9)
            phase.drain_s = t_last - produced_at
            after = [(t, n) for t, n in batches if t > burst_done_at] if burst_done_at else []
            if len(after) >= 2 and sum(n for _, n in after) >= 0.2 * phase.results:
                phase.rate = (sum(n for _, n in after) - after[0][1]) / max(after[-1][0] - after[0][0], 1e-9)
            else:  # (almost) everything was scored while the burst was still being produced
                phase.rate = phase.rate_first_to_last

    # --- the controlled-rate latency run ------------------------------------------------------
    def run_latency(self, phase: Phase, cmd: list[str], group: str, topics: dict[str, str],
                    records: list[tuple[bytes, bytes]], rate: float, seconds: float,
                    trace: Path | None = None) -> Phase:
        """``rate`` requests/s for ``seconds`` into a ready contestant; end-to-end latency per request =
        the request record's timestamp (set when it is handed to the client) -> its result visible to the
        read_committed reader.  With ``trace`` (the SIE scorer's per-batch timings, written at exit) the
        latency is split into queue / prepare / wait / produce / commit / visible (``latency_split``)."""
        from confluent_kafka import Producer

        n = max(1, int(rate * seconds))
        if n > len(records):  # the same generator, longer: the first len(records) are the backlog runs' requests
            records = make_requests(n)
        proc = self.spawn(phase.key, cmd)
        phase.load_avg = [os.getloadavg()[0]]
        try:
            self.wait_group(group, topics["requests"], 1, [proc])
            reader = Reader(self.bootstrap, topics["results"], n, want_ids=True)
            log(f"  {phase.label}: producing {n:,} requests at {rate:,.0f}/s for {n / rate:.0f}s")
            # a latency-minded client: linger.ms 1 (librdkafka's default 5 would add up to 5 ms to every request)
            p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 1})
            p.list_topics(topics["requests"], timeout=10)  # connected, metadata known: no start-up in the first requests
            sent = [0.0] * n
            acked = [0.0] * n  # the broker acknowledged the request (delivery report)

            def on_ack(err: Any, _msg: Any, index: int) -> None:
                if err is None:
                    acked[index] = time.time()

            cpu0 = cpu_seconds(proc.pid), cpu_seconds(self.broker_pid)
            start = time.time()
            i = 0
            next_note = start + 3
            while i < n:
                now = time.time()
                due = min(n, int((now - start) * rate) + 1)
                while i < due:
                    key, value = records[i]
                    t = time.time()
                    sent[i] = t
                    p.produce(topics["requests"], value, key, timestamp=int(t * 1000),
                              on_delivery=lambda err, msg, index=i: on_ack(err, msg, index))
                    i += 1
                p.poll(0)
                if now >= next_note:
                    log(f"  {phase.label}: sent {i:,}/{n:,}, results {reader.count:,}")
                    next_note = now + 3
                # pacing: serve acknowledgements until the next request is due (not synchronisation), instead
                # of a 2 kHz polling loop taking the CPU the broker and the contestant need on 2 cores
                p.poll(max(0.0002, start + i / rate - time.time()))  # returns at once on an acknowledgement
            produce_s = time.time() - start
            phase.load_avg.append(os.getloadavg()[0])
            phase.cpu_contestant_pct = 100 * (cpu_seconds(proc.pid) - cpu0[0]) / produce_s
            phase.cpu_broker_pct = 100 * (cpu_seconds(self.broker_pid) - cpu0[1]) / produce_s
            p.flush(30)
            # a contestant that fell far behind is not waited for: its missing results are reported, and its
            # percentiles (over the results that arrived) are lower bounds
            deadline = time.monotonic() + min(60.0, 10.0 + seconds)
            while reader.count < n and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            data = reader.finish()
        finally:
            self._terminate(proc)
        phase.offered = n
        seen = [row for row in data["ids"] if row[0] < n]
        pairs = [(sent[row[0]], (row[1] - sent[row[0]]) * 1000) for row in seen]
        queue = sorted(row[2] for row in seen if row[2] >= 0)
        lat = sorted(ms for _, ms in pairs)
        # Steady state: requests sent after the warm-up (first batches pay TorchScript's profiling passes,
        # librdkafka connection set-up and the reader's first fetches).
        warm_until = start + self.args.latency_warmup_seconds
        steady = sorted(ms for sent_at, ms in pairs if sent_at >= warm_until)
        phase.latency_timeline = _timeline(pairs, start)
        phase.results = len(lat)
        phase.expired = data["expired"]
        phase.rate = n / produce_s
        if lat:
            phase.latency = {"p50_ms": _pct(lat, 50), "p90_ms": _pct(lat, 90), "p99_ms": _pct(lat, 99),
                             "max_ms": lat[-1], "offered_rate": rate, "achieved_rate": n / produce_s,
                             "seconds": produce_s, "samples": len(lat),
                             # record timestamp -> start of the scorer's batch (the rest is batch + commit + read)
                             "queue_p50_ms": _pct(queue, 50), "queue_p99_ms": _pct(queue, 99),
                             "warmup_s": self.args.latency_warmup_seconds, "steady_samples": len(steady),
                             "steady_p50_ms": _pct(steady, 50), "steady_p99_ms": _pct(steady, 99),
                             "steady_max_ms": steady[-1] if steady else float("nan")}
        if trace is not None and trace.exists():
            phase.split = latency_split(json.loads(trace.read_text()), seen, sent, acked, warm_until)
        if len(lat) < n:
            phase.error = f"fell behind: only {len(lat):,}/{n:,} results within {min(60.0, 10.0 + seconds):.0f}s " \
                          f"after the last request (percentiles are lower bounds)"
        log(f"  {phase.label}: after {self.args.latency_warmup_seconds:.0f}s warm-up p50 "
            f"{phase.latency.get('steady_p50_ms', float('nan')):.1f} ms, p99 {phase.latency.get('steady_p99_ms', float('nan')):.1f} ms; "
            f"whole run p50 {phase.latency.get('p50_ms', float('nan')):.1f} ms, "
            f"p99 {phase.latency.get('p99_ms', float('nan')):.1f} ms, max {phase.latency.get('max_ms', float('nan')):.1f}"
            f" ms over {len(lat):,} results at {n / produce_s:,.0f}/s; CPU % of one core: contestant "
            f"{phase.cpu_contestant_pct:.0f}, broker {phase.cpu_broker_pct:.0f}")
        if phase.split:
            log("  " + split_line(phase.split))
        return phase


SPLIT_STEPS = ("broker", "queue", "prepare", "wait", "produce", "commit", "visible")


def latency_split(trace: list[list], seen: list[tuple], sent: list[float], acked: list[float],
                  warm_until: float) -> dict[str, Any]:
    """Where each steady-state request's latency went, from the scorer's per-batch ``BatchTimes``:

    broker  request timestamp -> the broker acknowledged it (client linger, produce round trip; the scorer
            can fetch it from about then: a busy machine shows up here first);
    queue   acknowledged -> the batcher handed its batch over (fetch, waiting in librdkafka's queue while
            the loop was busy; slightly negative when the fetch beat the acknowledgement);
    prepare parse + validate + inference of its batch;
    wait    pipelined: the previous batch's commit was still in flight;
    produce begin_transaction + producing the batch's outputs;
    commit  send_offsets + commit_transaction;
    visible commit returned -> the reader saw the result (transaction markers, the reader's fetch).

    Returns p50/p99 of each step, and the mean of each step over the slowest 1% of requests (where the
    tail goes).
    """
    import bisect

    by_partition: dict[int, list[tuple[int, int, list[float]]]] = {}
    for span, *times in trace:
        for part, (lo, hi) in span.items():
            by_partition.setdefault(int(part), []).append((lo, hi, times))
    index = {p: (sorted(rows), [r[0] for r in sorted(rows)]) for p, rows in by_partition.items()}
    rows: list[tuple[float, ...]] = []
    for idx, seen_at, _q, part, offset in seen:
        if sent[idx] < warm_until or part not in index:
            continue
        batches, firsts = index[part]
        k = bisect.bisect_right(firsts, offset) - 1
        if k < 0 or not batches[k][0] <= offset <= batches[k][1]:
            continue
        collected, prepared, begun, produced, committed = batches[k][2]
        marks = (sent[idx], acked[idx] or sent[idx], collected, prepared, begun, produced, committed, seen_at)
        rows.append(tuple((b - a) * 1000 for a, b in zip(marks, marks[1:])) + ((seen_at - sent[idx]) * 1000,))
    if not rows:
        return {}
    sizes = [sum(hi - lo + 1 for lo, hi in span.values()) for span, *_t in trace]
    cycles = sorted(b[5] for b in trace if b[5])
    out: dict[str, Any] = {"samples": len(rows), "batches": len(trace), "mean_batch": sum(sizes) / len(sizes),
                           "max_batch": max(sizes),
                           "commits_per_s": (len(cycles) - 1) / (cycles[-1] - cycles[0]) if len(cycles) > 1 and
                           cycles[-1] > cycles[0] else 0.0}
    tail = sorted(rows, key=lambda r: r[-1])[-max(1, len(rows) // 100):]
    for i, step in enumerate(SPLIT_STEPS):
        values = sorted(r[i] for r in rows)
        out[step] = {"p50_ms": _pct(values, 50), "p99_ms": _pct(values, 99),
                     "tail_mean_ms": sum(r[i] for r in tail) / len(tail)}
    out["tail_total_mean_ms"] = sum(r[-1] for r in tail) / len(tail)
    return out


def split_line(split: dict[str, Any]) -> str:
    """One line: ``step p50/p99 [slowest-1% mean]`` per step."""
    return "split ms (p50/p99 [slowest 1% mean]): " + ", ".join(
        f"{step} {split[step]['p50_ms']:.1f}/{split[step]['p99_ms']:.1f} [{split[step]['tail_mean_ms']:.1f}]"
        for step in SPLIT_STEPS) + (f"; slowest 1% total {split['tail_total_mean_ms']:.1f}; {split['batches']} batches, "
                                    f"mean {split['mean_batch']:.1f} max {split['max_batch']} records, "
                                    f"{split['commits_per_s']:.0f} commits/s")


def _timeline(pairs: list[tuple[float, float]], start: float) -> list[list[float]]:
    """Per second of the run (by send time): [second, requests, p50, p99, max] latency in ms."""
    by_second: dict[int, list[float]] = {}
    for sent_at, ms in pairs:
        by_second.setdefault(int(sent_at - start), []).append(ms)
    out = []
    for sec in sorted(by_second):
        v = sorted(by_second[sec])
        out.append([sec, len(v), round(_pct(v, 50), 1), round(_pct(v, 99), 1), round(v[-1], 1)])
    return out


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# =============================================================================================
# The benchmark
# =============================================================================================
def scorer_settings() -> dict[str, Any]:
    """The scorer's batching and client knobs as the default ``sie score`` runs them."""
    from dataclasses import fields

    from sie.kernel.clients import eos_consumer_config, transactional_producer_config
    from sie.kernel.settings import Settings
    from sie.streams.scorer import ScorerConfig

    keep = ("max_batch", "max_wait_ms", "pipelined", "poll_timeout_ms", "fetch_queue_kbytes", "session_timeout_ms")
    out = {f.name: f.default for f in fields(ScorerConfig) if f.name in keep}
    producer = transactional_producer_config(Settings(), "t")
    consumer = eos_consumer_config(Settings(), "g", "c")
    out.update({"producer linger.ms": producer["linger.ms"], "producer retry.backoff.ms": producer["retry.backoff.ms"],
                "consumer fetch.wait.max.ms": consumer["fetch.wait.max.ms"], "acks": producer["acks"],
                "isolation.level": consumer["isolation.level"], "transaction": "one per batch (KIP-447)"})
    return out


SCORER_ENTRY: list[str] = ["-m", "sie"]  # --scorer-entry replaces it (experiments with a patched scorer)
SCORER_EXTRA: list[str] = []  # --scorer-args


def score_cmd(spec: Path, instance: str, max_wait_ms: int | None = None, profile: Path | None = None) -> list[str]:
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += [*SCORER_ENTRY, "score", "-f", str(spec), "--instance", instance, "--log-level", "warning"]
    if max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(max_wait_ms)]
    return cmd + SCORER_EXTRA


def role_cmd(role: str, cfg: dict, python: str | None = None) -> list[str]:
    return [python or sys.executable, str(Path(__file__).resolve()), "_role", role, json.dumps(cfg)]


# --- Quix Streams: its own virtualenv (quixstreams pins confluent-kafka < 2.13; SIE runs on its own version) ---
QUIX_DEFAULT_COMMIT_S = 5.0  # quixstreams.Application(commit_interval=...) default
QUIX_TUNED_COMMIT_S = 0.05  # its best latency here (bench_latency.py sweep 0.02-0.25 s, docs/benchmarks.md)
QUIX_VENV = ROOT / "bench" / ".venv-quix"
QUIX_MISSING = "no Quix Streams virtualenv: run bench/setup_quix_venv.sh (or pass --quix-python)"


def find_quix_python(explicit: str | None) -> str | None:
    """The python of the Quix virtualenv: --quix-python, $SIE_BENCH_QUIX_PYTHON, or bench/.venv-quix."""
    for candidate in (explicit, os.environ.get("SIE_BENCH_QUIX_PYTHON"), str(QUIX_VENV / "bin" / "python")):
        if candidate and Path(candidate).exists():
            check = subprocess.run([candidate, "-c", "import quixstreams, sie.schemas.validation"],
                                   capture_output=True, timeout=120)
            if check.returncode == 0:
                return candidate
            log(f"  {candidate} cannot import quixstreams + sie: {check.stderr.decode(errors='replace')[-300:]}")
    return None


def latency_rates(half: float, explicit: bool) -> list[tuple[str, float, str]]:
    """(key suffix, requests/s, label): light load, 2,000/s and half of the scorer's max throughput."""
    return [("200", 200.0, "200/s"), ("2000", 2000.0, "2,000/s"),
            ("half", half, "--latency-rate" if explicit else "half of (a)'s max")]


def run_latency_phases(bench: Bench, phases: dict[str, Phase], setup: Any, cfg: Any,
                       records: list[tuple[bytes, bytes]], args: argparse.Namespace, rate_key: str, rate: float,
                       rate_label: str, quix_python: str | None) -> None:
    """At one rate, same run: the SIE scorer (traced: time split), then Quix EOS at its default and tuned
    commit intervals (if its virtualenv exists)."""
    contestants: list[tuple[str, str, str, dict[str, Any], str | None]] = [
        (f"lat_sie_{rate_key}", f"SIE @ {rate_label}", "sie_traced", {}, None)]
    if quix_python is not None:
        contestants += [
            (f"lat_quix_{rate_key}", f"Quix EOS {QUIX_DEFAULT_COMMIT_S:g}s @ {rate_label}", "quix",
             {"commit_interval": QUIX_DEFAULT_COMMIT_S}, quix_python),
            (f"lat_quixt_{rate_key}", f"Quix EOS {args.quix_commit_interval:g}s @ {rate_label}", "quix",
             {"commit_interval": args.quix_commit_interval}, quix_python)]
    for key, label, role, extra, python in contestants:
        topics, spec, group = setup(key)
        trace = bench.tmp / f"{key}.trace.json" if role == "sie_traced" else None
        if trace is not None:
            extra = {**extra, "instance": f"bench-{key}", "trace": str(trace)}
        if role == "quix":
            extra = {**extra, "state_dir": str(bench.tmp / f"{key}-state")}
        log(f"phase {label}: {rate:,.0f} requests/s for {args.latency_seconds:.0f}s")
        ph = Phase(key, label, 1, 0, settings={"rate": rate, "rate_label": rate_label, "role": role, **extra})
        phases[key] = ph
        try:
            bench.run_latency(ph, role_cmd(role, cfg(spec, **extra), python), group, topics, records, rate,
                              args.latency_seconds, trace=trace)
        except Exception as exc:  # noqa: BLE001 - reported in the table, never hidden
            ph.error = f"failed: {exc}"
            log(f"  {label}: {ph.error}")


def exit_on_sigterm() -> None:
    """SIGTERM (e.g. ``timeout``) unwinds like Ctrl-C, so ``Bench.close`` stops the broker and the contestants."""
    def handler(*_: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000, help="requests per backlog run (default 100000)")
    ap.add_argument("--quick", action="store_true", help="20,000 requests and shorter subsets: a fast check")
    ap.add_argument("--naive-requests", type=int, default=5000, help="subset for the naive consumer")
    ap.add_argument("--naive-seconds", type=float, default=30.0, help="time cap for the naive consumer")
    ap.add_argument("--faust-requests", type=int, default=20_000, help="subset for the faust agent")
    ap.add_argument("--faust-seconds", type=float, default=60.0, help="time cap for the faust agent")
    ap.add_argument("--latency-seconds", type=float, default=20.0, help="length of the controlled-rate run")
    ap.add_argument("--latency-warmup-seconds", type=float, default=3.0,
                    help="requests sent in the first seconds of the controlled-rate run are left out of the "
                         "steady-state p50/p99 (the whole-run figures are reported too)")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="requests/s of the third controlled-rate run (default: half of (a)'s measured throughput)")
    ap.add_argument("--quix-python", default=None,
                    help="python of the Quix Streams virtualenv (default: $SIE_BENCH_QUIX_PYTHON, else "
                         "bench/.venv-quix made by bench/setup_quix_venv.sh)")
    ap.add_argument("--quix-requests", type=int, default=20_000, help="subset for the Quix backlog runs")
    ap.add_argument("--quix-seconds", type=float, default=60.0, help="time cap for the Quix backlog runs")
    ap.add_argument("--quix-commit-interval", type=float, default=QUIX_TUNED_COMMIT_S,
                    help="commit_interval (s) of the tuned Quix runs (its default is 5 s)")
    ap.add_argument("--only", default="",
                    help="comma list of phases: null,sie,sie2,naive,faust,quix,latency")
    ap.add_argument("--profile-scorer", action="store_true",
                    help="run (a) under cProfile and print the top functions (slower; numbers not comparable)")
    ap.add_argument("--scorer-entry", default=None,
                    help="experiments: run the scorer as `python SCRIPT score ...` instead of `python -m sie score ...`")
    ap.add_argument("--scorer-args", default="",
                    help="experiments: extra `sie score` options for every scorer run, e.g. '--max-batch 1024'")
    ap.add_argument("--no-write", action="store_true", help="don't write bench/results/scoring.*")
    args = ap.parse_args()
    if args.scorer_entry:
        SCORER_ENTRY[:] = [str(Path(args.scorer_entry).resolve())]
    SCORER_EXTRA[:] = shlex.split(args.scorer_args)
    if args.quick:
        args.requests = min(args.requests, 20_000)
        args.naive_requests, args.naive_seconds = min(args.naive_requests, 2000), min(args.naive_seconds, 15.0)
        args.faust_requests, args.faust_seconds = min(args.faust_requests, 10_000), min(args.faust_seconds, 30.0)
        args.quix_requests, args.quix_seconds = min(args.quix_requests, 10_000), min(args.quix_seconds, 30.0)
        args.latency_seconds = min(args.latency_seconds, 10.0)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    wanted = lambda name: not only or name in only  # noqa: E731

    started = time.time()
    load_start = os.getloadavg()
    log(f"generating {args.requests:,} requests")
    records = make_requests(args.requests)
    bench = Bench(args)
    phases: dict[str, Phase] = {}
    try:
        bench.start_broker()

        def setup(key: str) -> tuple[dict[str, str], Path, str]:
            topics = bench.topics_for(key)
            spec = bench.spec_for(key, topics)
            return topics, spec, f"bench.{bench.run_id}.{key}"

        def guarded(ph: Phase, run: Any, prefix: str = "failed") -> None:
            """Run one phase; a phase that breaks is reported with its error, the others still run."""
            phases[ph.key] = ph
            try:
                run(ph)
            except Exception as exc:  # noqa: BLE001 - reported in the table, never hidden
                ph.error = f"{prefix}: {exc}"
                log(f"  {ph.label}: {ph.error}")

        def cfg(spec: Path, **extra: Any) -> dict:
            return {"bootstrap": bench.bootstrap, "spec_file": str(spec), **extra}

        # Warm the broker (JIT, page cache, coordinators) with a short null run; not reported.
        topics, spec, group = setup("warmup")
        log("phase warmup: null pipeline on 10,000 requests (not reported)")
        bench.run_backlog(Phase("warmup", "warmup", 1, 10_000), [role_cmd("null", cfg(spec, instance="w"))],
                          group, topics, records[:10_000], None)

        if wanted("null"):
            topics, spec, group = setup("null")
            log(f"phase (b) null pipeline: {len(records):,} requests")
            guarded(Phase("null", "(b) null pipeline", 1, len(records)), lambda ph: bench.run_backlog(
                ph, [role_cmd("null", cfg(spec, instance="null-0"))], group, topics, records, None))

        if wanted("null"):
            # The same with another retry backoff: AddOffsetsToTxn meets CONCURRENT_TRANSACTIONS while the
            # coordinator still writes markers (or this transaction's AddPartitions) and librdkafka retries after
            # retry.backoff.ms (1 in the scorer's config, 5 before). The faster of (b)/(b') is the ceiling.
            topics, spec, group = setup("null_tuned")
            log(f"phase (b') null pipeline, retry.backoff.ms=5: {len(records):,} requests")
            guarded(Phase("null_tuned", "(b') null, backoff 5ms", 1, len(records)), lambda ph: bench.run_backlog(
                ph, [role_cmd("null", cfg(spec, instance="null-1", producer_extra={"retry.backoff.ms": 5}))],
                group, topics, records, None))

        if wanted("sie"):
            topics, spec, group = setup("sie")
            prof = bench.tmp / "scorer.prof" if args.profile_scorer else None
            log(f"phase (a) SIE scorer, 1 process: {len(records):,} requests" + (" (under cProfile)" if prof else ""))
            guarded(Phase("sie", "(a) SIE scorer", 1, len(records), settings=scorer_settings()),
                    lambda ph: bench.run_backlog(ph, [score_cmd(spec, "bench-0", profile=prof)], group, topics,
                                                 records, None))
            if prof is not None and prof.exists():
                import pstats

                print("\n--- cProfile of the scorer (tottime) ---")
                pstats.Stats(str(prof)).sort_stats("tottime").print_stats(30)
                print("--- (cumulative) ---")
                pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(40)

        if wanted("sie2"):
            topics, spec, group = setup("sie2")
            log(f"phase (a2) SIE scorer, 2 processes in one group: {len(records):,} requests")
            guarded(Phase("sie2", "(a2) SIE scorer x2", 2, len(records), settings=scorer_settings()),
                    lambda ph: bench.run_backlog(ph, [score_cmd(spec, "bench-0"), score_cmd(spec, "bench-1")],
                                                 group, topics, records, None))

        def subset_run(key: str, label: str, role: str, n: int, cap_s: float, prefix: str, **extra: Any) -> None:
            topics, spec, group = setup(key)
            subset = records[: min(n, len(records))]
            log(f"phase {label}: first {len(subset):,} requests, cap {cap_s:.0f}s after the first result")

            def run(ph: Phase) -> None:
                python = extra.pop("python", None)
                bench.run_backlog(ph, [role_cmd(role, cfg(spec, **extra), python)], group, topics, subset, cap_s)
                if role == "quix" and ph.drain_s > 0:
                    # Quix makes results visible only at its commits (every commit_interval): with a 5 s interval
                    # a whole subset can appear at once, so results/s between visible results means nothing;
                    # its rate is results / (first request produced -> last result visible)
                    ph.rate = ph.rate_first_to_last = ph.results / ph.drain_s
                ph.subset_note = f"subset: {ph.results:,} of the first {len(subset):,} requests {ph.subset_note}"

            guarded(Phase(key, label, 1, len(subset)), run, prefix)

        if wanted("naive"):
            subset_run("naive", "(c) naive consumer", "naive", args.naive_requests, args.naive_seconds, "failed")
        if wanted("faust"):
            subset_run("faust", "(d) faust agent", "faust", args.faust_requests, args.faust_seconds,
                       "not measurable", datadir=str(bench.tmp / "faust-data"))

        quix_python = find_quix_python(args.quix_python)
        if wanted("quix") and quix_python is None:
            for key, label in (("quix", "(e) Quix EOS"), ("quix_tuned", "(e') Quix EOS tuned")):
                phases[key] = Phase(key, label, 1, 0, error=f"not measured: {QUIX_MISSING}")
        elif wanted("quix"):
            for key, label, interval in (("quix", "(e) Quix EOS", QUIX_DEFAULT_COMMIT_S),
                                         ("quix_tuned", "(e') Quix EOS", args.quix_commit_interval)):
                subset_run(key, f"{label} {interval:g}s", "quix", args.quix_requests, args.quix_seconds, "failed",
                           python=quix_python, commit_interval=interval, state_dir=str(bench.tmp / f"{key}-state"))

        if wanted("latency"):
            base = phases.get("sie")
            max_rate = base.rate if base and base.rate else 0.0
            half = args.latency_rate or (max_rate / 2 if max_rate else 2000.0)
            for rate_key, rate, rate_label in latency_rates(half, bool(args.latency_rate)):
                run_latency_phases(bench, phases, setup, cfg, records, args, rate_key, rate, rate_label,
                                   quix_python if wanted("quix") else None)
    finally:
        bench.close()

    report = build_report(phases, args, started, load_start)
    print()
    print(report["text"])
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "scoring.txt").write_text(report["text"] + "\n")
        (RESULTS_DIR / "scoring.json").write_text(json.dumps(report["json"], indent=2) + "\n")
        log(f"wrote {RESULTS_DIR / 'scoring.txt'} and scoring.json")
    return 0


# =============================================================================================
# Report
# =============================================================================================
def build_report(phases: dict[str, Phase], args: argparse.Namespace, started: float,
                 load_start: tuple[float, float, float]) -> dict[str, Any]:
    sie = phases.get("sie")
    a = sie.rate if sie else 0.0

    def ratio(other: str) -> float | None:
        ph = phases.get(other)
        return (a / ph.rate) if (a and ph and ph.rate) else None

    nulls = [phases[k] for k in ("null", "null_tuned") if k in phases and phases[k].rate]
    best_null = max(nulls, key=lambda ph: ph.rate) if nulls else None

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    lines = [
        f"# Scoring throughput and latency (bench/bench_scoring.py, {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC)",
        f"# {os.cpu_count()} cores, python {platform.python_version()}, one private Kafka broker on the same machine; "
        f"model examples/fraud-scorer.yaml (TorchScript MLP, CPU, 1 torch thread); topics with {PARTITIONS} partitions; commit {commit}",
        "# backlog runs: contestant ready (group stable, all partitions assigned), then all requests produced at once",
        "# (in 'prod s'); results/s = results seen by a read_committed reader (own process) per second from the moment",
        "# the last request was acknowledged to the last result (the backlog drain); 'f->l/s' = over first -> last result;",
        "# drain = first request produced -> last result seen. cpu/broker = % of one core during the run.",
        "",
        f"{'contestant':<24}{'procs':>6}{'requests':>10}{'results':>9}{'results/s':>11}{'f->l/s':>9}{'prod s':>8}"
        f"{'drain s':>9}{'cpu %':>7}{'broker %':>9}  note",
    ]
    for key in ("null", "null_tuned", "sie", "sie2", "naive", "faust", "quix", "quix_tuned"):
        ph = phases.get(key)
        if ph is None:
            continue
        note = ph.error or ph.subset_note
        if ph.expired:
            note = f"{note}; {ph.expired} EXPIRED results".strip("; ")
        lines.append(f"{ph.label:<24}{ph.processes:>6}{ph.offered:>10,}{ph.results:>9,}{ph.rate:>11,.0f}"
                     f"{ph.rate_first_to_last:>9,.0f}{ph.burst_s:>8.1f}{ph.drain_s:>9.1f}{ph.cpu_contestant_pct:>7.0f}"
                     f"{ph.cpu_broker_pct:>9.0f}  {note}")
    lat_phases = [ph for k, ph in phases.items() if k.startswith("lat_")]
    if lat_phases:
        lines += ["", "controlled rate, same run; end-to-end = request record timestamp (set when handed to the client, "
                      "linger.ms 1) -> result visible to a read_committed reader; steady state = after a "
                      f"{args.latency_warmup_seconds:g}s warm-up:",
                  f"  {'contestant @ rate':<36}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
                  f"{'results':>9}{'cpu %':>7}{'broker %':>9}  note"]
    for lat in lat_phases:
        L = lat.latency
        if not L:
            lines.append(f"  {lat.label:<36}{'':>8}{'':>9}{'':>9}{'':>9}{lat.results:>9,}{'':>16}  "
                         f"{lat.error or 'no results'}")
            continue
        lines.append(f"  {lat.label:<36}{L['achieved_rate']:>8,.0f}{L['steady_p50_ms']:>9.1f}{L['steady_p99_ms']:>9.1f}"
                     f"{L['steady_max_ms']:>9.1f}{lat.results:>9,}{lat.cpu_contestant_pct:>7.0f}{lat.cpu_broker_pct:>9.0f}"
                     f"  {lat.error}")
        if lat.split:
            lines.append("      " + split_line(lat.split))
        if lat.latency_timeline:
            lines.append("      p99 ms per second of the run: " + " ".join(f"{row[3]:.0f}" for row in lat.latency_timeline))

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, goal: float, fmt: str, higher_better: bool = True) -> None:
        if value is None:
            targets.append({"target": name, "value": None, "goal": goal, "met": None})
            lines.append(f"  {name:<52} {'n/a':>10}   goal {fmt.format(goal)}  NOT MEASURED")
            return
        met = value >= goal if higher_better else value <= goal
        targets.append({"target": name, "value": value, "goal": goal, "met": met})
        lines.append(f"  {name:<52} {fmt.format(value):>10}   goal {('>= ' if higher_better else '<= ') + fmt.format(goal)}"
                     f"  {'met' if met else 'MISSED'}")

    lines += ["", "targets:"]
    target(f"(a) / {best_null.label if best_null else '(b) null pipeline'} (faster null)",
           ratio(best_null.key) if best_null else None, TARGETS["vs_null"], "{:.2f}x")
    target("(a) / (c) naive consumer", ratio("naive"), TARGETS["vs_naive"], "{:.1f}x")
    target("(a) / (d) faust agent", ratio("faust"), TARGETS["vs_faust"], "{:.1f}x")
    for rate_key, goal in TARGETS["p99_ms"].items():
        ph = phases.get(f"lat_sie_{rate_key}")
        label = ph.settings.get("rate_label", rate_key) if ph else rate_key
        target(f"SIE p99 @ {label} (ms)", ph.latency.get("steady_p99_ms") if ph and ph.latency else None, goal,
               "{:.1f}", higher_better=False)
    comparisons = []
    for key in ("quix", "quix_tuned"):
        q = phases.get(key)
        if sie and q and q.rate and sie.rate:
            comparisons.append(f"  throughput (a) / {q.label}: {sie.rate / q.rate:.1f}x")
    for rate_key in TARGETS["p99_ms"]:
        s_ph = phases.get(f"lat_sie_{rate_key}")
        for qkey in ("lat_quix_", "lat_quixt_"):
            q_ph = phases.get(qkey + rate_key)
            if s_ph and q_ph and s_ph.latency and q_ph.latency:
                comparisons.append(f"  p99 {q_ph.label} / SIE: {q_ph.latency['steady_p99_ms'] / s_ph.latency['steady_p99_ms']:.1f}x "
                                   f"(p50 {q_ph.latency['steady_p50_ms'] / s_ph.latency['steady_p50_ms']:.1f}x)")
    if comparisons:
        lines += ["", "SIE vs Quix Streams EOS (same run; > 1 = SIE better):", *comparisons]
    sie2 = phases.get("sie2")
    if sie and sie2 and sie.rate and sie2.rate:
        lines.append(f"  2 scorer processes / 1: {sie2.rate / sie.rate:.2f}x (no target; {os.cpu_count()} cores "
                     f"shared by broker, scorers and reader)")
    if sie:
        lines += ["", "scorer settings (sie score defaults): "
                  + ", ".join(f"{k}={v}" for k, v in sie.settings.items())]
    if SCORER_EXTRA or SCORER_ENTRY != ["-m", "sie"]:
        lines.append(f"NOT THE DEFAULT SCORER: entry {' '.join(SCORER_ENTRY)}, extra args {' '.join(SCORER_EXTRA)!r}")
    lines += ["", "baselines: (b) the scorer's own librdkafka settings and batching (max_batch, max_wait_ms above), one transaction per batch, "
                  "bytes copied; (b') the same with producer retry.backoff.ms=5 instead of 1; (c) json + 1-row infer + produce + flush + commit(sync) per message, no validation; "
                  "(d) faust-streaming agent, json serializer, validate + 1-row infer + send per event, at_least_once; "
                  "(e) Quix Streams Application, processing_guarantee exactly-once, json, validate + 1-row infer per message, "
                  "to_topic; commit_interval 5 s (its default) and tuned (e'), in its own virtualenv (confluent-kafka < 2.13)"]
    load_end = os.getloadavg()
    lines.append(f"load average at start {load_start[0]:.1f}, at end {load_end[0]:.1f}; "
                 f"total time {time.time() - started:.0f}s; requests per backlog run {args.requests:,}")
    js = {"commit": commit, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "cores": os.cpu_count(),
          "python": platform.python_version(), "partitions": PARTITIONS, "requests": args.requests,
          "load_start": load_start, "load_end": load_end, "phases": {k: asdict(v) for k, v in phases.items()},
          "targets": targets}
    return {"text": "\n".join(lines), "json": js}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "_role":
        ROLES[sys.argv[2]](json.loads(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
