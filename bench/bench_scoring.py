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
* latency        the SIE scorer again, fed by a rate-limited producer at half of (a)'s
                 measured throughput; end-to-end latency = request produce time (the
                 record's timestamp) -> result visible to the read_committed reader.

Throughput of a backlog run: the contestant is started on an empty topic and waited
for until its consumer group is stable with every partition assigned (so start-up and
the first rebalance are not measured), then all requests are produced at once; the
rate is results/s between the first and the last result the reader sees.

Usage: ``python bench/bench_scoring.py [--requests 100000] [--quick] [--only sie,null]``;
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
TARGETS = {"vs_null": 0.5, "vs_naive": 10.0, "vs_faust": 3.0, "p99_ms": 50.0}


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
        msgs = consumer.consume(n_max, wait_s)  # returns when full or after max_wait, like the scorer's batcher
        if not msgs:
            continue
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


ROLES = {"null": role_null, "naive": role_naive, "faust": role_faust}


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
    ids: list[tuple[int, float, float]] = []  # (request index, seen at, the scorer's timings.queue_ms)
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
                ids.append((int(doc["id"][1:]), t, doc.get("timings", {}).get("queue_ms", -1.0)))
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
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    settings: dict[str, Any] = field(default_factory=dict)
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
                    records: list[tuple[bytes, bytes]], rate: float, seconds: float) -> Phase:
        from confluent_kafka import Producer

        n = max(1, int(rate * seconds))
        if n > len(records):  # the same generator, longer: the first len(records) are the backlog runs' requests
            records = make_requests(n)
        proc = self.spawn(phase.key, cmd)
        try:
            self.wait_group(group, topics["requests"], 1, [proc])
            reader = Reader(self.bootstrap, topics["results"], n, want_ids=True)
            log(f"  {phase.label}: producing {n:,} requests at {rate:,.0f}/s for {n / rate:.0f}s")
            p = Producer({"bootstrap.servers": self.bootstrap})  # librdkafka defaults (linger.ms 5), like a client
            sent = [0.0] * n
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
                    p.produce(topics["requests"], value, key, timestamp=int(t * 1000))
                    i += 1
                p.poll(0)
                if now >= next_note:
                    log(f"  {phase.label}: sent {i:,}/{n:,}, results {reader.count:,}")
                    next_note = now + 3
                time.sleep(0.0005)
            produce_s = time.time() - start
            p.flush(30)
            deadline = time.monotonic() + 60
            while reader.count < n and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            data = reader.finish()
        finally:
            self._terminate(proc)
        phase.offered = n
        pairs = [(sent[idx], (t - sent[idx]) * 1000) for idx, t, _q in data["ids"] if idx < n]
        queue = sorted(q for idx, _t, q in data["ids"] if idx < n and q >= 0)
        lat = sorted(ms for _, ms in pairs)
        # Steady state: requests sent after the warm-up (first batches pay TorchScript's profiling passes,
        # librdkafka connection set-up and the reader's first fetches).
        steady = sorted(ms for sent_at, ms in pairs if sent_at >= start + self.args.latency_warmup_seconds)
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
        if len(lat) < n:
            phase.error = f"only {len(lat):,}/{n:,} results arrived"
        log(f"  {phase.label}: after {self.args.latency_warmup_seconds:.0f}s warm-up p50 "
            f"{phase.latency.get('steady_p50_ms', float('nan')):.1f} ms, p99 {phase.latency.get('steady_p99_ms', float('nan')):.1f} ms; "
            f"whole run p50 {phase.latency.get('p50_ms', float('nan')):.1f} ms, "
            f"p99 {phase.latency.get('p99_ms', float('nan')):.1f} ms, max {phase.latency.get('max_ms', float('nan')):.1f}"
            f" ms over {len(lat):,} results at {n / produce_s:,.0f}/s")
        return phase


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

    from sie.streams.scorer import ScorerConfig

    keep = ("max_batch", "max_wait_ms", "poll_timeout_ms", "fetch_queue_kbytes", "session_timeout_ms")
    out = {f.name: f.default for f in fields(ScorerConfig) if f.name in keep}
    out.update({"producer linger.ms": 5, "consumer fetch.wait.max.ms": 50, "acks": "all",
                "isolation.level": "read_committed", "transaction": "one per batch (KIP-447)"})
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


