"""Planned handovers on a real cluster: the longest gap in committed results while replicas are stopped on
purpose (``python bench/bench_rollout.py --handover``; results in bench/results/rollout_handover.txt).

Cluster (``tests/support/cluster_harness.py``): one ``sie control`` and two ``sie agent`` processes on the broker,
the rules model (python, ``examples/fraud-rules.yaml``, 6 request partitions) at 2 replicas, a steady stream
of ``--rate`` requests/s the whole time and a read_committed tail that stamps each committed output when it
arrives.  One after the other, on the same model and stream:

1. **rollout to Complete**: a new version with a ``rollout`` block (steps 50/100, short intervals, loose
   gates): a surge replica starts, the canary serves, Draining replaces each stable replica with a
   new-version one (same replica id), the surge replica stops;
2. **rollback**: a rollout of the next version, aborted once the canary serves (``POST
   /v1/rollouts/M/abort``): the surge replica stops;
3. **version change**: a new version without a rollout block: each replica is replaced in place;
4. **scale-down 3 -> 2**: ``sla.min_replicas``/``max_replicas`` raised to 3 (not measured), then lowered to 2.

For each: from the request that changed the cluster until the model is Ready in its final shape (+ a settle
margin), the longest gap between consecutive committed outputs of the model (``overall``) and the longest
gap of any one request partition (``per partition``, with which one); and the same over a steady window
before anything changed (the machine's own noise floor).  The run ends with the exactly-once proof over every
request sent (read_committed: each exactly one answer).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from sie.kernel.settings import Settings
from sie.schemas.spec import load
from tests.support.cluster_harness import (
    Cluster,
    RequestStream,
    ResultTail,
    StatusTail,
    example_input,
    http,
    try_get,
    wait_for,
)
from tests.support.scorer_fixtures import prove_exactly_once

MODEL = "fraud-rules"
ROLLOUT = {"steps": [50, 100], "intervalSeconds": 3, "surgeTimeoutSeconds": 120,
           "gates": {"minSamples": 10, "p99MaxMs": 10_000, "p99SlackMs": 1_000}}
SETTLE_S = 2.0  # after the final shape is reached: a straggling partition still shows


class Handover:
    """The cluster, the model's document, the request stream and the result tail of one run."""

    def __init__(self, settings: Settings, root: Path, rate: float) -> None:
        self.c = Cluster(settings, root)
        self.doc: dict[str, Any] = {}
        self.stream: RequestStream | None = None
        self.tail: ResultTail | None = None
        self.status: StatusTail | None = None
        self.rate = rate

    def start(self, replicas: int) -> None:
        c = self.c
        path = c.write_spec(MODEL, replicas=replicas, resources={"cpu": 0.25})
        c.start_control("cp-1")
        c.start_agent("node-a")
        c.start_agent("node-b")
        c.wait_leader(60)
        self.doc = yaml.safe_load(path.read_text())
        self.post(self.doc)
        c.wait_ready(MODEL, replicas, timeout=180)
        # one replica per node before anything is measured: a node that registered late gets its replica by a
        # planned move ("spread"), which would otherwise overlap the first transition
        wait_for(lambda: self.settled("1.0.0", replicas) and len(set(c.placement(MODEL).values())) == 2, 180,
                 lambda: f"{MODEL} spread over both nodes: {c.placement(MODEL)}", interval=0.2)
        topics = c.spec_topics(MODEL)
        self.status = StatusTail(c.settings)
        self.tail = ResultTail(c.settings, topics)
        self.stream = RequestStream(c.settings, topics["requests"], example_input(path),
                                    f"ho{uuid.uuid4().hex[:6]}", rate_per_s=self.rate).start()

    def post(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.c.post_model(doc)

    def with_spec(self, **changes: Any) -> dict[str, Any]:
        return {**self.doc, "spec": {**self.doc["spec"], **changes}}

    def settled(self, version: str, replicas: int) -> bool:
        return self.c.settled(MODEL, version, replicas) is not None

    def rollout(self) -> dict | None:
        return try_get(self.c.api(), f"/v1/rollouts/{MODEL}")

    def gaps(self, start: float, end: float, wall_start: float | None = None) -> dict[str, Any]:
        """The window's longest gaps (overall, per partition) and where they began (s after ``start``), and
        the replicas' state changes in it (the agents' replica-status records) to read them against."""
        assert self.tail is not None and self.stream is not None
        overall, per = self.tail.gaps(start, end, self.stream.partition_of)
        worst = max(per, key=lambda p: per[p]) if per else None
        with self.tail._lock:  # noqa: SLF001 - read-only snapshot
            order = [(at, self.stream.partition_of.get(rid)) for at, rid in self.tail.order if start <= at <= end]
        began = {}
        for key, times in (("overall", [at for at, _ in order]), ("partition", [at for at, p in order if p == worst])):
            seq = [start, *times, end]
            began[key] = max(zip(seq, seq[1:]), key=lambda ab: ab[1] - ab[0])[0] - start
        events = []
        if wall_start is not None and self.status is not None:
            for r in self.status.values():
                at = r["ts_ms"] / 1000 - wall_start
                if 0 <= at <= end - start and r.get("model") in (MODEL, None):
                    events.append(f"+{at:5.1f} s {r['replica_id']} {r['state']} ({(r.get('reason') or '')[:70]})")
        return {"window_s": end - start, "overall_s": overall, "partition_s": per.get(worst, 0.0),
                "partition": worst, "per": per, "began": began, "events": events}

    def measure(self, act: Any, done: Any, timeout: float = 240) -> dict[str, Any]:
        """Gaps from ``act()`` until ``done()`` holds (plus ``SETTLE_S``)."""
        start, wall = time.monotonic(), time.time()
        act()
        wait_for(done, timeout, lambda: f"the cluster to settle; model {self.c.model(MODEL)}; rollout "
                                        f"{self.rollout()}\n{self.c.logs()}", interval=0.2)
        time.sleep(SETTLE_S)  # the measured window's tail, not synchronisation
        return self.gaps(start, time.monotonic(), wall)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.stop()
        if self.tail is not None:
            self.tail.close()
        if self.status is not None:
            self.status.close()
        self.c.close()


def run(settings: Settings, rate: float, steady_s: float) -> dict[str, Any]:
    h = Handover(settings, Path(tempfile.mkdtemp(prefix="sie-handover-")), rate)
    out: dict[str, Any] = {}
    try:
        h.start(2)
        wait_for(lambda: h.tail.count() > rate, 60, "the first results")
        t0 = time.monotonic()
        time.sleep(steady_s)  # the steady window: the noise floor of this machine
        out["steady"] = h.gaps(t0, time.monotonic())

        def roll(version: str) -> None:
            h.post(h.with_spec(model={"name": MODEL, "version": version}, rollout=ROLLOUT))

        out["rollout to Complete"] = h.measure(
            lambda: roll("1.1.0"),
            lambda: (r := h.rollout()) and r["canary_version"] == "1.1.0" and r["phase"] == "Complete" and h.settled("1.1.0", 2))
        h.doc = h.with_spec(model={"name": MODEL, "version": "1.1.0"})

        def abort_when_canary() -> None:
            roll("1.2.0")
            wait_for(lambda: (r := h.rollout()) and r["canary_version"] == "1.2.0" and r["phase"] == "Canary", 180,
                     lambda: f"the 1.2.0 canary serving: {h.rollout()}", interval=0.2)
            status, body = http(h.c.api(), "POST", f"/v1/rollouts/{MODEL}/abort")
            if status != 200:
                raise RuntimeError(f"abort: {status} {body}")

        out["rollback (abort in Canary)"] = h.measure(
            abort_when_canary,
            lambda: (r := h.rollout()) and r["canary_version"] == "1.2.0" and r["phase"] == "RolledBack" and h.settled("1.1.0", 2))

        out["version change (no rollout)"] = h.measure(
            lambda: h.post(h.with_spec(model={"name": MODEL, "version": "1.3.0"})),
            lambda: h.settled("1.3.0", 2))
        h.doc = h.with_spec(model={"name": MODEL, "version": "1.3.0"})

        def scale(n: int) -> dict[str, Any]:
            return h.with_spec(sla={**h.doc["spec"]["sla"], "min_replicas": n, "max_replicas": n})

        out["scale-up 2 -> 3"] = h.measure(lambda: h.post(scale(3)), lambda: h.settled("1.3.0", 3))
        h.doc = scale(3)
        out["scale-down 3 -> 2"] = h.measure(lambda: h.post(scale(2)), lambda: h.settled("1.3.0", 2))
        sent = h.stream.stop()
        tag = h.stream.tag
        h.stream = None
        spec = load(h.doc, topic_prefix=h.c.prefix)
        results, dead = prove_exactly_once(h.c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=120)
        out["exactly_once"] = f"{len(results) + len(dead)} answers for {sent} requests, {len(dead)} dead letters"
    finally:
        h.close()
    return out


def report(args: argparse.Namespace, settings: Settings) -> str:
    load_start = os.getloadavg()[0]
    measured = run(settings, args.rate, args.steady)
    lines = [f"bench_rollout --handover ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
             f"load average at start {load_start:.1f})",
             f"sie control + 2 sie agent processes, {MODEL} (python) at 2 replicas, {settings.request_partitions} request "
             f"partitions, {args.rate:g} requests/s throughout; gap = longest time between consecutive committed "
             f"outputs (read_committed tail), from the change until the final shape + {SETTLE_S:g} s",
             "",
             f"{'transition':<30} {'window s':>9} {'overall gap s':>15} {'per-partition gap s':>24}"]
    for name, g in measured.items():
        if not isinstance(g, dict):
            continue
        lines.append(f"{name:<30} {g['window_s']:9.1f} {g['overall_s']:9.2f} @{g['began']['overall']:4.1f}"
                     f" {g['partition_s']:9.2f} (p{g['partition']} @{g['began']['partition']:4.1f})")
    lines.append(f"\nexactly once: {measured['exactly_once']}")
    lines.append("\n@: where the gap began, seconds after the change.  The replicas' state changes (replica-status):")
    for name, g in measured.items():
        if isinstance(g, dict) and g["events"]:
            lines.append(f"  {name}:")
            lines += [f"    {e}" for e in g["events"]]
    lines.append(f"load average at end {os.getloadavg()[0]:.1f}")
    return "\n".join(lines) + "\n"
