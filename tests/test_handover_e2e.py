"""Planned handovers on a real cluster: `sie control` + two `sie agent` processes, the rules model under a
steady request stream, replicas removed and replaced ON PURPOSE (docs/reliability.md "Planned stops").

* scale-down 3 -> 2: the removed replica's worker leaves its group after its last commit, so the others
  take its partitions within a few heartbeats; the two kept replicas are not restarted;
* a new version without a rollout: each replica is replaced in place by a successor that loaded (and
  proved) the new version while the old worker still served, then took over;
* `sie delete`: the last workers leave the group at once (no member waits out its session).

The bound on the longest gap in results is generous for a loaded CI machine (3 s, against the 10 s a
static member's partitions used to wait); bench/bench_rollout.py --handover reports the real figures.
Every request has exactly one answer (read_committed) across all of it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml

from sie.schemas.spec import load
from tests.support.cluster_harness import Cluster, RequestStream, ResultTail, StatusTail, example_input, wait_for
from tests.support.scorer_fixtures import prove_exactly_once

pytestmark = pytest.mark.kafka

MODEL = "fraud-rules"
GAP_BOUND_S = 3.0
#: a version change's in-place replacement: its successor now joins the group only once every version its table
#: names is ready (issue 34), so the hand-over is a leave-then-join; 1.2-1.8 s in bench/bench_rollout.py --handover
#: and 3.3 s once in a loaded CI run. Still far below the 10 s a session timeout would cost; the <= 1 s target is
#: issue 34's open item (docs/rollouts.md)
VERSION_CHANGE_GAP_BOUND_S = 5.0
SETTLE_S = 2.0  # measured after the final shape is reached: a straggling partition still shows


def members_now(settings, group_id: str) -> int | None:
    """Members of the group as the broker describes it now (None: not described, retried by the caller)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client_config())
    try:
        return len(admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result(timeout=10).members)
    except Exception:
        return None


