"""The read answers, now dumped through their response models (``sie.control.api.views``), are byte for byte the
JSON of the records they are built from, as the routes answered before (``JSONResponse``: compact, UTF-8):
whole and fractional numbers stay as they are, keys only some answers have stay absent, open documents
(cool-downs, an autoscaler decision) pass through, and a rollout's transitions keep their ``from``/``to``."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sie.control.api.auth import TokenStore
from sie.control.api.routers.models import model_json
from sie.control.api.routes import create_app
from sie.control.reconcile.observability import event_rows, prometheus_targets
from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.control.rollout.driver import Entry
from sie.control.rollout.machine import Event, Phase, new_rollout
from sie.control.rollout.service import describe
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from sie.schemas.rollout_policy import Policy
from sie.schemas.spec import load
from tests.support.helpers import VIEWER_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import echo_spec_doc

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NOW = 1_796_000_000.0
AUTH = {"Authorization": f"Bearer {VIEWER_TOKEN}"}


def _json(value: Any) -> bytes:
    """What ``JSONResponse`` rendered."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


@pytest.fixture()
def served(tmp_path: Path) -> tuple[TestClient, ControlService]:
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    service = ControlService(settings, http_port=None)
    service.clock = lambda: NOW
    state = service.state
    state.apply_node("gpu-1", {"labels": {"zone": "z1"}, "cpu_count": 31.5, "memory_mb": 256000, "simulated": True,
                               "gpus": [{"index": 0, "product": "H100", "memory_total_mb": 81559, "memory_used_mb": 7,
                                         "utilization_pct": 12.5, "healthy": True, "simulated": True}]})
    state.apply_node("cpu-1", {"cpu_count": 32, "memory_mb": 1000})
    state.apply_heartbeat({"node": "gpu-1", "ts_ms": int(NOW * 1000), "seq": 1, "gpus": [],
                           "metrics_address": "10.0.0.1:9400", "replicas": [
                               {"replica_id": "fraud-0", "model": "fraud", "version": "1.0.0", "state": "READY",
                                "pid": 1, "restarts": 0, "reason": None, "metrics_address": "10.0.0.1:40001",
                                "lag": 4, "p99_ms": 12}]}, seen_at=NOW)
    state.specs["fraud"] = load(echo_spec_doc("fraud"), origin="test", topic_prefix=settings.topic_prefix)
    state.spec_errors["broken"] = "spec.sla: ünknown field"
    for k in range(3):
        state.apply_event({"ts_ms": 1000 + k, "kind": "placed", "model": "fraud", "replica_id": "fraud-0",
                           "node": "gpu-1", "detail": "placed on gpu-1"})
    replicas = (
        ReplicaView("fraud-0", "fraud", "1.0.0", "gpu-1", (0,), 1000, ReplicaState.READY, process="pid-1",
                    actual_version="1.0.0"),
        ReplicaView("fraud-1", "fraud", "1.0.0", None, (), 0, ReplicaState.UNSCHEDULABLE, reason="kein Platz: 0 GPUs",
                    restarts=2, cooldowns=({"node": "gpu-1", "until_ms": 5, "reason": "failed"},)),
    )
    service.controller.statuses = {"fraud": ModelStatus(
        "fraud", "1.0.0", "P1", "scoring", "Degraded", "fraud-1 unschedulable", 2, 1, replicas, epoch=3,
        updated_at_ms=9, autoscale={"desired": 2, "why": "lag 4"})}
    rollout = new_rollout("fraud", "1.0.0", "1.1.0", Policy(), 1000)
    rollout = replace(rollout, events=(Event(1000, Phase.PENDING, Phase.SURGING, -1, 0, "surge"),))
    stable = state.specs["fraud"].to_document()
    entry = Entry(rollout, stable, {**stable, "version": "1.1.0"})
    service.rollouts = SimpleNamespace(list=lambda: [describe(entry)], last_error=None)
    client = TestClient(create_app(service, TokenStore(settings), ("/healthz",), SimpleNamespace(record=print)),
                        raise_server_exceptions=False)
    return client, service


def test_the_read_answers_are_the_records_json_byte_for_byte(served: tuple[TestClient, ControlService]) -> None:
    client, service = served
    snap = service.state.snapshot()
    records = sorted((r.to_record() for s in service.controller.statuses.values() for r in s.replicas),
                     key=lambda r: r["replica_id"])
    expected = {
        "/v1/replicas": {"replicas": records},
        "/v1/nodes": {"nodes": [v.to_json() for v in snap.node_views(NOW, service.config.node_timeout_s)]},
        "/v1/models": {"models": [model_json(service, n) for n in ("broken", "fraud")]},
        "/v1/models/fraud": model_json(service, "fraud"),
        "/v1/models/broken": model_json(service, "broken"),
        "/v1/events?limit=2": {"events": event_rows(snap.events, 2)},
        "/v1/prometheus/targets": prometheus_targets(snap, NOW, service.config.node_timeout_s),
        "/v1/rollouts": {"rollouts": service.rollouts.list()},
        "/v1/rollouts/fraud": service.rollouts.list()[0],
    }
    for path, value in expected.items():
        response = client.get(path, headers=AUTH)
        assert response.status_code == 200, (path, response.text)
        assert response.content == _json(value), path
    nodes = client.get("/v1/nodes", headers=AUTH).json()["nodes"]
    assert {n["name"]: n["cpu"] for n in nodes} == {"gpu-1": 31.5, "cpu-1": 32.0}
    broken = client.get("/v1/models/broken", headers=AUTH).json()
    assert "replicas" not in broken and "spec" not in broken and broken["phase"] == "Invalid"  # absent stays absent
    assert client.get("/v1/rollouts/fraud", headers=AUTH).json()["events"][0]["from"] == str(Phase.PENDING)
    anonymous = client.get("/healthz")
    assert anonymous.status_code == 200 and list(anonymous.json()) == ["status", "role", "state_caught_up"]
    full = client.get("/healthz", headers=AUTH)
    assert full.content == _json(service.health())


def test_connector_answers_keep_their_keys_and_order(served: tuple[TestClient, ControlService],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from sie.control.reconcile import connectors
    from sie.schemas.connector_spec import parse_connector_spec
    from sie.schemas.connector_store import connector_record

    client, service = served
    orders = {"name": "orders", "format": "canal-json", "source_topic": "canal.shop.orders", "model": "fraud",
              "tables": ["shop.orders"], "mapping": {"amount": "amount"}}
    service.state.apply_connector("orders", connector_record(parse_connector_spec(orders), True, 7))
    service.state.apply_connector("garbled", {"name": "garbled", "spec_json": "{", "applied_at_ms": 1})
    snap = service.state.snapshot()
    listed = [connectors.connector_status(n, snap, None, NOW, service.config.node_timeout_s) for n in ("garbled", "orders")]
    assert [c["phase"] for c in listed if c] == ["Invalid", "Paused"]
    response = client.get("/v1/connectors", headers=AUTH)
    assert response.content == _json({"connectors": listed})
    offsets = {"group": "g", "source_topic": "canal.shop.orders", "partitions": [
        {"partition": 0, "committed": None, "end": 3, "lag": 3}], "lag": 3}
    monkeypatch.setattr(connectors, "connector_offsets", lambda *_a, **_k: offsets)
    assert client.get("/v1/connectors/orders", headers=AUTH).content == _json({**listed[1], "offsets": offsets})
    assert client.get("/v1/connectors/garbled", headers=AUTH).content == _json(listed[0])
