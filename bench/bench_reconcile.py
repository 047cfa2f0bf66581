"""One leader's reconcile pass at size, in-process: what a pass costs, step by step, as the models double.

No Kafka and no agents: records go into ``ClusterState`` as the feeder would put them, what the leader publishes is
read back as the feeder would, and each node's heartbeat reports its assigned replicas READY.  The same model mix
as ``bench_scale.py`` (half on a shared GPU, half CPU-only; 3 replicas each) on its simulated nodes.  Per size::

    populate: every spec, passes until every replica is placed and READY
    steady:   PASSES passes, between two of them half the nodes heartbeat (unchanged content, as at rest)
    change:   PASSES passes, between two of them half the nodes heartbeat and one model is re-applied with a
              new version (its replicas restart READY at it on the next heartbeat)
    takeover: a standby that ran a pass after each of the leader's above leads: its first pass

and prints the CPU of a pass (thread time) and its biggest steps.  ``bench_scale.py`` measures the same leader
through the real broker with simulated agents; this one isolates the pass and reaches 10,000 models in minutes.

  python bench/bench_reconcile.py [SIZES] [PASSES]     (default 200x1000,200x2000,200x4000 20)
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_scale import model_doc
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import OutRecord, StaticLeadership
from sie.control.reconcile.records import ClusterState
from sie.schemas.spec import load

SIZES = sys.argv[1] if len(sys.argv) > 1 else "200x1000,200x2000,200x4000"
PASSES = int(sys.argv[2]) if len(sys.argv) > 2 else 20
GPUS = [{"index": i, "uuid": f"GPU-{i}", "product": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920,
         "memory_used_mb": 0, "memory_free_mb": 81920, "utilization_pct": 0.0, "temperature_c": 40.0,
         "simulated": True, "healthy": True} for i in range(8)]


class ReadBack:
    """The publisher, with the feeder's read-back: what is published lands in the state (as the next poll would)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.records = 0

    def publish(self, records: list[OutRecord]) -> None:
        self.records += len(records)
        for r in records:
            if r.topic == "assignments":
                self.state.apply_assignment(r.key, r.value)
            elif r.topic == "model-status":
                self.state.apply_model_status(r.key, r.value)


class Silent:
    """A standby's publisher: a standby never publishes (the controller does not call it)."""

    def publish(self, records: list[OutRecord]) -> None:
        raise AssertionError("a standby published")


def spec_record(i: int, version: str = "1.0.0") -> tuple[str, dict[str, Any]]:
    name = f"model-{i:05d}"
    spec = load(model_doc(name, i, 3, version))
    return name, {"name": name, "version": version, "spec_json": json.dumps(spec.to_document()), "applied_at_ms": 0}


def heartbeat(state: ClusterState, node: str, now: float, seq: int) -> None:
    """The node reports each assigned replica READY at its assigned version."""
    info = state.assignments.get(node)
    replicas = [{"replica_id": a.replica_id, "model": a.model, "version": a.version, "state": "READY", "pid": 1,
                 "restarts": 0, "process": f"pid-{k}", "lag": 0, "p99_ms": 3.0}
                for k, a in enumerate(info.replicas if info else ())]
    state.apply_heartbeat({"node": node, "ts_ms": int(now * 1000), "seq": seq, "gpus": GPUS, "replicas": replicas,
                           "memory_total_mb": 1024 * 1024, "memory_available_mb": 900 * 1024}, seen_at=now)