def assignment_now(settings, group_id: str) -> dict[str, list[int]] | str:
    """Who holds which partition of the group now, as the broker describes it (a failed gap bound shows it)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client_config())
    try:
        group = admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result(timeout=10)
    except Exception as exc:  # a diagnostic: the assertion it serves is what fails
        return f"not described: {exc}"
    return {m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in group.members}


def test_replicas_removed_or_replaced_on_purpose_hand_their_partitions_over_without_a_stall(kafka_settings,
                                                                                           tmp_path: Path):
    c = Cluster(kafka_settings, tmp_path)
    stream = tail = status = None
    try:
        path = c.write_spec(MODEL, replicas=3, resources={"cpu": 0.25})
        c.start_control("cp-1")
        c.start_agent("node-a")
        c.start_agent("node-b")
        c.wait_leader(60)
        doc = yaml.safe_load(path.read_text())
        group_id = load(doc, topic_prefix=c.prefix).group_id
        c.post_model(doc)
        c.wait_ready(MODEL, 3, timeout=180)
        # placed before node-b registered, the replicas are moved back toward the spread first (a surge replica
        # comes and goes: docs/control-plane.md, "Spread restored"); the measurements start from the settled spread
        wait_for(lambda: c.settled(MODEL, "1.0.0", 3) and set(c.placement(MODEL).values()) == {"node-a", "node-b"}
                 and len(c.all_workers()) == 3, 180, lambda: f"{MODEL} x3 spread over both nodes: {c.model(MODEL)}")
        status = StatusTail(c.settings)
        tail = ResultTail(c.settings, c.spec_topics(MODEL))
        stream = RequestStream(c.settings, c.spec_topics(MODEL)["requests"], example_input(path),
                               f"ho{uuid.uuid4().hex[:6]}", rate_per_s=100).start()
        wait_for(lambda: tail.count() > 200, 60, "results from the three replicas")

        def settle_and_gaps(start: float, version: str, replicas: int) -> dict[int, float]:
            wait_for(lambda: c.settled(MODEL, version, replicas), 180,
                     lambda: f"{MODEL} {version} x{replicas}; status {c.model(MODEL)}\n{c.logs()}")
            end = time.monotonic() + SETTLE_S
            wait_for(lambda: time.monotonic() >= end, SETTLE_S + 5, "the settle margin")
            return tail.gaps(start, time.monotonic(), stream.partition_of)[1]

        def scaled(n: int) -> dict:
            return {**doc, "spec": {**doc["spec"], "sla": {**doc["spec"]["sla"], "min_replicas": n, "max_replicas": n}}}

        # scale-down 3 -> 2: one replica stops (SIGTERM: it leaves its group), the kept two are not restarted
        kept_before = {rid: (node, pid) for rid, (node, pid) in c.all_workers().items() if rid != f"{MODEL}-2"}
        start = time.monotonic()
        c.post_model(scaled(2))
        per = settle_and_gaps(start, "1.0.0", 2)
        print(f"scale-down 3 -> 2: longest gap per partition {max(per.values()):.2f}s {per}")
        assert max(per.values()) <= GAP_BOUND_S, (per, assignment_now(c.settings, group_id), c.logs())
        # the stopped worker exits once it served on through its settle wait (<= 3 s) and left; the kept two are
        # the same processes (not restarted)
        wait_for(lambda: f"{MODEL}-2" not in c.all_workers(), 30, lambda: f"{MODEL}-2's worker to exit: {c.logs('agent')}")
        # the kept two are not restarted by the count change; one that shared a node with the other may be moved to
        # the node the stopped one left (the spread rule: a planned move, a new process on the other node)
        wait_for(lambda: c.settled(MODEL, "1.0.0", 2) and set(c.placement(MODEL).values()) == {"node-a", "node-b"}
                 and set(c.all_workers()) == set(kept_before), 120,
                 lambda: f"{MODEL} x2 spread over both nodes: {c.model(MODEL)} workers {c.all_workers()}")
        kept_after = c.all_workers()
        in_place = {rid for rid, (node, _) in kept_after.items() if node == kept_before[rid][0]}
        assert in_place, (kept_after, kept_before)  # at most one of the two moves
        assert {rid: kept_after[rid][1] for rid in in_place} == {rid: kept_before[rid][1] for rid in in_place}
        doc = scaled(2)

        # a new version, no rollout: each replica is replaced in place by a loaded successor
        t_change = time.time()
        start = time.monotonic()
        c.post_model({**doc, "spec": {**doc["spec"], "model": {"name": MODEL, "version": "1.1.0"}}})
        per = settle_and_gaps(start, "1.1.0", 2)
        print(f"version change: longest gap per partition {max(per.values()):.2f}s {per}")
        assert max(per.values()) <= VERSION_CHANGE_GAP_BOUND_S, (per, assignment_now(c.settings, group_id), c.logs())
        standby = {r["replica_id"] for r in status.values()
                   if r["ts_ms"] / 1000 >= t_change and r["state"] == "STARTING" and "(standby:" in (r["reason"] or "")}
        assert standby == {f"{MODEL}-0", f"{MODEL}-1"}, [r for r in status.values() if r["ts_ms"] / 1000 >= t_change]

        sent = stream.stop()
        tag = stream.tag
        stream = None
        spec = load(doc, topic_prefix=c.prefix)
        prove_exactly_once(c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=120)

        # sie delete: the workers stop and leave; no static member lingers in the group for its session
        deleted = c.sie("delete", "model", MODEL, "--control-url", f"http://127.0.0.1:{c.api()}")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        gone = time.monotonic()
        wait_for(lambda: not c.all_workers(), 60, lambda: f"the workers to stop; {c.logs('agent')}")
        wait_for(lambda: members_now(c.settings, spec.group_id) == 0, 60, "the group to be empty")
        left = time.monotonic() - gone
        print(f"sie delete -> the group is empty {left:.2f}s later")
        assert left < 8.0, f"{left:.2f}s: a worker's static membership outlived it (session timeout 10 s)"
    finally:
        for closable in (stream,):
            if closable is not None:
                closable.stop()
        for closable in (tail, status):
            if closable is not None:
                closable.close()
        c.close()
