"""A model whose backend goes down, on a real cluster (issue 22, operator surface): `sie control` + `sie
agent` processes on a real broker, the rules model behind a dependency that stops answering.

The scorer retries its batches (an outage is never dead letters) and its process stays READY, so nothing
else would show it: the worker reports the outage with its progress, the agent forwards it in its
heartbeat, and the control plane marks the model Degraded with the failure as the reason, which `sie
describe model` (from the model-status topic) and the API show; once the dependency answers again the model
is Ready again and every request has exactly one answer.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
import yaml

from sie.schemas.spec import load
from tests.support.cluster_harness import REPO, Cluster, RequestStream, example_input, http, try_get, wait_for
from tests.support.scorer_fixtures import CommittedReader, prove_exactly_once

pytestmark = pytest.mark.kafka

MODEL = "fraud-rules"


def test_a_backend_outage_shows_as_degraded_with_its_reason_and_heals(kafka_settings, tmp_path: Path) -> None:
    flag = tmp_path / "feature-store-down"
    c = Cluster(kafka_settings, tmp_path, extra_env={
        "SIE_ALLOWED_MODULES": "models.fraud,tests.support.scorer_fixtures", "SIE_TEST_OUTAGE_FLAG": str(flag),
        # the agent hands its workers only allow-listed variables (docs/security.md): name the test's own
        "SIE_WORKER_ENV": "SIE_TEST_OUTAGE_FLAG",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "examples")])})
    stream = reader = None
    try:
        path = c.write_spec(MODEL, replicas=1, resources={"cpu": 0.25},
                            backend={"callable": "tests.support.scorer_fixtures:rules_or_outage"})
        c.start_control("cp-1")
        c.start_agent("node-a", heartbeat_s=1.0)
        c.wait_leader(60)
        doc = yaml.safe_load(path.read_text())
        status, body = http(c.api(), "POST", "/v1/models", yaml.safe_dump(doc))
        assert status == 202, body
        c.wait_ready(MODEL, 1, timeout=120)
        spec = load(doc, topic_prefix=c.prefix)
        tag = f"out{uuid.uuid4().hex[:6]}"
        reader = CommittedReader(c.settings, spec.topics.results)
        stream = RequestStream(c.settings, spec.topics.requests, example_input(path), tag, rate_per_s=10).start()
        wait_for(lambda: reader.count() >= 10, 60, lambda: f"first results ({len(reader.records)})")

        flag.write_text("down")  # the model's dependency stops answering
        model = wait_for(lambda: (m := c.model(MODEL)) and m["phase"] == "Degraded" and m, 90,
                         lambda: f"{MODEL} Degraded: {c.model(MODEL)}", interval=0.5)
        assert model["reason"].startswith(f"1 of 1 replica(s) in a backend outage; {MODEL}-0: backend outage since "), model
        assert "feature store 10.0.0.7:6379 refused the connection" in model["reason"], model
        (replica,) = model["replicas"]
        assert replica["state"] == "READY" and "its batches are retried, nothing is scored" in replica["reason"]

        described = wait_for(lambda: (d := c.sie("describe", "model", MODEL)) and "Degraded" in d.stdout and d, 60,
                             lambda: f"describe shows Degraded: {c.sie('describe', 'model', MODEL).stdout}",
                             interval=1.0)
        assert "Phase:       Degraded (1 of 1 replica(s) in a backend outage;" in described.stdout, described.stdout
        assert "feature store 10.0.0.7:6379 refused the connection" in described.stdout
        # once the traffic window (60 s) holds no result, the data path says so too (results 0/s, lag growing)
        described = wait_for(lambda: (d := c.sie("describe", "model", MODEL)) and "Scoring:" in d.stdout and d, 120,
                             lambda: f"describe's Scoring line: {c.sie('describe', 'model', MODEL).stdout}",
                             interval=3.0)
        assert "results 0.00/s" in described.stdout
        assert re.search(r"Scoring:     nothing committed in the last 60s while \d+ request\(s\) wait", described.stdout)

        flag.unlink()  # it answers again: the next batch scores, the model is Ready again
        wait_for(lambda: (m := c.model(MODEL)) and m["phase"] == "Ready", 90,
                 lambda: f"{MODEL} Ready again: {c.model(MODEL)}", interval=0.5)
        sent = stream.stop()
        stream = None
        results, dead = prove_exactly_once(c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=120)
        assert dead == [], "an outage is retried, never dead-lettered"
        events = [e for e in (try_get(c.api(), "/v1/events?limit=500") or {}).get("events", []) if e["model"] == MODEL]
        assert events, "the model's events are listed"
    finally:
        if stream is not None:
            stream.stop()
        if reader is not None:
            reader.close()
        c.close()
