"""Elasticity end to end: `sie control` + `sie agent` as real processes on the real broker (issue 13).

* a backlog on a 1-replica model scales it to its max within one decision interval, and back down one step
  per cool-down once the backlog is gone, every request answered exactly once across the rebalances;
* a ``min_replicas: 0`` model stops when idle and, when 100 requests arrive later, wakes and answers each of
  them exactly once (``sie describe model`` shows the first result's latency);
* a P0 model applied to a full simulated node evicts a P2 replica (drained), starts, and the evicted replica is
  reported unschedulable with the reason, then re-placed when a node with room joins.

The control plane runs with short timings (control-plane-config ``control.autoscale``): a 1 s backlog interval,
a 12 s cool-down, 8 s idle-to-zero.  The backlog test's model sleeps 2 ms per record
(tests/fixtures/paced_model.py): 500 records/s per replica whatever the load on this shared machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sie.kernel.settings import Settings
from tests.support.cluster_harness import (
    REPO,
    Cluster,
    RequestStream,
    ResultTail,
    StatusTail,
    example_input,
    try_get,
    wait_for,
)
from tests.support.helpers import TopicTail

pytestmark = pytest.mark.kafka

#: the paced test model is allowed and importable on the nodes (workers run with ``python -P`` in their replica
#: folder, so the repository is not on their sys.path unless PYTHONPATH says so); the demo models stay importable
PACED_MODEL_ENV = {"SIE_ALLOWED_MODULES": "models.fraud,tests.fixtures.paced_model",
                   "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "examples")))}

BACKLOG_INTERVAL_S = 1.0
RECONCILE_S = 0.5
COOLDOWN_S = 12.0
IDLE_S = 8.0


@pytest.fixture()
def cluster(kafka_settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(kafka_settings, tmp_path)
    c.extra_env.update(PACED_MODEL_ENV)
    try:
        yield c
    finally:
        c.close()


def _config(c: Cluster) -> Path:
    path = c.root / "control-plane-config.yaml"
    path.write_text(yaml.safe_dump({"control": {
        "reconcile_interval_s": RECONCILE_S, "backlog_interval_s": BACKLOG_INTERVAL_S,
        "autoscale": {"cooldown_s": COOLDOWN_S, "idle_to_zero_s": IDLE_S, "up_settle_s": 3, "signal_max_age_s": 5},
    }}))
    return path


def _up(c: Cluster, nodes: dict[str, str], warm_pool: int = 0) -> None:
    c.start_control("cp-1", extra=["--config", str(_config(c))])
    for node, gpus in nodes.items():
        c.start_agent(node, gpus=gpus, heartbeat_s=1.0, extra=["--warm-pool", str(warm_pool)] if warm_pool else [])
    c.wait_leader(60)
    _wait_online(c, len(nodes))


def _wait_online(c: Cluster, n: int) -> None:
    wait_for(lambda: len([x for x in (try_get(c.api(), "/v1/nodes") or {}).get("nodes", []) if x["status"] == "online"]) == n,
             60, lambda: "agents online; " + c.logs("agent"))


def _apply(c: Cluster, *paths: Path) -> None:
    done = c.sie("apply", *[a for p in paths for a in ("-f", str(p))])
    assert done.returncode == 0, done.stdout + done.stderr


def _events(tail: TopicTail, model: str, kind: str) -> list[dict]:
    return [e for e in tail.values() if e["model"] == model and e["kind"] == kind]


def test_backlog_scales_up_to_max_at_once_and_down_one_step_per_cooldown(cluster: Cluster) -> None:
    c = cluster
    _up(c, {"node-a": "1xL4-24GB", "node-b": "1xL4-24GB"})
    spec = c.write_spec("fraud-rules", name="paced", resources={"cpu": 0.25},
                        backend={"type": "python", "callable": "tests.fixtures.paced_model:score"},
                        sla={"min_replicas": 1, "max_replicas": 3, "max_queue_time_ms": 20000, "p99_latency_ms": 5000})
    _apply(c, spec)
    c.wait_ready("paced", 1, timeout=120)
    events = TopicTail(c.settings, f"{c.prefix}.events")
    topics = c.spec_topics("paced")
    tail = ResultTail(c.settings, topics)
    stream = RequestStream(c.settings, topics["requests"], example_input(spec), "b")
    try:
        # light traffic first: the replica keeps up (no backlog, nothing to scale) and reports its inference rate
        warm_ids = stream.send(300)
        wait_for(lambda: tail.count(warm_ids) == 300, 60, "the light traffic answered")
        wait_for(lambda: "per replica (" in (r := ((c.model("paced") or {}).get("autoscale") or {}).get("reason", ""))
                 and "(unknown)" not in r, 30, lambda: f"a known capacity in the decision; {c.model('paced')}")
        # the step: 12000 records. One replica (500/s) needs 24 s, more than the 10 s budget (half of
        # max_queue_time_ms): ceil(12000 / 10 / 500) = 3 replicas, the max, decided from one backlog sample
        ids = stream.send(12000)
        produced = time.monotonic()
        seen: list[str] = []  # the decisions on the way (a failure shows why it held)

        def scaled_to_3() -> list[dict]:
            reason = ((c.model("paced") or {}).get("autoscale") or {}).get("reason")
            if reason and (not seen or seen[-1] != reason):
                seen.append(reason)
            return [e for e in _events(events, "paced", "scaled_up") if "-> 3" in e["detail"]]

        up = wait_for(scaled_to_3, 30, lambda: f"a scale-up to 3; events {events.values()[-8:]}; decisions "
                                           f"{seen}\n{c.logs('control')}")[0]
        reached = time.monotonic() - produced
        assert "lag" in up["detail"] and "budget 10s" in up["detail"], up
        # within one decision interval of the backlog being complete (+ a reconcile pass and the reads here)
        assert reached <= BACKLOG_INTERVAL_S + 2 * RECONCILE_S + 3.0, reached
        c.wait_ready("paced", 3, timeout=120)

        wait_for(lambda: tail.count(ids) == len(ids), 180, lambda: f"all 12000 answered; got {tail.count(ids)}")
        tail.read_to_end()
        lost, dups, stray = tail.audit(warm_ids + ids)
        assert not lost and not dups and not stray, (lost[:5], dups)  # exactly once across two rebalances

        # the backlog is gone: 3 -> 2 -> 1, one step per cool-down (counted from the last change)
        downs = wait_for(lambda: len(d := _events(events, "paced", "scaled_down")) >= 2 and d, 4 * COOLDOWN_S + 60,
                         lambda: f"two scale-downs; events {events.values()[-8:]}")
        assert "3 -> 2" in downs[0]["detail"] and "2 -> 1" in downs[1]["detail"]
        last_up = max(e["ts_ms"] for e in _events(events, "paced", "scaled_up"))
        assert downs[0]["ts_ms"] - last_up >= COOLDOWN_S * 1000
        assert downs[1]["ts_ms"] - downs[0]["ts_ms"] >= COOLDOWN_S * 1000
        c.wait_ready("paced", 1, timeout=60)
        expired = sum(1 for i in ids for _, kind in tail.arrivals[i] if kind == "dlq")
        print(f"\nbacklog of 12000 -> desired 3 after {reached:.1f}s; {expired} expired to the DLQ")
    finally:
        stream.stop()
        tail.close()
        events.close()


def test_min_replicas_zero_stops_when_idle_and_answers_100_later_requests_exactly_once(cluster: Cluster) -> None:
    c = cluster
    _up(c, {"node-a": "1xL4-24GB"}, warm_pool=1)
    spec = c.write_spec("fraud-rules", name="tail", resources={"cpu": 0.25},
                        sla={"min_replicas": 0, "max_replicas": 2, "max_queue_time_ms": 60000})
    _apply(c, spec)
    events = TopicTail(c.settings, f"{c.prefix}.events")
    status = StatusTail(c.settings)
    topics = c.spec_topics("tail")
    tail = ResultTail(c.settings, topics)
    stream = RequestStream(c.settings, topics["requests"], example_input(spec), "z")
    try:
        # applied with nothing waiting: no replica at all
        wait_for(lambda: (m := c.model("tail")) and m.get("desired_replicas") == 0 and m.get("autoscale"), 30,
                 lambda: f"tail at zero; {c.model('tail')}")
        assert not c.all_workers()
        first_ids = stream.send(10)
        wait_for(lambda: tail.count(first_ids) == 10, 120, "the first 10 answered")
        # idle: the replica drains and stops
        wait_for(lambda: _events(events, "tail", "scaled_to_zero"), IDLE_S + COOLDOWN_S + 60,
                 lambda: f"scaled to zero; events {events.values()[-6:]}")
        wait_for(lambda: status.find(model="tail", state="STOPPED"), 30, "the last replica drained and stopped")
        wait_for(lambda: not c.all_workers(), 30, "no worker left")

        sent_at = time.monotonic()
        ids = stream.send(100)
        wait_for(lambda: tail.count(ids) == 100, 120, lambda: f"100 answered after waking; got {tail.count(ids)}")
        first_result = tail.first_after(sent_at)
        tail.read_to_end()
        lost, dups, stray = tail.audit(first_ids + ids)
        assert not lost and not dups and not stray
        woke = _events(events, "tail", "woke_from_zero")
        assert len(woke) == 2 and "waiting with no replica" in woke[-1]["detail"]
        last: list = []

        def first_result_described():
            d = c.sie("describe", "model", "tail")
            last[:] = [d]
            line = next((x for x in d.stdout.splitlines() if x.startswith("From zero")), "")
            return "first result" in line and "not yet" not in line and d

        described = wait_for(first_result_described, 30, lambda: "sie describe to report the first result; it said "
                             f"{last[0].returncode}: {last[0].stdout}{last[0].stderr}; status {c.model('tail')}")
        assert "cold first request" in described.stdout, described.stdout
        print(f"\nfirst request from zero answered after {first_result - sent_at:.1f}s; describe: "
              + next(line for line in described.stdout.splitlines() if line.startswith("From zero")))
    finally:
        stream.stop()
        tail.close()
        status.close()
        events.close()


def test_p0_on_a_full_node_evicts_p2_which_is_reported_then_replaced(cluster: Cluster) -> None:
    c = cluster
    _up(c, {"node-a": "1xL4-24GB"})
    bulk = c.write_spec("fraud-rules", name="bulk", replicas=2, priorityLevel="P2",
                        resources={"cpu": 0.25, "gpuMemoryMb": 10240})
    _apply(c, bulk)
    c.wait_ready("bulk", 2, timeout=120)
    events = TopicTail(c.settings, f"{c.prefix}.events")
    status = StatusTail(c.settings)
    try:
        rt = c.write_spec("fraud-rules", name="rt", priorityLevel="P0", resources={"cpu": 0.25, "gpuMemoryMb": 12288})
        _apply(c, rt)
        c.wait_ready("rt", 1, timeout=120)
        (pre,) = wait_for(lambda: _events(events, "bulk", "preempted"), 30, "a preempted event")
        victim = pre["replica_id"]
        assert pre["detail"].startswith(f"preempted by rt-0 (P0, needs 12288 MiB GPU memory) on node-a gpu 0: "
                                        f"{victim} is P2; drained; unschedulable"), pre
        stopped = wait_for(lambda: status.find(replica_id=victim, state="STOPPED"), 30, "the victim drained")[-1]
        assert stopped["reason"] == "drained" and stopped["exit_code"] == 0
        view = {r["replica_id"]: r for r in c.model("bulk")["replicas"]}[victim]
        assert view["state"] == "UNSCHEDULABLE" and view["reason"].startswith("unschedulable: preempted by rt-0"), view
        assert "needs 10240 MiB GPU memory" in view["reason"], view
        # a node with room joins: the evicted replica is placed there
        c.start_agent("node-b", gpus="1xL4-24GB", heartbeat_s=1.0)
        c.wait_ready("bulk", 2, timeout=120)
        assert c.placement("bulk")[victim] == "node-b" and c.placement("rt") == {"rt-0": "node-a"}
    finally:
        status.close()
        events.close()
