"""Elasticity timings with real processes on a real broker (issue 13).

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_elasticity.py [--starts 20] [--wakes 3]
                                                                          [--only starts,step,wake]

- **starts**: replica start -> READY (the agent's own measure: worker launch to readiness inference passed
  and scorer subscribed), ``--starts`` cold starts (no warm pool) then as many warm ones (``--warm-pool 1``:
  a worker with the runtime imported takes the launch), one replica at a time on one in-process agent
  (simulated L4), the fraud-scorer example by default (torch; ``--start-model fraud-rules``: python rules,
  which import no torch on a cold start).  p50/p99 of each and the ratio of the p99s (the issue's target: warm cuts p99 by
  >= 3x).
- **step**: a load step on a 1-replica model with ``max_replicas: 3`` (tests/fixtures/paced_model.py, 2 ms
  per record: 500 records/s per replica whatever the machine's load): 12,000 records produced at once;
  time from the step to the autoscaler's decision (the ``scaled_up`` event) and to 3 replicas READY.
  Control plane: 1 s backlog interval, 0.5 s reconcile interval.
- **wake**: a ``min_replicas: 0`` model scaled to zero; one request is produced; time to its result (the
  cold first request), ``--wakes`` times, without and with a warm pool on the agent.

- **preempt**: one node (simulated L4) full of a P2 model's 2 replicas (10 GiB each) working through a
  20,000-request spike; a P0 model needing 12 GiB is applied and gets ``--p0-rate`` requests/s for
  ``--p0-seconds``: answered count and p50/p99 latency, with preemption off (it cannot be placed) and on
  (it evicts one P2 replica).  Latency counts from each request's send; requests start with the apply, so
  the first ones wait for the P0 replica's placement and start.

Results: bench/results/elasticity.txt (and .json), with the machine's load average:
numbers taken with a load average above 3 are not comparable and are not committed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sie.kernel.settings import Settings  # noqa: E402
from tests.support.cluster_harness import Cluster, RequestStream, ResultTail, example_input, wait_for  # noqa: E402
from tests.support.helpers import TopicTail  # noqa: E402
from tests.test_elasticity_e2e import PACED_MODEL_ENV  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


# ------------------------------------------------------------------------------------- starts


def starts(settings: Settings, count: int, warm_pool: int, root: Path, model: str) -> list[float]:
    """``count`` replica starts of ``model`` (an example spec), one at a time, on one in-process agent;
    launch -> READY seconds each."""
    import uuid

    from sie.kernel.admin import ensure_topics
    from sie.kernel.topics import system_topics
    from sie.workers.agent import AgentConfig
    from sie.workers.supervisor import SupervisorPolicy
    from tests.workers.test_agent_kafka import publish_assignment, run_agent

    prefix = f"b{uuid.uuid4().hex[:10]}"
    s = settings.with_overrides(topic_prefix=prefix)
    ensure_topics(s, system_topics(prefix), replication_factor=1)
    from sie.schemas.spec import load
    from tests.support.helpers import REPO_ROOT

    doc = load(REPO_ROOT / "examples" / f"{model}.yaml").to_document()
    doc["topics"] = {kind: f"{prefix}.model.{model}.{suffix}" for kind, suffix in
                     (("requests", "requests"), ("results", "results"), ("dead_letters", "dlq"), ("backfill", "backfill"))}
    doc["group_id"] = f"{prefix}.scorer.{model}"
    spec_json = json.dumps(doc)
    config = AgentConfig(node="bench", simulate_gpus="1xL4-24GB", heartbeat_s=1.0, work_dir=root / prefix,
                         warm_pool=warm_pool, warm_pool_refill_s=0.5,
                         policy=SupervisorPolicy(startup_timeout_s=300, drain_grace_s=15))
    agent, stop, thread = run_agent(config, s)
    times: list[float] = []
    try:
        for i in range(count):
            if warm_pool:
                wait_for(lambda: agent.pool is not None and agent.pool.ready() >= 1, 300, "a warm pool worker")
            rid = f"{model}-{i}"
            publish_assignment(s, "bench", 2 * i + 1, [{"replica_id": rid, "model": model, "version": doc["version"],
                                                        "gpu_indices": [], "gpu_memory_mb": 0, "spec_json": spec_json}])
            replica = wait_for(lambda: (r := agent.supervisor.table.current(rid)) is not None
                               and r.start_s is not None and r, 300, f"{rid} READY")
            if bool(replica.warm) != bool(warm_pool):
                raise AssertionError(f"{rid}: expected a {'warm' if warm_pool else 'cold'} start")
            times.append(replica.start_s)
            publish_assignment(s, "bench", 2 * i + 2, [])
            wait_for(lambda: agent.supervisor.table.current(rid) is None
                     or not agent.supervisor.table.current(rid).state.has_process, 60, f"{rid} stopped")
            print(f"  {'warm' if warm_pool else 'cold'} start {i + 1}/{count}: {replica.start_s:.3f}s", flush=True)
    finally:
        stop.set()
        thread.join(60)
    return times


# ------------------------------------------------------------------------------------ cluster


def control_config(c: Cluster, **autoscale: float) -> Path:
    import yaml

    path = c.root / "control-plane-config.yaml"
    path.write_text(yaml.safe_dump({"control": {"reconcile_interval_s": 0.5, "backlog_interval_s": 1.0,
                                                "autoscale": {"up_settle_s": 3, "signal_max_age_s": 5, **autoscale}}}))
    return path


def up(c: Cluster, nodes: list[str], warm_pool: int = 0, **autoscale: float) -> None:
    c.extra_env.update(PACED_MODEL_ENV)
    c.start_control("cp-1", extra=["--config", str(control_config(c, **autoscale))])
    for node in nodes:
        c.start_agent(node, gpus="1xL4-24GB", heartbeat_s=1.0,
                      extra=["--warm-pool", str(warm_pool)] if warm_pool else [])
    c.wait_leader(60)


def apply(c: Cluster, path: Path) -> None:
    done = c.sie("apply", "-f", str(path))
    if done.returncode != 0:
        raise AssertionError(done.stdout + done.stderr)


def step(settings: Settings, root: Path) -> dict[str, float]:
    """A 12,000-record step on a 1-replica paced model (max 3): step -> scale-up decision, -> 3 READY."""
    c = Cluster(settings, root / "step")
    try:
        up(c, ["node-a", "node-b"], cooldown_s=600)
        spec = c.write_spec("fraud-rules", name="paced", resources={"cpu": 0.25},
                            backend={"type": "python", "callable": "tests.fixtures.paced_model:score"},
                            sla={"min_replicas": 1, "max_replicas": 3, "max_queue_time_ms": 20000,
                                 "p99_latency_ms": 30000})
        apply(c, spec)
        c.wait_ready("paced", 1, timeout=180)
        topics = c.spec_topics("paced")
        events = TopicTail(c.settings, f"{c.prefix}.events")
        tail = ResultTail(c.settings, topics)
        stream = RequestStream(c.settings, topics["requests"], example_input(spec), "s")
        try:
            warm_ids = stream.send(300)  # light traffic: the replica reports its inference rate
            wait_for(lambda: tail.count(warm_ids) == 300, 120, "light traffic answered")
            wait_for(lambda: "(unknown)" not in (((c.model("paced") or {}).get("autoscale") or {}).get("reason") or
                                                  "(unknown)"), 60, "a known capacity")
            t0 = time.time()
            ids = stream.send(12000)
            produced = time.time() - t0
            decided = wait_for(lambda: [e for e in events.values() if e["model"] == "paced"
                                        and e["kind"] == "scaled_up" and "-> 3" in e["detail"]], 120,
                               "the scale-up to 3")[0]
            c.wait_ready("paced", 3, timeout=180)
            ready = time.time() - t0
            wait_for(lambda: tail.count(ids) == len(ids), 300, "every record answered")
            drained = time.time() - t0
            return {"produce_s": produced, "decision_s": decided["ts_ms"] / 1000 - t0, "three_ready_s": ready,
                    "drained_s": drained}
        finally:
            stream.stop()
            tail.close()
            events.close()
    finally:
        c.close()


def wake(settings: Settings, root: Path, repeats: int, warm_pool: int) -> list[float]:
    """A min_replicas 0 model at zero: one request -> its result, ``repeats`` times."""
    c = Cluster(settings, root / f"wake-{warm_pool}")
    try:
        up(c, ["node-a"], warm_pool=warm_pool, cooldown_s=4, idle_to_zero_s=4)
        spec = c.write_spec("fraud-rules", name="tail", resources={"cpu": 0.25},
                            sla={"min_replicas": 0, "max_replicas": 1, "max_queue_time_ms": 60000})
        apply(c, spec)
        topics = c.spec_topics("tail")
        tail = ResultTail(c.settings, topics)
        stream = RequestStream(c.settings, topics["requests"], example_input(spec), "w")
        beats = TopicTail(c.settings, f"{c.prefix}.heartbeats")
        out: list[float] = []
        try:
            for i in range(repeats):
                wait_for(lambda: (m := c.model("tail")) and m.get("desired_replicas") == 0
                         and not m.get("replicas") and not c.all_workers(), 120, "tail at zero")
                if warm_pool:  # the latest heartbeat says a warm worker waits
                    wait_for(lambda: [b for b in beats.values() if b["node"] == "node-a"][-1:][0:1]
                             and [b for b in beats.values() if b["node"] == "node-a"][-1]["warm_workers"] >= 1,
                             120, "a warm worker")
                sent = time.monotonic()
                (rid,) = stream.send(1)
                wait_for(lambda: tail.count([rid]) == 1, 180, "the first request's result")
                out.append(tail.first_after(sent) - sent)
                print(f"  wake {i + 1}/{repeats} (warm pool {warm_pool}): {out[-1]:.2f}s", flush=True)
        finally:
            stream.stop()
            tail.close()
            beats.close()
        return out
    finally:
        c.close()


def preempt(settings: Settings, root: Path, preemption: bool, seconds: float, rate: float) -> dict[str, Any]:
    """A node full of P2 replicas under a request spike; a P0 model applied then gets ``rate`` requests/s for
    ``seconds``: how many are answered (within ``seconds`` more) and their latency percentiles."""
    import threading

    c = Cluster(settings, root / f"preempt-{preemption}")
    try:
        c.extra_env.update(PACED_MODEL_ENV)
        path = control_config(c)
        import yaml

        doc = yaml.safe_load(path.read_text())
        doc["control"]["preemption"] = preemption
        path.write_text(yaml.safe_dump(doc))
        c.start_control("cp-1", extra=["--config", str(path)])
        c.start_agent("node-a", gpus="1xL4-24GB", heartbeat_s=1.0)
        c.wait_leader(60)
        bulk = c.write_spec("fraud-rules", name="bulk", replicas=2, priorityLevel="P2",
                            resources={"cpu": 0.25, "gpuMemoryMb": 10240})
        apply(c, bulk)
        c.wait_ready("bulk", 2, timeout=180)
        bulk_stream = RequestStream(c.settings, c.spec_topics("bulk")["requests"], example_input(bulk), "p2")
        bulk_stream.send(20000)  # the P2 spike: a backlog both bulk replicas work on
        rt = c.write_spec("fraud-rules", name="rt", priorityLevel="P0", resources={"cpu": 0.25, "gpuMemoryMb": 12288})
        topics = c.spec_topics("rt")
        tail = ResultTail(c.settings, topics)
        stream = RequestStream(c.settings, topics["requests"], example_input(rt), "p0")
        sent: dict[str, float] = {}
        try:
            apply(c, rt)
            pace, t_end = threading.Event(), time.monotonic() + seconds
            while time.monotonic() < t_end:
                at = time.monotonic()
                (rid,) = stream.send(1)
                sent[rid] = at
                pace.wait(max(0.0, at + 1.0 / rate - time.monotonic()))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and tail.count(sent) < len(sent):
                pace.wait(0.2)
            latencies = sorted(tail.arrivals[r][0][0] - at for r, at in sent.items() if tail.arrivals.get(r))
            out: dict[str, Any] = {"preemption": preemption, "sent": len(sent), "answered": len(latencies)}
            if latencies:
                out.update(p50_s=pct(latencies, 0.5), p99_s=pct(latencies, 0.99), max_s=latencies[-1])
            return out
        finally:
            stream.stop()
            tail.close()
            bulk_stream.stop()
    finally:
        c.close()


# --------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20, help="cold starts, and as many warm ones")
    parser.add_argument("--wakes", type=int, default=3, help="wakes from zero, without and with a warm pool")
    parser.add_argument("--start-model", default="fraud-scorer", choices=["fraud-scorer", "fraud-rules"],
                        help="example whose replica starts are timed (fraud-scorer: torch, the case the pool is for)")
    parser.add_argument("--p0-seconds", type=float, default=30.0, help="how long the P0 model gets requests")
    parser.add_argument("--p0-rate", type=float, default=10.0, help="P0 requests per second")
    parser.add_argument("--only", default="starts,step,wake,preempt")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "elasticity.txt")
    args = parser.parse_args()
    settings = Settings()
    only = set(args.only.split(","))
    load = os.getloadavg()
    results: dict[str, Any] = {"load_average_1m_at_start": round(load[0], 2), "cpus": os.cpu_count()}
    lines = [f"bench_elasticity ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
             f"load average at start {load[0]:.1f})"]
    with tempfile.TemporaryDirectory(prefix="sie-bench-elastic-") as tmp:
        root = Path(tmp)
        if "starts" in only:
            cold = starts(settings, args.starts, 0, root, args.start_model)
            warm = starts(settings, args.starts, 1, root, args.start_model)
            ratio = pct(cold, 0.99) / pct(warm, 0.99)
            results["starts"] = {"model": args.start_model, "cold": cold, "warm": warm, "p99_ratio": ratio}
            for kind, t in (("cold", cold), ("warm", warm)):
                lines.append(f"{args.start_model} replica start -> READY, {kind}: n={len(t)} "
                             f"p50 {statistics.median(t) * 1000:.0f} ms, p99 {pct(t, 0.99) * 1000:.0f} ms")
            lines.append(f"warm pool cuts p99 by {ratio:.1f}x (target >= 3x)")
        if "step" in only:
            r = step(settings, root)
            results["step"] = r
            lines.append(f"load step of 12000 records on 1 replica (max 3): decision after {r['decision_s']:.1f}s, "
                         f"3 READY after {r['three_ready_s']:.1f}s, drained after {r['drained_s']:.1f}s "
                         f"(producing took {r['produce_s']:.1f}s)")
        if "wake" in only:
            for pool in (0, 1):
                t = wake(settings, root, args.wakes, pool)
                results[f"wake_pool_{pool}"] = t
                lines.append(f"first request from zero, warm pool {pool}: " + ", ".join(f"{x:.2f}s" for x in t)
                             + f" (median {statistics.median(t):.2f}s)")
        if "preempt" in only:
            for flag in (False, True):
                r = preempt(settings, root, flag, args.p0_seconds, args.p0_rate)
                results[f"p0_preemption_{'on' if flag else 'off'}"] = r
                latency = (f"p50 {r['p50_s'] * 1000:.0f} ms, p99 {r['p99_s'] * 1000:.0f} ms" if r["answered"]
                           else "none answered")
                lines.append(f"P0 during a P2 spike on a full node, preemption {'on' if flag else 'off'}: "
                             f"{r['answered']}/{r['sent']} answered within {args.p0_seconds:g}s after the last; "
                             f"{latency} (each from its send; requests start with the apply, so the first wait for the "
                             f"P0 replica's placement and start)")
    results["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    lines.append(f"load average at end {results['load_average_1m_at_end']:.1f}")
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