def run(nodes: int, models: int) -> dict[str, Any]:
    state, now = ClusterState(), 1_000_000.0
    ctl = Controller(state, ReadBack(state), StaticLeadership(True, 1), ControlConfig(node_timeout_s=6.0))
    names = [f"node-{n:04d}" for n in range(nodes)]
    for node in names:
        state.apply_node(node, {"node": node, "labels": {}, "cpu_count": 128, "memory_mb": 1024 * 1024, "gpus": GPUS,
                                "simulated": True, "agent_version": "bench", "started_at_ms": 0})
        heartbeat(state, node, now, 0)
    t0 = time.perf_counter()
    for i in range(models):
        state.apply_spec(*spec_record(i))
    seq = 0
    for _ in range(10):  # place, then READY
        now += 1.0
        seq += 1
        ctl.reconcile(now)
        for node in names:
            heartbeat(state, node, now, seq)
    populate = time.perf_counter() - t0
    ready = sum(1 for st in ctl.statuses.values() if st.phase == "Ready")
    assert ready == models, f"{ready} of {models} models Ready after populate"
    out: dict[str, Any] = {"size": f"{nodes}x{models}", "populate_s": populate}
    standby_lead = StaticLeadership(False, 0)
    standby = Controller(state, Silent(), standby_lead, ControlConfig(node_timeout_s=6.0))
    for phase in ("steady", "change"):
        cpu, steps = [], {}
        for k in range(PASSES):
            now += 1.0
            seq += 1
            half = names[(k % 2)::2]
            for node in half:
                heartbeat(state, node, now, seq)
            if phase == "change":
                state.apply_spec(*spec_record(k * 7 % models, f"1.0.{k + 1}"))
            gc.collect()
            report = ctl.reconcile(now)
            assert not report.errors, report.errors
            standby.reconcile(now)
            cpu.append(report.durations["cpu"])
            for step, d in report.durations.items():
                steps.setdefault(step, []).append(d)
        out[phase] = {"cpu_mean_s": statistics.mean(cpu), "cpu_p90_s": sorted(cpu)[int(0.9 * len(cpu))],
                      "steps_ms": {s: 1000 * statistics.mean(v) for s, v in steps.items() if s not in ("cpu", "total")}}
    # takeover: the standby that followed every pass above leads (the old leader is gone) and acts once
    now += 1.0
    seq += 1
    for node in names:
        heartbeat(state, node, now, seq)
    standby_lead.leader, standby_lead.current_epoch = True, 2
    standby.publisher = ReadBack(state)
    gc.collect()
    report = standby.reconcile(now)
    assert not report.errors and report.skipped is None, (report.errors, report.skipped)
    changed = [r for r in report.published if r.topic == "assignments"]
    assert not changed, f"the new leader's first pass changed {len(changed)} assignments"
    out["takeover"] = {"cpu_s": report.durations["cpu"], "steps_ms": {
        s: 1000 * d for s, d in report.durations.items() if s not in ("cpu", "total")}}
    return out


def main() -> None:
    results = []
    for size in SIZES.split(","):
        nodes, models = (int(x) for x in size.split("x"))
        r = run(nodes, models)
        results.append(r)
        for phase in ("steady", "change"):
            top = sorted(r[phase]["steps_ms"].items(), key=lambda kv: -kv[1])[:6]
            print(f"{r['size']:>10} {phase:<6} pass CPU mean {r[phase]['cpu_mean_s'] * 1000:7.1f} ms  "
                  f"p90 {r[phase]['cpu_p90_s'] * 1000:7.1f} ms   " + "  ".join(f"{s} {ms:.1f}" for s, ms in top),
                  flush=True)
        top = sorted(r["takeover"]["steps_ms"].items(), key=lambda kv: -kv[1])[:6]
        print(f"{r['size']:>10} a new leader's first pass CPU {r['takeover']['cpu_s'] * 1000:7.1f} ms   "
              + "  ".join(f"{s} {ms:.1f}" for s, ms in top), flush=True)
        print(f"{r['size']:>10} populate {r['populate_s']:.1f} s", flush=True)
    for a, b in zip(results, results[1:]):
        for phase in ("steady", "change"):
            print(f"{a['size']} -> {b['size']} {phase}: pass CPU x{b[phase]['cpu_mean_s'] / a[phase]['cpu_mean_s']:.2f}")
        print(f"{a['size']} -> {b['size']} a new leader's first pass: CPU x{b['takeover']['cpu_s'] / a['takeover']['cpu_s']:.2f}")


if __name__ == "__main__":
    main()
