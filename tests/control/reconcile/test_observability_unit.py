"""What the control plane tells about metrics, without Kafka: Prometheus targets from heartbeats, live
numbers per model, events shown once, control-plane gauges that never keep an old count, and the
status page's routes."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app
from sie.control.reconcile.observability import event_rows, model_numbers, prometheus_targets
from sie.control.reconcile.records import ClusterState
from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.control.service import ControlMetrics, ControlService
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from tests.support.helpers import VIEWER_TOKEN, with_api_tokens

NOW = 10_000.0


def _report(rid: str, state: str, address: str | None, lag: int | None = None, p99: float | None = None) -> dict:
    return {"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": "1", "state": state, "pid": 1,
            "restarts": 0, "reason": None, "metrics_address": address, "lag": lag, "p99_ms": p99}


def _state() -> ClusterState:
    state = ClusterState()
    state.apply_heartbeat({"node": "a", "ts_ms": 0, "seq": 1, "gpus": [], "metrics_address": "a:9400", "replicas": [
        _report("fraud-0", "READY", "a:40001", lag=5, p99=20.0),
        _report("fraud-1", "CRASHED", "a:40002", lag=None),  # no process: not a target
        _report("rules-0", "STARTING", "a:40003", lag=0, p99=None)]}, seen_at=NOW)
    state.apply_heartbeat({"node": "b", "ts_ms": 0, "seq": 1, "gpus": [], "metrics_address": "b:9400", "replicas": [
        _report("fraud-2", "READY", "b:40001", lag=7, p99=35.0)]}, seen_at=NOW)
    state.apply_heartbeat({"node": "gone", "ts_ms": 0, "seq": 1, "gpus": [], "metrics_address": "gone:9400",
                           "replicas": [_report("fraud-3", "READY", "gone:40001", lag=1000, p99=900.0)]},
                          seen_at=NOW - 600)
    return state


def test_targets_list_online_agents_and_their_serving_workers_only():
    targets = prometheus_targets(_state().snapshot(), NOW, timeout_s=10)
    by_address = {g["targets"][0]: g["labels"] for g in targets}
    assert set(by_address) == {"a:9400", "a:40001", "a:40003", "b:9400", "b:40001"}
    assert by_address["a:40001"] == {"sie_component": "scorer", "sie_node": "a", "sie_replica": "fraud-0",
                                     "sie_model": "fraud"}
    assert by_address["b:9400"] == {"sie_component": "agent", "sie_node": "b"}


def test_a_shared_process_is_one_target_whatever_the_number_of_its_models():
    state = ClusterState()
    state.apply_heartbeat({"node": "a", "ts_ms": 0, "seq": 1, "gpus": [], "metrics_address": None, "replicas": [
        {**_report("m1-0", "READY", "a:41000"), "process": "shared-0"},
        {**_report("m2-0", "STARTING", "a:41000"), "process": "shared-0"},
        {**_report("big-0", "READY", "a:40001"), "process": "pid-7"}]}, seen_at=NOW)
    targets = prometheus_targets(state.snapshot(), NOW, timeout_s=10)
    assert [g["targets"][0] for g in targets] == ["a:40001", "a:41000"]
    assert targets[1]["labels"] == {"sie_component": "scorer", "sie_node": "a", "sie_process": "shared-0"}


def test_model_numbers_sum_lag_and_take_the_worst_p99_of_online_nodes():
    numbers = model_numbers(_state().snapshot(), NOW, timeout_s=10)
    assert numbers["fraud"] == {"lag": 12, "p99_ms": 35.0, "reporting": 2}
    assert numbers["rules"] == {"lag": 0, "p99_ms": None, "reporting": 1}


def test_the_same_event_is_shown_once_with_a_count_and_a_record_read_twice_is_applied_once():
    state = ClusterState()
    event = {"ts_ms": 1000, "kind": "unschedulable", "model": "m", "replica_id": "m-0", "node": None,
             "detail": "needs 64 GiB"}
    state.apply_event(event, (0, 5))
    state.apply_event(event, (0, 5))  # the same record again (a re-read)
    assert len(state.snapshot().events) == 1
    state.apply_event({**event, "ts_ms": 2000}, (0, 6))  # said again by a new leader
    state.apply_event({**event, "ts_ms": 3000, "kind": "placed", "node": "a", "detail": "on a"}, (0, 7))
    rows = event_rows(state.snapshot().events, 10)
    assert [(r["kind"], r["count"], r["first_ts_ms"], r["ts_ms"]) for r in rows] == [
        ("unschedulable", 2, 1000, 2000), ("placed", 1, 3000, 3000)]
    assert event_rows(state.snapshot().events, 1)[0]["kind"] == "placed"


def test_a_reread_is_skipped_while_the_event_is_kept_and_the_kept_window_slides():
    state = ClusterState(max_events=3)
    for offset in range(5):
        state.apply_event({"ts_ms": offset, "kind": "placed", "model": "m", "replica_id": f"m-{offset}", "node": "a",
                           "detail": "on a"}, (0, offset))
    assert [e.position for e in state.snapshot().events] == [(0, 2), (0, 3), (0, 4)]
    state.apply_event({"ts_ms": 4, "kind": "placed", "model": "m", "detail": "on a"}, (0, 4))  # kept: a re-read
    assert len(state.snapshot().events) == 3
    state.apply_event({"ts_ms": 0, "kind": "placed", "model": "m", "detail": "on a"}, (0, 0))  # long gone: new again
    assert [e.position for e in state.snapshot().events] == [(0, 3), (0, 4), (0, 0)]


def _status(name: str, states: list[ReplicaState], priority: str = "P0") -> ModelStatus:
    views = tuple(ReplicaView(f"{name}-{i}", name, "1", "a", (), 0, s) for i, s in enumerate(states))
    ready = sum(1 for s in states if s == ReplicaState.READY)
    return ModelStatus(name, "1", priority, "scoring", "Ready" if ready == len(states) else "Progressing", None,
                       len(states), ready, views)


def _observe(metrics: ControlMetrics, statuses: dict, nodes: int = 0) -> str:
    report = SimpleNamespace(durations={}, leader=True, guard=None, skipped=None, planned=None, checked=False, mismatched=0, statuses=statuses, plan=None,
                             errors={}, of=lambda _topic: [], decisions={})
    snap = SimpleNamespace(specs=statuses, nodes={f"n{i}": None for i in range(nodes)},
                           node_online=lambda name, now, timeout: name != "n0")
    metrics.observe(report, snap, NOW, 10)
    return generate_latest(metrics.registry).decode()


def test_control_gauges_never_keep_an_old_count_and_drop_models_that_are_gone():
    metrics = ControlMetrics()
    text = _observe(metrics, {"fraud": _status("fraud", [ReplicaState.CRASHED, ReplicaState.STOPPED])}, nodes=2)
    assert 'sie_control_replicas{state="CRASHED"} 1.0' in text
    assert 'sie_control_nodes{state="offline"} 1.0' in text and 'sie_control_nodes{state="online"} 1.0' in text
    text = _observe(metrics, {"fraud": _status("fraud", [ReplicaState.READY, ReplicaState.READY])}, nodes=2)
    assert 'sie_control_replicas{state="CRASHED"} 0.0' in text and 'sie_control_replicas{state="STOPPED"} 0.0' in text
    assert 'sie_control_replicas{state="READY"} 2.0' in text
    assert 'sie_control_model_replicas_ready{model_id="fraud",priority_level="P0"} 2.0' in text
    assert 'sie_control_model_phase{model_id="fraud",phase="Ready",priority_level="P0"} 1.0' in text
    text = _observe(metrics, {"rules": _status("rules", [ReplicaState.READY], "P2")})
    assert 'model_id="fraud"' not in text and 'model_id="rules"' in text


@pytest.fixture()
def client(tmp_path: Path) -> TestClient:
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    service = ControlService(settings, http_port=None)
    audit = SimpleNamespace(record=lambda *a, **k: None)
    return TestClient(create_app(service, TokenStore(settings), (), audit), raise_server_exceptions=False)


def test_status_page_files_are_served_without_a_token_with_a_strict_policy(client: TestClient):
    page = client.get("/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    script = client.get("/status/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert client.get("/status/app.css").status_code == 200
    # data reaches the page only as text, and the token only as a bearer header
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", script.text)
    assert "sessionStorage" in script.text and "localStorage" not in script.text and "cookie" not in script.text
    assert "<script>" not in page.text and not re.search(r"\son[a-z]+\s*=", page.text)  # no inline code


def test_new_routes_need_a_viewer_and_answer_json(client: TestClient):
    for path in ("/v1/events", "/v1/prometheus/targets"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}).status_code == 200
    bad = client.get("/v1/events?limit=0", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "limit"


def test_elasticity_metrics_backlog_scale_events_and_preemptions():
    from sie.control.reconcile.autoscaler import ScaleDecision

    metrics = ControlMetrics()
    up = ScaleDecision(3, "up", "1 -> 3", NOW, NOW, NOW, lag=12_000)
    events = [SimpleNamespace(value={"kind": "scaled_up", "model": "paced", "replica_id": None}),
              SimpleNamespace(value={"kind": "preempted", "model": "bulk", "replica_id": "bulk-1"})]
    plan = SimpleNamespace(unplaced={}, preempted={"bulk-1": SimpleNamespace(victim_priority="P2", by_priority="P0")})
    report = SimpleNamespace(durations={}, leader=True, guard=None, skipped=None, planned=None, checked=False, mismatched=0, plan=plan, errors={},
                             statuses={"paced": _status("paced", [ReplicaState.READY] * 3)},
                             of=lambda topic: events if topic == "events" else [], decisions={"paced": up})
    snap = SimpleNamespace(specs=report.statuses, nodes={}, node_online=lambda *a: True)
    metrics.observe(report, snap, NOW, 10)
    text = generate_latest(metrics.registry).decode()
    assert 'sie_autoscale_lag_records{model_id="paced"} 12000.0' in text
    assert 'sie_autoscale_events_total{action="up",model_id="paced"} 1.0' in text
    assert 'sie_control_preemptions_total{by_priority="P0",victim_priority="P2"} 1.0' in text
    # the model is no longer autoscaled: its backlog series goes (a counter of past events stays)
    metrics.observe(SimpleNamespace(**{**vars(report), "decisions": {}, "plan": None}), snap, NOW, 10)
    assert "sie_autoscale_lag_records{" not in generate_latest(metrics.registry).decode()


def test_repeats_interleaved_with_other_events_are_one_row_each_at_their_latest_time():
    """Issue 28.7: as `kubectl describe` does, an event said again and again is one row with a count and its
    first and last time, even when others come in between (a flapping pair showed as a screenful)."""
    state = ClusterState()
    base = {"model": "m", "replica_id": None, "node": None}
    for i, (kind, detail) in enumerate([("scale_blocked", "no room: back to 0"), ("unschedulable", "needs 2 cpu"),
                                        ("scale_blocked", "no room: back to 0"), ("unschedulable", "needs 2 cpu"),
                                        ("scale_blocked", "no room: back to 0"), ("placed", "m-0 placed on a")]):
        state.apply_event({**base, "ts_ms": 1000 * (i + 1), "kind": kind, "detail": detail}, (0, i))
    rows = event_rows(state.snapshot().events, 10)
    assert [(r["kind"], r["count"], r["first_ts_ms"], r["ts_ms"]) for r in rows] == [
        ("unschedulable", 2, 2000, 4000), ("scale_blocked", 3, 1000, 5000), ("placed", 1, 6000, 6000)]
    assert [r["kind"] for r in event_rows(state.snapshot().events, 2)] == ["scale_blocked", "placed"]


def test_the_heap_keeper_freezes_after_the_first_acting_pass_and_then_once_a_period(monkeypatch):
    import gc

    from sie.control.service import HeapKeeper

    calls: list[str] = []
    for name in ("unfreeze", "collect", "freeze"):
        monkeypatch.setattr(gc, name, lambda *a, _n=name: calls.append(_n))
    now = [0.0]
    keeper = HeapKeeper(every_s=600.0, clock=lambda: now[0])
    keeper.after_pass(acted=False)
    assert calls == []  # nothing loaded yet
    keeper.after_pass(acted=True)
    assert calls == ["unfreeze", "collect", "freeze"]
    now[0] = 599.0
    keeper.after_pass(acted=True)
    assert len(calls) == 3
    now[0] = 600.0
    keeper.after_pass(acted=True)
    assert calls[3:] == ["unfreeze", "collect", "freeze"]
