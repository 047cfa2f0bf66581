"""CDC connectors in the control plane without Kafka: the connectors topic's records in the state, one CPU
replica per connector that is not paused (with what its stage needs of the model), status phases."""

from __future__ import annotations

import json
from typing import Any

from sie.control.reconcile.connectors import connector_status
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState
from sie.schemas.connector_spec import CONNECTOR_KIND, parse_connector_spec
from sie.schemas.connector_store import connector_record
from tests.control.reconcile.test_control_unit import (
    FakeClock,
    FakePublisher,
    heartbeat,
    register,
    report,
    spec_record,
)

TIMEOUT = 6.0
ORDERS = {"name": "orders", "format": "canal-json", "source_topic": "canal.shop.orders", "model": "fraud",
          "tables": ["shop.orders"], "mapping": {"amount": "amount"}}


def _world(paused: bool = False) -> tuple[ClusterState, Controller, FakePublisher, FakeClock]:
    clock, state, publisher = FakeClock(), ClusterState(), FakePublisher()
    register(state, "cpu-1", [])
    heartbeat(state, "cpu-1", clock(), [])
    state.apply_spec("fraud", spec_record("fraud", gpu_mb=0))
    state.apply_connector("orders", connector_record(parse_connector_spec(ORDERS), paused, 1))
    return state, Controller(state, publisher, StaticLeadership()), publisher, clock


def _assigned(publisher: FakePublisher) -> dict[str, Any]:
    return {r["replica_id"]: r for rec in publisher.all("assignments") for r in (rec.value or {}).get("replicas", [])}


def test_a_connector_is_one_cpu_replica_with_what_its_stage_needs() -> None:
    state, controller, publisher, clock = _world()
    controller.reconcile(clock())
    replicas = _assigned(publisher)
    assert set(replicas) == {"fraud-0", "cdc:orders-0"}
    doc = json.loads(replicas["cdc:orders-0"]["spec_json"])
    assert doc["kind"] == CONNECTOR_KIND and doc["connector"]["source_topic"] == "canal.shop.orders"
    fraud = state.snapshot().specs["fraud"]
    assert doc["field_types"] == {f.name: f.type for f in fraud.input_schema.fields}
    assert doc["request_topic"] == fraud.topics.requests
    assert replicas["cdc:orders-0"]["gpu_indices"] == [] and replicas["cdc:orders-0"]["model"] == "cdc:orders"
    status = connector_status("orders", state.snapshot(), controller.last_report.plan, clock(), TIMEOUT)
    assert status is not None and status["phase"] == "Starting" and status["replicas"][0]["node"] == "cpu-1"
    heartbeat(state, "cpu-1", clock.advance(1), [], [report("cdc:orders-0", "READY") | {"model": "cdc:orders"}])
    controller.reconcile(clock())
    status = connector_status("orders", state.snapshot(), controller.last_report.plan, clock(), TIMEOUT)
    assert status["phase"] == "Running" and status["reason"] is None


def test_pausing_removes_the_replica_and_resuming_brings_it_back() -> None:
    state, controller, publisher, clock = _world()
    controller.reconcile(clock())
    spec = parse_connector_spec(ORDERS)
    state.apply_connector("orders", connector_record(spec, True, 2))
    controller.reconcile(clock.advance(1))
    last = publisher.last("assignments")[0].value
    assert [r["replica_id"] for r in last["replicas"]] == ["fraud-0"]
    status = connector_status("orders", state.snapshot(), controller.last_report.plan, clock(), TIMEOUT)
    assert status["phase"] == "Paused" and status["paused"] and status["replicas"] == []
    state.apply_connector("orders", connector_record(spec, False, 3))
    controller.reconcile(clock.advance(1))
    assert "cdc:orders-0" in [r["replica_id"] for r in publisher.last("assignments")[0].value["replicas"]]


def test_a_new_model_schema_restarts_the_connector_with_the_new_types() -> None:
    state, controller, publisher, clock = _world()
    controller.reconcile(clock())
    before = _assigned(publisher)["cdc:orders-0"]
    state.apply_spec("fraud", spec_record("fraud", gpu_mb=0, inputSchema={"fields": [{"name": "amount",
                                                                                       "type": "int"}]}))
    controller.reconcile(clock.advance(1))
    after = _assigned(publisher)["cdc:orders-0"]
    assert json.loads(after["spec_json"])["field_types"] == {"amount": "int"}
    assert after["version"] != before["version"]


def test_an_unreadable_or_deleted_connector() -> None:
    state = ClusterState()
    state.apply_connector("bad", {"name": "bad", "spec_json": "{\"format\": \"nope\"}", "applied_at_ms": 0,
                                  "paused": False, "deleted": False})
    snap = state.snapshot()
    assert "bad" not in snap.connectors and snap.connector_errors["bad"].startswith("connector record unreadable")
    assert connector_status("bad", snap, None, 0.0, TIMEOUT)["phase"] == "Invalid"
    state.apply_connector("bad", None)
    assert connector_status("bad", state.snapshot(), None, 0.0, TIMEOUT) is None
    spec = parse_connector_spec(ORDERS)
    state.apply_connector("orders", connector_record(spec, False, 1))
    state.apply_connector("orders", connector_record(spec, False, 2, deleted=True))
    assert state.snapshot().connectors == {}


def _placed(publisher: FakePublisher) -> list[str]:
    return [r["replica_id"] for r in publisher.last("assignments")[0].value["replicas"]]


def _fail_connector(state: ClusterState, controller: Controller, clock: FakeClock) -> None:
    controller.reconcile(clock())
    heartbeat(state, "cpu-1", clock.advance(1), [], [report("cdc:orders-0", "FAILED", "crashed 3 times: ValueError")])
    controller.reconcile(clock())


def test_a_failed_connector_replica_cools_down_until_the_connector_is_applied_again() -> None:
    state, controller, publisher, clock = _world()
    _fail_connector(state, controller, clock)
    controller.reconcile(clock.advance(1))  # a connector is not a model: its cool-down is not "no longer applied"
    assert _placed(publisher) == ["fraud-0"] and ("cdc:orders-0", "cpu-1") in controller.exclusions
    state.apply_connector("orders", connector_record(parse_connector_spec(ORDERS), False,
                                                     int(clock.advance(5) * 1000)))  # the operator's fix
    controller.reconcile(clock())
    assert sorted(_placed(publisher)) == ["cdc:orders-0", "fraud-0"] and controller.exclusions == {}
    cleared = [e.value for e in publisher.all("events") if e.value["kind"] == "cooldown_cleared"]
    assert len(cleared) == 1 and "connector orders applied after the failure" in cleared[0]["detail"]


def test_a_deleted_connector_forgets_its_cooldown() -> None:
    state, controller, publisher, clock = _world()
    _fail_connector(state, controller, clock)
    state.apply_connector("orders", None)
    controller.reconcile(clock.advance(1))
    assert controller.exclusions == {}
    cleared = [e.value for e in publisher.all("events") if e.value["kind"] == "cooldown_cleared"]
    assert "the connector is no longer applied" in cleared[0]["detail"]