def role_cmd(role: str, cfg: dict) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "_role", role, json.dumps(cfg)]


def main() -> int:
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
    ap.add_argument("--latency-max-wait-ms", type=int, default=None,
                    help="scorer --max-wait-ms for the latency run (default: the scorer's default)")
    ap.add_argument("--tuned-max-wait-ms", type=int, default=2,
                    help="if the default misses the p99 target, the latency run is repeated with this max_wait_ms "
                         "(0 = don't)")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="requests/s of the controlled-rate run (default: half of (a)'s measured throughput)")
    ap.add_argument("--only", default="", help="comma list of phases: null,sie,sie2,naive,faust,latency")
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
            # The same, with a short retry backoff: after commit_transaction() the coordinator is still writing
            # the markers, the next AddPartitions/AddOffsetsToTxn gets CONCURRENT_TRANSACTIONS and librdkafka
            # retries after retry.backoff.ms (5 in the scorer's config). The faster of (b)/(b') is the ceiling.
            topics, spec, group = setup("null_tuned")
            log(f"phase (b') null pipeline, retry.backoff.ms=2: {len(records):,} requests")
            guarded(Phase("null_tuned", "(b') null, backoff 2ms", 1, len(records)), lambda ph: bench.run_backlog(
                ph, [role_cmd("null", cfg(spec, instance="null-1", producer_extra={"retry.backoff.ms": 2}))],
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
                bench.run_backlog(ph, [role_cmd(role, cfg(spec, **extra))], group, topics, subset, cap_s)
                ph.subset_note = f"subset: {ph.results:,} of the first {len(subset):,} requests {ph.subset_note}"

            guarded(Phase(key, label, 1, len(subset)), run, prefix)

        if wanted("naive"):
            subset_run("naive", "(c) naive consumer", "naive", args.naive_requests, args.naive_seconds, "failed")
        if wanted("faust"):
            subset_run("faust", "(d) faust agent", "faust", args.faust_requests, args.faust_seconds,
                       "not measurable", datadir=str(bench.tmp / "faust-data"))

        if wanted("latency"):
            base = phases.get("sie")
            rate = args.latency_rate or (base.rate if base and base.rate else 2000.0) / 2

            def latency_run(key: str, max_wait_ms: int | None, fraction: float = 0.5) -> Phase:
                topics, spec, group = setup(key)
                r = rate * fraction / 0.5
                label = f"SIE @ {fraction:g} of max" + (f", max_wait {max_wait_ms}" if max_wait_ms is not None else "")
                log(f"phase {label}: {r:,.0f} requests/s for {args.latency_seconds:.0f}s")
                ph = Phase(key, label, 1, 0, settings=scorer_settings())
                ph.settings["rate_fraction_of_max"] = fraction
                if max_wait_ms is not None:
                    ph.settings["max_wait_ms"] = max_wait_ms
                guarded(ph, lambda ph: bench.run_latency(ph, score_cmd(spec, f"bench-{key}", max_wait_ms), group,
                                                         topics, records, r, args.latency_seconds))
                return ph

            first = latency_run("latency", args.latency_max_wait_ms)
            p99 = first.latency.get("steady_p99_ms", float("inf"))
            if args.latency_max_wait_ms is None and not p99 <= TARGETS["p99_ms"] and args.tuned_max_wait_ms:
                log(f"  p99 {p99:.0f} ms misses {TARGETS['p99_ms']:.0f} ms with the default max_wait_ms: "
                    f"again with --max-wait-ms {args.tuned_max_wait_ms}, then at a quarter of max (informational)")
                latency_run("latency_tuned", args.tuned_max_wait_ms)
                latency_run("latency_quarter", args.latency_max_wait_ms, 0.25)
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
    for key in ("null", "null_tuned", "sie", "sie2", "naive", "faust"):
        ph = phases.get(key)
        if ph is None:
            continue
        note = ph.error or ph.subset_note
        if ph.expired:
            note = f"{note}; {ph.expired} EXPIRED results".strip("; ")
        lines.append(f"{ph.label:<24}{ph.processes:>6}{ph.offered:>10,}{ph.results:>9,}{ph.rate:>11,.0f}"
                     f"{ph.rate_first_to_last:>9,.0f}{ph.burst_s:>8.1f}{ph.drain_s:>9.1f}{ph.cpu_contestant_pct:>7.0f}"
                     f"{ph.cpu_broker_pct:>9.0f}  {note}")
    lat_phases = [phases[k] for k in ("latency", "latency_tuned", "latency_quarter") if k in phases]
    if lat_phases:
        how = "half of (a)'s throughput" if not args.latency_rate else "set by --latency-rate"
        lines += ["", f"controlled rate ({how}); end-to-end = request record timestamp -> result visible to a "
                      f"read_committed reader:"]
    for lat in lat_phases:
        L = lat.latency
        if not L:
            lines.append(f"  max_wait_ms {lat.settings.get('max_wait_ms')}: {lat.error or 'no results'}")
            continue
        lines.append(f"  {lat.settings.get('rate_fraction_of_max', 0.5):g} of max, max_wait_ms {lat.settings.get('max_wait_ms'):>3}: "
                     f"{L['achieved_rate']:,.0f} requests/s for "
                     f"{L['seconds']:.0f}s: after a {L['warmup_s']:.0f}s warm-up p50 {L['steady_p50_ms']:.1f} ms, "
                     f"p99 {L['steady_p99_ms']:.1f} ms, max {L['steady_max_ms']:.1f} ms ({L['steady_samples']:,} requests)"
                     + (f"  [{lat.error}]" if lat.error else ""))
        lines.append(f"      whole run: p50 {L['p50_ms']:.1f} ms, p90 {L['p90_ms']:.1f} ms, p99 {L['p99_ms']:.1f} ms, "
                     f"max {L['max_ms']:.1f} ms over {L['samples']:,} requests")
        lines.append(f"      of which queued before the scorer's batch started (result timings.queue_ms): "
                     f"p50 {L.get('queue_p50_ms', float('nan')):.1f} ms, p99 {L.get('queue_p99_ms', float('nan')):.1f} ms")
        if lat.latency_timeline:
            lines.append("      p99 ms per second of the run: " + " ".join(f"{row[3]:.0f}" for row in lat.latency_timeline))

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, goal: float, fmt: str, higher_better: bool = True) -> None:
        if value is None:
            targets.append({"target": name, "value": None, "goal": goal, "met": None})
            lines.append(f"  {name:<44} {'n/a':>10}   goal {fmt.format(goal)}  NOT MEASURED")
            return
        met = value >= goal if higher_better else value <= goal
        targets.append({"target": name, "value": value, "goal": goal, "met": met})
        lines.append(f"  {name:<44} {fmt.format(value):>10}   goal {('>= ' if higher_better else '<= ') + fmt.format(goal)}"
                     f"  {'met' if met else 'MISSED'}")

    lines += ["", "targets:"]
    target(f"(a) / {best_null.label if best_null else '(b) null pipeline'} (faster null)",
           ratio(best_null.key) if best_null else None, TARGETS["vs_null"], "{:.2f}x")
    target("(a) / (c) naive consumer", ratio("naive"), TARGETS["vs_naive"], "{:.1f}x")
    target("(a) / (d) faust agent", ratio("faust"), TARGETS["vs_faust"], "{:.1f}x")
    if not lat_phases:
        target("p99 at half of (a)'s max throughput (ms)", None, TARGETS["p99_ms"], "{:.1f}", higher_better=False)
    for lat in lat_phases:
        frac = lat.settings.get("rate_fraction_of_max", 0.5)
        name = "half" if frac == 0.5 else f"{frac:g} (info)"
        target(f"p99 at {name} of (a)'s max, max_wait_ms {lat.settings.get('max_wait_ms')} (ms)",
               lat.latency.get("steady_p99_ms"), TARGETS["p99_ms"], "{:.1f}", higher_better=False)
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
                  "bytes copied; (b') the same with producer retry.backoff.ms=2 instead of 5; (c) json + 1-row infer + produce + flush + commit(sync) per message, no validation; "
                  "(d) faust-streaming agent, json serializer, validate + 1-row infer + send per event, at_least_once"]
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
