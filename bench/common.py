"""What the throughput and latency benchmarks share (bench_scoring.py, bench_latency.py): the request records,
a private broker and its topics, contestant processes started and stopped, the read_committed reader process that
times results, CPU accounting, backlog and controlled-rate runs (``Bench``), the per-request time split of the
traced scorer, the run's header facts (commit, load average), and the commands that start the SIE scorer
(``sie score``), a contestant role of bench_scoring.py, or Quix Streams' own virtualenv.

bench/ is not a package: the scripts put their folder on ``sys.path`` (running ``python bench/X.py`` does) and
``import common``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC_FILE = ROOT / "examples" / "fraud-scorer.yaml"
RESULTS_DIR = ROOT / "bench" / "results"
PARTITIONS = 6


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
        self.kafka = LocalKafka(Settings(kafka_jit="full"), brokers=1, base_port=base, data_dir=self.tmp / "kafka")  # peak throughput: C2 too
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


def score_cmd(spec: Path, instance: str, max_wait_ms: int | None = None, profile: Path | None = None,
              flags: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += [*SCORER_ENTRY, "score", "-f", str(spec), "--instance", instance, "--log-level", "warning"]
    if max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(max_wait_ms)]
    return cmd + list(flags) + SCORER_EXTRA


#: the contestants' own processes (null copy, naive consumer, faust, traced scorer, Quix) are roles of this script
ROLES_SCRIPT = Path(__file__).resolve().parent / "bench_scoring.py"


def role_cmd(role: str, cfg: dict, python: str | None = None) -> list[str]:
    """``python bench/bench_scoring.py _role ROLE JSON``: one contestant in a process of its own."""
    return [python or sys.executable, str(ROLES_SCRIPT), "_role", role, json.dumps(cfg)]


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


def exit_on_sigterm() -> None:
    """SIGTERM (e.g. ``timeout``) unwinds like Ctrl-C, so ``Bench.close`` stops the broker and the contestants."""
    def handler(*_: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


# --- the run's header facts ------------------------------------------------------------------------------------
#: a 1-minute load average above this on 2 cores means other work shared the machine: compare within the run
LOADED = 1.5


def git_commit() -> str:
    """The checkout's short commit (results name the code they measured), ``?`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def load_line(load_start: tuple[float, float, float], load_end: tuple[float, float, float]) -> str:
    """``load average at start X, at end Y``, flagged when the machine was shared (the results are then only
    comparable within the run, as ratios)."""
    loaded = max(load_start[0], load_end[0]) > LOADED
    return (f"load average at start {load_start[0]:.1f}, at end {load_end[0]:.1f}"
            + ("  (SHARED, LOADED MACHINE: compare within the run)" if loaded else ""))
