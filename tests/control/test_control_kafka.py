"""Control plane against the real broker: leadership, failover, HTTP API, assignments on Kafka.

Agents are faked at the Kafka level (a NodeRegistration + Heartbeats published by the test); the
end-to-end run with real agents lives with the agent tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from sie.control.reconcile.config import ControlConfig
from sie.control.service import ControlService
from sie.kernel.admin import ensure_topics
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import decode, encode
from tests.support.helpers import (
    OPERATOR_TOKEN,
    REPO_ROOT,
    VIEWER_TOKEN,
    consume_all,
    leader_takeover_bound_s,
    wait_until,
    with_api_tokens,
)

pytestmark = pytest.mark.kafka
REPO = REPO_ROOT


@pytest.fixture()
def settings(kafka_settings):
    prefix = f"ctl{uuid.uuid4().hex[:8]}"
    s = with_api_tokens(kafka_settings.with_overrides(topic_prefix=prefix))
    ensure_topics(s, system_topics(prefix))
    return s


def _producer(settings):
    from confluent_kafka import Producer

    return Producer(settings.kafka_client_config(**{"enable.idempotence": True}))


def _gpu(index: int, total: int = 16384) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "product": "NVIDIA L4", "memory_total_mb": total, "memory_used_mb": 0,
            "memory_free_mb": total, "utilization_pct": 0.0, "temperature_c": 40.0, "simulated": True, "healthy": True}


class FakeAgent:
    """Registers a node and heartbeats every 0.5 s from a thread (Kafka-level stand-in for an agent).

    ``skew_s``: how far the agent's clock is off (its heartbeats' ``ts_ms`` and the records' own timestamps)."""

    def __init__(self, settings, node: str, tier: str | None = None, gpus: int = 2, skew_s: float = 0.0) -> None:
        self.settings, self.node, self.tier, self.skew_s = settings, node, tier, skew_s
        self.seq = 0
        self.gpus = [_gpu(i) for i in range(gpus)]
        self._stop = threading.Event()
        self._producer = _producer(settings)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeAgent:
        p = self.settings.topic_prefix
        self._producer.produce(f"{p}.nodes", key=self.node.encode(), value=encode("NodeRegistration", {
            "node": self.node, "labels": {}, "tier": self.tier, "cpu_count": 8, "memory_mb": 32768, "gpus": self.gpus,
            "simulated": True, "agent_version": "test", "started_at_ms": int(time.time() * 1000)}))
        self._producer.flush(10)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seq += 1
            now_ms = int((time.time() + self.skew_s) * 1000)
            self._producer.produce(f"{self.settings.topic_prefix}.heartbeats", key=self.node.encode(), value=encode("Heartbeat", {
                "node": self.node, "ts_ms": now_ms, "seq": self.seq, "gpus": self.gpus, "replicas": []}), timestamp=now_ms)
            self._producer.flush(5)
            self._stop.wait(0.5)  # the fake agent's heartbeat period (pacing, not synchronisation)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class AssignmentReader:
    """read_committed reader of the assignments topic: latest record per node."""

    def __init__(self, settings) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(settings.kafka_client_config(**{
            "group.id": f"test-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "isolation.level": "read_committed"}))
        self.consumer.subscribe([f"{settings.topic_prefix}.assignments"])
        self.latest: dict[str, dict] = {}
        self.history: list[dict] = []  # every Assignment read, in order

    def poll(self) -> dict[str, dict]:
        for msg in self.consumer.consume(100, 0.3):
            if msg.error() is None and msg.value() is not None:
                self.latest[msg.key().decode()] = decode(msg.value())
                self.history.append(self.latest[msg.key().decode()])
        return self.latest

    def close(self) -> None:
        self.consumer.close()


def _http(port: int, method: str, path: str, body: Any = None, token: str | None = OPERATOR_TOKEN) -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if resp.headers.get("Content-Type", "").startswith("application/json") else raw.decode())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _spec(name: str, gpu_mb: int = 4096, priority: str = "P1", **extra: Any) -> dict:
    return {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": "1.0.0"}, "priorityLevel": priority,
                     "backend": {"type": "python", "callable": "models.fraud.rules:score"},
                     "resources": {"gpuMemoryMb": gpu_mb, "cpu": 1}, **extra}}


def test_http_api_and_assignments(settings):
    agent = FakeAgent(settings, "node-1").start()
    agent0 = FakeAgent(settings, "fast-0", tier="tier-0").start()
    svc = ControlService(settings, ControlConfig(reconcile_interval_s=0.3), instance_id="solo", http_port=0, http_host="127.0.0.1").start()
    reader = AssignmentReader(settings)
    try:
        port = svc.http_port
        # leading and caught up are two threads' news (elector, state feeder): wait for both, in either order
        health = wait_until(lambda: (h := _http(port, "GET", "/healthz")[1])["role"] == "leader"
                            and h["state_caught_up"] and h, 30, message="solo instance to lead, caught up")
        assert health["epoch"] >= 1
        nodes = wait_until(lambda: [n for n in _http(port, "GET", "/v1/nodes")[1]["nodes"] if n["status"] == "online"], 15,
                           message="fake nodes online")
        assert {n["name"] for n in nodes} == {"node-1", "fast-0"}
        assert next(n for n in nodes if n["name"] == "fast-0")["tier"] == "tier-0"

        status, body = _http(port, "POST", "/v1/models", _spec("scorer"))
        assert status == 202 and body["name"] == "scorer"
        latest = wait_until(lambda: (a := reader.poll().get("node-1")) and a["replicas"] and a, 20,
                            message="an Assignment for node-1")
        assert [r["replica_id"] for r in latest["replicas"]] == ["scorer-0"]
        assert latest["epoch"] == health["epoch"]
        model = wait_until(lambda: (m := _http(port, "GET", "/v1/models/scorer")[1]).get("replicas") and m, 10)
        assert model["replicas"][0]["node"] == "node-1" and model["desired_replicas"] == 1

        bad = _spec("broken")
        bad["spec"]["resources"]["gpuMemoryMb"] = -5
        status, body = _http(port, "POST", "/v1/models", bad)
        assert status == 422
        assert {"field": "spec.resources.gpuMemoryMb", "reason": "must be >= 0 (got -5)"} in body["errors"]

        status, body = _http(port, "POST", "/v1/models", _spec("greedy", scheduling={"tier": "tier-0"}))
        assert status == 409 and "tier-0" in body["error"]

        status, _ = _http(port, "POST", "/v1/models", "not: [valid")
        assert status == 422

        status, _ = _http(port, "POST", "/v1/models", _spec("huge", gpu_mb=65536))
        assert status == 202  # accepted; the reason shows in its status
        huge = wait_until(lambda: (m := _http(port, "GET", "/v1/models/huge")[1]).get("phase") == "Unschedulable" and m, 15,
                          message="huge to be reported unschedulable")
        assert "needs 65536 MiB GPU memory" in huge["replicas"][0]["reason"]

        status, _ = _http(port, "DELETE", "/v1/models/scorer")
        assert status == 202
        wait_until(lambda: reader.poll()["node-1"]["replicas"] == [], 20, message="node-1 emptied after delete")
        metrics = _http(port, "GET", "/metrics")[1]
        assert "sie_control_leader 1.0" in metrics and "sie_control_reconcile_seconds" in metrics

        # every write is an audit event on the events topic: who, what, outcome, when
        assert _http(port, "DELETE", "/v1/models/huge", token=VIEWER_TOKEN)[0] == 403
        audits = [decode(r.value) for r in consume_all(settings, f"{settings.topic_prefix}.events", timeout=20)
                  if decode(r.value)["kind"] == "audit"]
        details = [a["detail"] for a in audits]
        assert any(d.startswith("operator (operator) apply scorer: accepted version 1.0.0; from 127.0.0.1:") for d in details)
        assert any(d.startswith("operator (operator) apply -: refused 422") for d in details)
        assert any(d.startswith("operator (operator) delete scorer: accepted") for d in details)
        assert any(d.startswith("viewer (viewer) DELETE /v1/models/huge huge: forbidden") for d in details)
        assert all(a["ts_ms"] > 0 for a in audits)
    finally:
        reader.close()
        svc.stop()
        agent.stop()
        agent0.stop()


def test_a_spec_written_to_the_topic_directly_is_refused_and_never_placed(settings, tmp_path):
    """Whoever can write the specs topic cannot get past the spec policy: the control plane refuses the spec
    with the API's reasons (model phase Invalid) and places nothing."""
    import json as _json

    from sie.schemas.spec import load

    agent = FakeAgent(settings, "node-1").start()
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    doc = load({"name": "evil", "version": "1", "backend": {
        "type": "torch", "artifact": str(weights), "format": "safetensors",
        "moduleClass": "models.fraud.model:FraudMLP"}}, topic_prefix=settings.topic_prefix).to_document()
    doc["backend"]["module_class"] = "subprocess:Popen"
    doc["backend"]["module_kwargs"] = {"args": f"touch {tmp_path / 'pwned'}", "shell": True}
    producer = _producer(settings)
    producer.produce(f"{settings.topic_prefix}.specs", key=b"evil", value=encode("ModelSpecRecord", {
        "name": "evil", "version": "1", "spec_json": _json.dumps(doc), "applied_at_ms": int(time.time() * 1000),
        "deleted": False}))
    assert producer.flush(10) == 0
    svc = ControlService(settings, ControlConfig(reconcile_interval_s=0.3), instance_id="solo", http_port=0).start()
    reader = AssignmentReader(settings)
    try:
        port = svc.http_port
        model = wait_until(lambda: (m := _http(port, "GET", "/v1/models/evil")[1]).get("phase") == "Invalid" and m, 30,
                           message="the spec refused")
        assert model["reason"].startswith("spec refused: spec.backend.moduleClass: module 'subprocess'")
        wait_until(lambda: _http(port, "GET", "/healthz")[1]["role"] == "leader", 30, message="leading")
        wait_until(lambda: svc.controller.last_report is not None, 10, message="a reconcile pass")
        assert all(not a["replicas"] for a in reader.poll().values())
        assert _http(port, "GET", "/v1/replicas")[1]["replicas"] == []
    finally:
        reader.close()
        svc.stop()
        agent.stop()
    assert not (tmp_path / "pwned").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(settings, instance: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "SIE_TOPIC_PREFIX": settings.topic_prefix,
           "SIE_API_TOKENS": json.dumps([e.model_dump() for e in settings.api_tokens])}
    return subprocess.Popen(
        [sys.executable, "-m", "sie", "control", "--http-port", str(port), "--http-host", "127.0.0.1",
         "--instance", instance, "--no-ensure-topics"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _role(port: int) -> str | None:
    try:
        return _http(port, "GET", "/healthz")[1]["role"]
    except (OSError, urllib.error.URLError, ValueError):
        return None


def test_one_leader_and_failover_after_sigkill(settings):
    agent = FakeAgent(settings, "node-1").start()
    ports = {"cp-a": _free_port(), "cp-b": _free_port()}
    procs = {name: _spawn(settings, name, port) for name, port in ports.items()}
    reader = AssignmentReader(settings)
    try:
        roles = wait_until(lambda: (r := {n: _role(p) for n, p in ports.items()}) and None not in r.values()
                           and "leader" in r.values() and r, 60, message="both instances up, one leading")
        assert sorted(roles.values()) == ["leader", "standby"]
        leader = next(n for n, r in roles.items() if r == "leader")
        standby = next(n for n in ports if n != leader)
        first_epoch = _http(ports[leader], "GET", "/healthz")[1]["epoch"]
        # a standby answers reads and accepts writes (they go to Kafka)
        assert _http(ports[standby], "POST", "/v1/models", _spec("one"))[0] == 202
        wait_until(lambda: (a := reader.poll().get("node-1")) and a["replicas"], 20, message="assignment by the first leader")

        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(10)
        killed_at = time.monotonic()
        bound = leader_takeover_bound_s()  # session timeout + heartbeat + slack (see there)
        # wait past the bound, so a slow takeover is measured and reported by the assertion below
        wait_until(lambda: _role(ports[standby]) == "leader", 2 * bound, message="standby to take over")
        takeover = time.monotonic() - killed_at
        new_epoch = _http(ports[standby], "GET", "/healthz")[1]["epoch"]
        assert new_epoch > first_epoch
        assert takeover < bound, f"takeover took {takeover:.1f}s (bound {bound:.1f}s)"
        # the new leader keeps publishing, with its epoch, and did not re-publish the unchanged node
        assert _http(ports[standby], "POST", "/v1/models", _spec("two"))[0] == 202
        latest = wait_until(lambda: (a := reader.poll().get("node-1")) and len(a["replicas"]) == 2 and a, 20,
                            message="assignment with both models from the new leader")
        assert latest["epoch"] == new_epoch
        print(f"takeover after SIGKILL: {takeover:.1f}s (epoch {first_epoch} -> {new_epoch})")
    finally:
        reader.close()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        agent.stop()
