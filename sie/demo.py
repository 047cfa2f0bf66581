"""`sie demo`: SIE end to end on a local Kafka, every step printed, nothing faked.

1. Kafka (KRaft) on 127.0.0.1:9092 from Maven Central jars, SIE's system topics.
2. The SIE article's two specs validated and applied as written; what SIE cannot honour is named.
3. A control plane and two node agents (simulated GPUs, one tier-0 node), two demo models placed and
   READY after a real readiness inference.
4. 10,000 scoring requests (plus a few poison ones) through the exactly-once scorer: results,
   throughput, latency percentiles, dead letters by reason.
5. Canal CDC events of a `shop.orders` table converted exactly once and scored in real time.
6. A backfill re-scoring the demo's requests into the backfill topic, with its report.
7. The cluster as an operator sees it: nodes, replicas, and why the article's model is unschedulable.

The demo uses the broker named by SIE_BOOTSTRAP_SERVERS when it is not the default, else it starts
one. Processes it starts are stopped at the end (Kafka is left running: `sie kafka down`).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState

# The examples ship as package data (``sie.examples``), so the demo runs from an installed SIE too.
EXAMPLES = Path(str(importlib.resources.files("sie.examples")))
ARTICLE_SPECS = [EXAMPLES / "article" / "model-spec.yaml", EXAMPLES / "article" / "qwen2-7b-scoring.yaml"]
DEMO_SPECS = [EXAMPLES / "fraud-scorer.yaml", EXAMPLES / "fraud-rules.yaml"]


def example(relative: str) -> str:
    """The absolute path of a shipped example (``examples/...``): the demo's commands run in its work and log
    folders, where a relative ``examples/...`` does not exist."""
    return str(EXAMPLES.parent / relative)
Echo = Callable[[str], None]


class DemoError(SieError):
    """A demo step did not reach its goal in time; the message names the step and where its logs are."""


def generate_transactions(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """Deterministic synthetic card transactions in the fraud models' input schema."""
    rng = np.random.default_rng(seed)
    amount = np.clip(rng.lognormal(3.6, 1.3, n), 0.5, 999_999.0).round(2)
    merchant_risk = rng.beta(2.0, 5.0, n).round(4)
    hour = rng.integers(0, 24, n)
    age = np.minimum(rng.exponential(500.0, n), 3650).astype(int)
    foreign = rng.random(n) < 0.12
    tx24 = rng.poisson(2.0, n)
    return [
        {"amount": float(amount[i]), "merchant_risk": float(merchant_risk[i]), "hour": int(hour[i]),
         "account_age_days": int(age[i]), "is_foreign": bool(foreign[i]), "tx_count_24h": int(tx24[i])}
        for i in range(n)
    ]


# Poison records mixed into the stream: each must land in the dead-letter topic with its reason.
POISON: list[tuple[str, bytes]] = [
    ("invalid_json", b"{this is not json"),
    ("schema_violation", json.dumps({"id": "poison-type", "inputs": {"amount": "a lot"}}).encode()),
    ("schema_violation", json.dumps({"id": "poison-range", "inputs": {
        "amount": 10.0, "merchant_risk": 7.0, "hour": 3, "account_age_days": 1, "is_foreign": False,
        "tx_count_24h": 1}}).encode()),
    ("invalid_json", b"\xff\xfe\x00binary"),
]


@dataclass
class Processes:
    """The processes the demo started, stopped by PID (never by name pattern) at the end."""

    log_dir: Path
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "sie", *args], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=self.log_dir, start_new_session=True)
        self.started.append((name, proc))
        return proc

    def stop_all(self, echo: Echo, timeout: float = 20.0) -> None:
        for _name, proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, proc in reversed(self.started):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
                echo(f"  stopped {name} (exit {proc.returncode})")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                echo(f"  killed {name}: it did not stop within {timeout:.0f} s")


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, logs: Path, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise DemoError(f"{what}: not reached within {timeout:.0f} s; see the logs in {logs}")


