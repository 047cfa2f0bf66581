"""An LLM model whose endpoints all fail, on a real cluster (issue 41 item 5): `sie control` + `sie agent` on a real
broker, the example LLM spec (examples/llm/tiny-vllm.yaml) served by an agent-run replica whose own server (the fake
LLM server, launched through the launcher's ``server_entry``) starts refusing every generation.  Before, the model
stayed Ready with its requests held forever; now the worker reports the outage, the model is Degraded within
seconds with the endpoint's error as the reason, and once the server answers again it is Ready and every request
has exactly one answer (read_committed)."""

from __future__ import annotations

import json
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from sie.schemas.spec import load
from tests.support.cluster_harness import Cluster, RequestStream, http, wait_for
from tests.support.llm_fixtures import FAKE_SERVER
from tests.support.scorer_fixtures import CommittedReader, prove_exactly_once

pytestmark = pytest.mark.kafka

MODEL = "tiny-asker"


class Questions(RequestStream):
    """The harness's paced stream, each request a question (its inputs are the LLM spec's, not the fraud model's)."""

    def _produce_one(self) -> str:
        rid = f"{self.tag}-{self._n}"
        self._n += 1
        self._producer.produce(self.topic, json.dumps({"id": rid, "inputs": {"question": f"why {self._n}?"}}).encode(),
                               key=rid.encode(), on_delivery=self._delivered)
        self._producer.poll(0)
        return rid


def test_an_llm_outage_shows_as_degraded_within_seconds_and_every_held_request_is_answered_once(
        kafka_settings, tmp_path: Path) -> None:
    flag = tmp_path / "server-down"
    entry = [sys.executable, str(FAKE_SERVER), "--slots", "4", "--mean-s", "0.05", "--p99-s", "0.2",
             "--down-while", str(flag)]
    c = Cluster(kafka_settings, tmp_path, extra_env={"SIE_SGLANG_SERVER_ENTRIES": shlex.join(entry)})
    stream = reader = None
    try:
        path = c.write_spec("llm/tiny-vllm", replicas=1)
        doc = yaml.safe_load(path.read_text())
        config = doc["spec"]["backend"]["config"]
        del config["endpoints"]  # the replica's own server (launched by its worker) is the window's endpoint
        config.update(server_entry=entry, extra_args=["--max-running-requests", "4"], endpoint_backoff_s=0.2,
                      endpoint_backoff_max_s=1.0)
        del doc["spec"]["sla"]["max_queue_time_ms"]  # held through the outage, not expired: each answered once
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        c.start_control("cp-1")
        c.start_agent("node-a", heartbeat_s=1.0)
        c.wait_leader(60)
        status, body = http(c.api(), "POST", "/v1/models", yaml.safe_dump(doc))
        assert status == 202, body
        c.wait_ready(MODEL, 1, timeout=180)
        spec = load(doc, topic_prefix=c.prefix)
        tag = f"llm{uuid.uuid4().hex[:6]}"
        reader = CommittedReader(c.settings, spec.topics.results)
        stream = Questions(c.settings, spec.topics.requests, {}, tag, rate_per_s=5).start()
        wait_for(lambda: reader.count() >= 5, 60, lambda: f"first results ({len(reader.records)}): {c.logs()}")

        flag.write_text("down")  # the server refuses every generation (503), as one that is stopping does
        down_at = time.monotonic()
        model = wait_for(lambda: (m := c.model(MODEL)) and m["phase"] == "Degraded" and m, 30,
                         lambda: f"{MODEL} Degraded: {c.model(MODEL)}", interval=0.5)
        print(f"Degraded {time.monotonic() - down_at:.1f}s after the server went down")  # -s shows it
        assert model["reason"].startswith(f"1 of 1 replica(s) in a backend outage; {MODEL}-0: backend outage since "), model
        assert "no LLM endpoint answers: http://127.0.0.1:" in model["reason"]
        assert "HTTP 503 on /v1/completions: fake outage: the engine is down" in model["reason"], model

        flag.unlink()  # it answers again: the held requests are sent, the model is Ready again
        up_at = time.monotonic()
        wait_for(lambda: (m := c.model(MODEL)) and m["phase"] == "Ready", 60,
                 lambda: f"{MODEL} Ready again: {c.model(MODEL)}", interval=0.5)
        print(f"Ready {time.monotonic() - up_at:.1f}s after the server answered again")
        sent = stream.stop()
        stream = None
        results, dead = prove_exactly_once(c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=120)
        assert dead == [], "an outage is never a dead letter"
    finally:
        if stream is not None:
            stream.stop()
        if reader is not None:
            reader.close()
        c.close()
