"""A rollout on a real cluster: `sie control` + `sie agent` processes on a real broker, the rules model at
1 replica under a steady request stream, a new version applied with a `rollout` block.

What the unit tests (tests/control/placement/test_rollout_capacity) cannot show: the surge replica is
placed with the new version's spec, its agent starts a worker that proves the new version with a real
readiness inference before it reports READY, only then does the rollout leave Surging; in Draining the
stable replica is replaced by a new-version one, the surge replica stops last, and every request has
exactly one answer across all of it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from sie.schemas.spec import load
from tests.support.cluster_harness import Cluster, RequestStream, example_input, http, try_get, wait_for
from tests.support.scorer_fixtures import prove_exactly_once

pytestmark = pytest.mark.kafka

MODEL = "fraud-rules"
#: a step passes on evidence (~75 canary answers and model calls: ~8 s at 50 % of 20/s), not on 3 s alone;
#: inconclusiveIntervals gives it up to 30 s before the truncated tests decide
ROLLOUT = {"steps": [50, 100], "intervalSeconds": 3, "surgeTimeoutSeconds": 120,
           "gates": {"minSamples": 10, "p99MaxMs": 10_000, "p99SlackMs": 1_000, "inconclusiveIntervals": 9}}


def _running(c: Cluster) -> tuple[dict, Path]:
    """The rules model at 1.0.0, 1 replica READY on one agent; its spec document and file."""
    path = c.write_spec(MODEL, replicas=1, resources={"cpu": 0.25})
    c.start_control("cp-1")
    c.start_agent("node-a")
    c.wait_leader(60)
    doc = yaml.safe_load(path.read_text())
    status, body = http(c.api(), "POST", "/v1/models", yaml.safe_dump(doc))
    assert status == 202, body
    c.wait_ready(MODEL, 1, timeout=120)
    return doc, path


def _roll(c: Cluster, doc: dict, rollout: dict, **model_changes) -> dict:
    """POST the 1.1.0 spec with ``rollout``; the rollout once it ended (Complete, RolledBack or Failed)."""
    spec = {**doc["spec"], "model": {"name": MODEL, "version": "1.1.0"}, "rollout": rollout, **model_changes}
    status, body = http(c.api(), "POST", "/v1/models", yaml.safe_dump({**doc, "spec": spec}))
    assert status == 202 and body.get("rollout") == "Pending", body

    def rollout_now():
        return try_get(c.api(), f"/v1/rollouts/{MODEL}")

    return wait_for(lambda: (r := rollout_now()) and r["phase"] in ("Complete", "RolledBack", "Failed") and r, 240,
                    lambda: f"the rollout finishes ({rollout_now()}); logs:\n{c.logs()}")


def test_an_agent_rollout_waits_for_a_ready_surge_replica_and_drains_one_at_a_time(kafka_settings, tmp_path: Path):
    c = Cluster(kafka_settings, tmp_path)
    stream = None
    try:
        doc, path = _running(c)
        spec = load(doc, topic_prefix=c.prefix)
        tag = f"ro{uuid.uuid4().hex[:6]}"
        stream = RequestStream(c.settings, spec.topics.requests, example_input(path), tag, rate_per_s=20).start()
        final = _roll(c, doc, ROLLOUT)
        sent = stream.stop()
        stream = None
        assert final["phase"] == "Complete", final["events"]
        reasons = {e["to"]: e["reason"] for e in final["events"]}
        # Surging ended on the agent's READY of the new-version surge replica (readiness inference), not at once
        surged = next(e["reason"] for e in final["events"] if e["from"] == "Surging")
        assert "READY after their readiness inference, and every replica serves both versions (surge" in surged, \
            final["events"]
        assert "all 1 replicas run 1.1.0 READY" in reasons["Complete"], final["events"]
        # after the drain: one replica, the new version, READY (the surge replica stopped)
        model = wait_for(lambda: c.ready_model(MODEL, 1), 60, lambda: f"1 READY replica: {c.model(MODEL)}")
        assert [(r["replica_id"], r["version"]) for r in model["replicas"]] == [(f"{MODEL}-0", "1.1.0")]
        events = [e for e in (try_get(c.api(), "/v1/events?limit=500") or {}).get("events", [])
                  if e.get("kind") == "rollout_capacity" and e.get("model") == MODEL]
        assert any("surge replica 1" in e["detail"] for e in events), events
        prove_exactly_once(c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=90)
    finally:
        if stream is not None:
            stream.stop()
        c.close()


def test_a_new_version_that_never_gets_ready_fails_the_surge_with_the_replicas_reason(kafka_settings, tmp_path: Path):
    """Its callable does not exist: neither the surge replica's worker nor the stable replica's companion process
    passes its readiness inference, so the rollout fails naming what an agent reported (at once, from the
    companion's FAILED state; at the latest at surgeTimeoutSeconds); the stable replica served throughout."""
    c = Cluster(kafka_settings, tmp_path)
    try:
        doc, _path = _running(c)
        backend = {**doc["spec"]["backend"], "callable": "models.fraud.rules:no_such_scorer"}
        final = _roll(c, doc, {**ROLLOUT, "surgeTimeoutSeconds": 20}, backend=backend)
        assert final["phase"] == "Failed" and final["weight_percent"] == 0, final["events"]
        reason = final["reason"]
        print(f"rollout failed: {reason}")  # shown with -s: what an operator reads
        # named: the stable replica's companion FAILED to load it, or (at the surge timeout) the surge replica's
        # crash as its agent reports it, or its FAILED cool-down on the node
        assert ("version 1.1.0 FAILED on replica 0" in reason
                or ("not ready within surgeTimeoutSeconds 20" in reason
                    and ("replica 1 (1.1.0): " in reason or "FAILED on node-a" in reason))), reason
        assert "no_such_scorer" in reason, reason
        # the surge replica is gone, the stable replica stayed READY
        model = wait_for(lambda: (m := c.ready_model(MODEL, 1)) and len(m["replicas"]) == 1 and m, 60,
                         lambda: f"1.0.0 alone: {c.model(MODEL)}")
        assert [(r["replica_id"], r["version"]) for r in model["replicas"]] == [(f"{MODEL}-0", "1.0.0")]
    finally:
        c.close()