def http_json(url: str, token: str | None = None, timeout: float = 3.0) -> Any:
    """GET ``url`` with a bearer token; None while the control plane does not answer (or refuses)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except OSError:
        return None


class Demo:
    """The demo's steps, in order; each prints what it does and what it saw."""

    def __init__(self, settings: Settings, echo: Echo, requests: int = 10_000, http_port: int = 8470,
                 keep_models: bool = False) -> None:
        self.settings = settings
        #: the specs the demo applied (deleted at its end unless ``keep_models``: the user's cluster is theirs)
        self.applied: dict[str, Any] = {}
        self.keep_models = keep_models
        self.echo = echo
        self.requests = requests
        self.http = f"http://127.0.0.1:{http_port}"
        self.http_port = http_port
        self.work = settings.cache_dir / "demo"
        self.work.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self.procs = Processes(self.work / "logs")

    def api(self, path: str) -> Any:
        """GET a control-plane route with the local operator token (``sie control`` writes it at its first
        start when no token is configured; SIE_API_TOKEN wins)."""
        from sie.control.api.auth import client_token

        return http_json(f"{self.http}{path}", client_token(self.settings))

    def step(self, title: str) -> None:
        self.echo(f"\n==> {title}")

    def run(self) -> None:
        try:
            self.kafka()
            self.article_specs()
            self.cluster()
            self.scoring()
            self.cdc()
            self.backfill()
            self.operator_view()
        finally:
            self.remove_models()
            self.step("stopping the control plane and agents (SIGTERM: drain, commit, leave the group)")
            self.procs.stop_all(self.echo)
            self.echo(f"Kafka keeps running on {self.settings.bootstrap_servers}: `sie kafka down` stops it.")

    def apply(self, spec: Any) -> None:
        from sie.schemas.spec_store import publish_spec

        publish_spec(self.settings, spec)
        self.applied[spec.name] = spec

    def remove_models(self) -> None:
        """Delete the models the demo applied: a demo run against the user's own cluster (SIE_BOOTSTRAP_SERVERS)
        must not leave three models there (``--keep-models`` keeps them, to look at afterwards)."""
        if not self.applied:
            return
        names = ", ".join(sorted(self.applied))
        if self.keep_models:
            self.echo(f"\n(--keep-models: {names} stay applied; `sie delete model NAME` removes each)")
            return
        from sie.schemas.spec_store import delete_spec

        self.step(f"removing the demo's models ({names}): `sie demo --keep-models` keeps them")
        for name, spec in sorted(self.applied.items()):
            try:
                delete_spec(self.settings, spec)
            except Exception as exc:  # the demo's own failure (if any) is what the user must see first
                self.echo(f"  {name}: not deleted ({str(exc).splitlines()[0]}); `sie delete model {name}`")
            else:
                self.echo(f"  deleted {name}")
        self.applied.clear()

    # -- 1 -----------------------------------------------------------------------------------------
    def kafka(self) -> None:
        from sie.infra.kafka import LocalKafka
        from sie.kernel.admin import ensure_topics
        from sie.kernel.topics import system_topics

        self.step("Kafka")
        if self.settings.bootstrap_servers == Settings.model_fields["bootstrap_servers"].default:
            bootstrap = LocalKafka(self.settings, echo=self.echo).up()
            self.echo(f"  local KRaft broker answering on {bootstrap}")
        else:
            from sie.kernel.admin import require_cluster

            require_cluster(self.settings)  # one line within seconds if it does not answer
            self.echo(f"  using SIE_BOOTSTRAP_SERVERS={self.settings.bootstrap_servers}")
        report = ensure_topics(self.settings, system_topics(self.settings.topic_prefix))
        self.echo(report.table())

    # -- 2 -----------------------------------------------------------------------------------------
    def article_specs(self) -> None:
        from sie.schemas.spec import load

        self.step("the SIE article's two specs, validated and applied as written")
        for path in ARTICLE_SPECS:
            spec = load(path, topic_prefix=self.settings.topic_prefix)
            self.echo(f"  {path.relative_to(EXAMPLES.parent)}: ok, {spec.name} {spec.version} ({spec.backend.type}, "
                      f"{spec.resources.gpu_memory_mb} MiB GPU memory x {max(spec.resources.gpus, 1)} GPU)")
            for warning in spec.warnings:
                self.echo(f"    warning: {warning}")
            self.apply(spec)
            self.echo(f"    applied to {self.settings.topic_prefix}.specs (key {spec.name})")
        self.echo("  (both documents name qwen2-7b-scoring: the Kubernetes-style one, applied last, is current)")

    # -- 3 -----------------------------------------------------------------------------------------
    def cluster(self) -> None:
        from sie.schemas.spec import load

        self.step("control plane and two node agents (simulated GPUs: no GPU on this machine)")
        env = self.env()
        self.procs.start("control", ["control", "--http-port", str(self.http_port), "--http-host", "127.0.0.1",
                                     "--instance", "demo-control"], env)
        self.procs.start("agent-gpu-01", ["agent", "--node", "gpu-01", "--tier", "tier-0",
                                          "--simulate-gpus", "2xL4-24GB", "--labels", "zone=a"], env)
        self.procs.start("agent-gpu-02", ["agent", "--node", "gpu-02", "--simulate-gpus", "2xL4-24GB",
                                          "--labels", "zone=b"], env)
        logs = self.procs.log_dir
        wait_for("control plane leading", lambda: (self.api("/healthz") or {}).get("role") == "leader",
                 60, logs)
        wait_for("both agents online", lambda: sum(
            1 for n in (self.api("/v1/nodes") or {}).get("nodes", []) if n.get("status") == "online") >= 2,
                 60, logs)
        self.echo(f"  control plane leading at {self.http}; nodes gpu-01 (tier-0) and gpu-02 online")
        for path in DEMO_SPECS:
            spec = load(path, topic_prefix=self.settings.topic_prefix)
            self.apply(spec)
            self.echo(f"  applied {spec.name} {spec.version}: {spec.backend.type}, {spec.priority_level}, "
                      f"{spec.sla.min_replicas} replica(s)")
        started = time.monotonic()

        def ready() -> bool:
            replicas = (self.api("/v1/replicas") or {}).get("replicas", [])
            mine = [r for r in replicas if r.get("model") in ("fraud-scorer", "fraud-rules")]
            return len(mine) >= 2 and all(r.get("state") == ReplicaState.READY for r in mine)

        wait_for("demo models READY", ready, 120, logs)
        self.echo(f"  fraud-scorer and fraud-rules READY after {time.monotonic() - started:.1f} s "
                  "(each passed a real inference of its exampleInput)")
        for r in (self.api("/v1/replicas") or {}).get("replicas", []):
            self.echo(f"    {r.get('replica_id'):<22} {r.get('state'):<14} node={r.get('node')} "
                      f"{r.get('reason') or ''}".rstrip())

    # -- 4 -----------------------------------------------------------------------------------------
    def scoring(self) -> None:
        from sie.connectors.producer import RequestProducer
        from sie.connectors.results import ResultCollector
        from sie.kernel.clients import KafkaClients, idempotent_producer_config
        from sie.kernel.names import ModelTopics

        self.step(f"scoring {self.requests:,} requests exactly once")
        topics = ModelTopics.default_for("fraud-scorer", self.settings.topic_prefix)
        transactions = generate_transactions(self.requests)
        run = time.strftime("%H%M%S")
        sent_at: dict[str, float] = {}
        # results of earlier runs (the broker keeps them) are skipped by time: counting them instead, with a first
        # read that returns at most 5,000 records, made a third run stop waiting at 4,995 of its own 10,000
        collector = ResultCollector(self.settings, topics.results, sent_at=sent_at, since_ms=int(time.time() * 1000))
        collector.poll(timeout=1.0)  # join before producing, so latency excludes the reader's start
        already = set(collector.stats.results)
        started = time.time()
        with RequestProducer(self.settings, topics.requests) as producer:
            for i, inputs in enumerate(transactions):
                rid = f"demo-{run}-{i}"
                sent_at[rid] = time.time()
                producer.send({"id": rid, "inputs": inputs}, key=f"card-{i % 997}")
        poison = KafkaClients().producer(idempotent_producer_config(
            self.settings, self.settings.names.writer_client_id("demo-poison")))
        for _reason, value in POISON:
            poison.produce(topics.requests, value=value, key=b"poison")
        poison.flush(10)
        self.echo(f"  produced {self.requests:,} requests (+{len(POISON)} poison) to {topics.requests} "
                  f"in {time.time() - started:.2f} s")

        def progress(stats) -> None:
            self.echo(f"  ... {len(stats.results) - len(already):,} results")

        stats = collector.wait_for(len(already) + self.requests, timeout=180, progress=progress)
        collector.close()
        mine = {rid: r for rid, r in stats.results.items() if rid.startswith(f"demo-{run}-")}
        if len(mine) < self.requests:
            raise DemoError(f"scoring: only {len(mine)} of {self.requests} results arrived; "
                            f"see {self.procs.log_dir}")
        elapsed = (stats.last_seen or time.time()) - started
        lat = stats.latency_summary()
        for rid in (f"demo-{run}-0", f"demo-{run}-1", f"demo-{run}-2"):
            r = mine[rid]
            self.echo(f"  {rid}: {r['status']} {r['outputs']} by {r['model']} {r['version']} "
                      f"(partition {r['source']['partition']}, offset {r['source']['offset']})")
        flagged = sum(1 for r in mine.values() if r.get("outputs", {}).get("fraud_probability", 0) > 0.5)
        self.echo(f"  {len(mine):,} results, {stats.duplicates} duplicates, {flagged} flagged > 0.5")
        self.echo(f"  throughput {len(mine) / elapsed:,.0f} results/s (first request sent -> last result visible, "
                  f"read_committed)")
        self.echo(f"  end-to-end latency under this burst: p50 {lat['p50']:.0f} ms, p90 {lat['p90']:.0f} ms, "
                  f"p99 {lat['p99']:.0f} ms, max {lat['max']:.0f} ms")
        self.dead_letters(topics.dead_letters)

    def dead_letters(self, topic: str) -> None:
        from sie.kernel.clients import KafkaClients, state_reader_config

        names = self.settings.names
        consumer = KafkaClients().consumer(state_reader_config(
            self.settings, names.reader_group("demo-dlq", str(time.time_ns())), names.reader_client_id("demo-dlq"),
            partition_eof=False))
        consumer.subscribe([topic])
        reasons: dict[str, int] = {}
        details: list[str] = []
        deadline = time.monotonic() + 15
        while sum(reasons.values()) < len(POISON) and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error():
                    continue
                raw = msg.headers() or []
                pairs = raw.items() if isinstance(raw, dict) else raw
                headers = {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "") for k, v in pairs}
                reasons[headers.get("sie.reason", "?")] = reasons.get(headers.get("sie.reason", "?"), 0) + 1
                details.append(f"{headers.get('sie.reason')}: {headers.get('sie.detail', '')[:90]}")
        consumer.close()
        self.echo(f"  dead letters in {topic}: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
        for line in details[-len(POISON):]:
            self.echo(f"    {line}")

    # -- 5 -----------------------------------------------------------------------------------------
    def sie(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one `sie` command as a user would, echoing it and its output."""
        shown = " ".join(a.replace(f"{EXAMPLES.parent}{os.sep}", "") for a in args)  # examples/... as shipped
        self.echo(f"$ sie {shown}")
        out = subprocess.run([sys.executable, "-m", "sie", *args], env=self.env(), cwd=self.work,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        for line in out.stdout.rstrip().splitlines():
            self.echo(f"  {line}")
        if out.returncode != 0:
            raise DemoError(f"`sie {' '.join(args)}` exited {out.returncode}")
        return out

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.settings.to_env(), "PYTHONUNBUFFERED": "1"}

    def cdc(self) -> None:
        from sie.connectors.results import ResultCollector
        from sie.kernel.names import ModelTopics

        self.step("CDC: canal row changes of shop.orders scored in real time")
        connector = example("examples/cdc/orders-to-fraud.yaml")
        since_ms = int(time.time() * 1000)
        self.sie("cdc", "publish", "-f", connector, "--file", example("examples/cdc/canal-orders.jsonl"))
        stage = self.procs.start("cdc-stage", ["cdc", "run", "-f", connector, "--model-spec",
                                               example("examples/fraud-scorer.yaml"), "--instance", "demo"],
                                 self.env())
        collector = ResultCollector(self.settings, ModelTopics.default_for("fraud-scorer", self.settings.topic_prefix).results,
                                    since_ms=since_ms)
        expected = 5  # 8 canal events: 5 row changes to score, 1 unchanged update, 1 DDL, 1 delete, 1 bad decimal
        stats = collector.wait_for(expected, timeout=90)
        collector.close()
        cdc_results = [r for rid, r in stats.results.items() if rid.startswith("shop.orders:")]
        if len(cdc_results) < expected:
            raise DemoError(f"cdc: {len(cdc_results)} of {expected} results; see {self.procs.log_dir}/cdc-stage.log")
        for r in sorted(cdc_results, key=lambda r: r["id"]):
            cdc = r.get("metadata", {}).get("cdc", {})
            self.echo(f"  {cdc.get('db')}.{cdc.get('table')} pk={cdc.get('pk')} {cdc.get('op'):<6} -> "
                      f"fraud_probability {r['outputs']['fraud_probability']:.3f}")
        stage.send_signal(signal.SIGTERM)
        stage.wait(30)
        for line in (self.procs.log_dir / "cdc-stage.log").read_text().splitlines():
            if line.startswith(("ready", "stopped")):
                self.echo(f"  {line}")

    def backfill(self) -> None:
        self.step("backfill: re-score the last minutes of requests into the backfill topic (live offsets untouched)")
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at - 1))
        self.sie("backfill", "--spec", example("examples/fraud-scorer.yaml"), "--from", start, "--to", "now",
                 "--job-id", f"demo-{int(self.started_at)}", "--progress-interval", "2", timeout=300)

    # -- 6 -----------------------------------------------------------------------------------------
    def operator_view(self) -> None:
        self.step("what an operator sees")
        for args in (["get", "models"], ["get", "nodes"], ["get", "replicas"],
                     ["describe", "model", "qwen2-7b-scoring"]):
            self.sie(*args)
