"""The list routes filter and page (``sie.control.api.listing``): ``/v1/replicas?model=&node=&state=``,
``/v1/models?model=&phase=``, ``/v1/nodes?status=``, each with ``?limit=&after=``.  Every answer is checked against
the records it is built from: the filters keep exactly the matching items, the pages cover the list once, in order,
``next`` null at the end; a bad value is a 422 naming the parameter; the unfiltered replica list, built once per
published statuses, follows a changed status."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app
from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from sie.schemas.spec import load
from tests.support.helpers import VIEWER_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import echo_spec_doc

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NOW = 1_796_000_000.0
AUTH = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
#: "a" and "a-1" interleave by replica id ("a-1" < "a-1-0" < "a-10" < "a-2"): the order is the ids', not the models'
MODELS = {"a": 11, "a-1": 2, "fraud": 3, "zeta": 1}
NODES = ("gpu-1", "gpu-2", "cpu-1")
STATES = (ReplicaState.READY, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.FAILED)


def _status(name: str, count: int, phase: str = "Ready", salt: int = 0) -> ModelStatus:
    replicas = tuple(
        ReplicaView(f"{name}-{k}", name, "1.0.0", NODES[(k + salt) % 3] if k % 5 != 4 else None, (), 0,
                    STATES[(k + salt) % 4] if k % 5 != 4 else ReplicaState.UNSCHEDULABLE, restarts=salt)
        for k in range(count))
    return ModelStatus(name, "1.0.0", "P1", "scoring", phase, None, count, count, replicas, epoch=1)


@pytest.fixture()
def served(tmp_path: Path) -> tuple[TestClient, ControlService]:
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    service = ControlService(settings, http_port=None)
    service.clock = lambda: NOW
    state = service.state
    for node in NODES:
        state.apply_node(node, {"cpu_count": 8, "memory_mb": 1000})
    for node in ("gpu-1", "cpu-1"):  # online; gpu-2 never sent a heartbeat: offline
        state.apply_heartbeat({"node": node, "ts_ms": int(NOW * 1000), "seq": 1, "gpus": [], "replicas": []},
                              seen_at=NOW)
    for name in (*MODELS, "pending-only"):
        state.specs[name] = load(echo_spec_doc(name), origin="test", topic_prefix=settings.topic_prefix)
    state.spec_errors["broken"] = "spec.sla: unknown field"
    phases = {"a": "Ready", "a-1": "Degraded", "fraud": "Progressing", "zeta": "Ready"}
    service.controller.statuses = {n: _status(n, c, phases[n]) for n, c in MODELS.items()}
    service.rollouts = SimpleNamespace(list=lambda: [], last_error=None)
    client = TestClient(create_app(service, TokenStore(settings), (), SimpleNamespace(record=print)),
                        raise_server_exceptions=False)
    return client, service


def _get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(path, params={k: v for k, v in params.items() if v is not None}, headers=AUTH)
    assert response.status_code == 200, (path, params, response.text)
    body: dict[str, Any] = response.json()
    return body


def _records(service: ControlService) -> list[dict[str, Any]]:
    rows = [r.to_record() for s in service.controller.statuses.values() for r in s.replicas]
    return sorted(rows, key=lambda r: r["replica_id"])


def _walk(client: TestClient, path: str, field: str, key: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    """Every page of ``path`` with ``filters``, following ``next``; checks each page's shape on the way."""
    items: list[dict[str, Any]] = []
    after = None
    for _ in range(1000):
        page = _get(client, path, limit=limit, after=after, **filters)
        assert len(page[field]) <= limit and set(page) == {field, "next", "total"}
        items += page[field]
        if page["next"] is None:
            assert len(page[field]) <= limit
            return items
        assert page["next"] == page[field][-1][key] and len(page[field]) == limit
        after = page["next"]
    raise AssertionError("the pages never ended")


def test_each_replica_filter_keeps_exactly_the_matching_records(served: tuple[TestClient, ControlService]) -> None:
    client, service = served
    every = _records(service)
    assert [r["replica_id"] for r in every][:4] == ["a-0", "a-1", "a-1-0", "a-1-1"]  # the ids' order
    assert _get(client, "/v1/replicas")["replicas"] == every
    cases: list[dict[str, Any]] = [{"model": "a"}, {"model": "a-1"}, {"model": "nope"}, {"node": "gpu-2"},
                                   {"node": "nowhere"}, {"state": "FAILED"}, {"state": "UNSCHEDULABLE"},
                                   {"model": "a", "node": "gpu-1"}, {"model": "a", "state": "READY"},
                                   {"node": "cpu-1", "state": "STARTING"}, {"model": "a", "node": "gpu-1", "state": "READY"}]
    for filters in cases:
        expected = [r for r in every if all(r[k] == v for k, v in filters.items())]
        answer = _get(client, "/v1/replicas", **filters)
        assert answer == {"replicas": expected}, filters  # no next/total without a limit
        if filters != {"model": "nope"} and filters != {"node": "nowhere"}:
            assert expected, f"the case {filters} should match something"


def test_replica_pages_cover_the_list_once_in_order(served: tuple[TestClient, ControlService]) -> None:
    client, service = served
    every = _records(service)
    for limit in (1, 2, 3, 7, len(every) - 1, len(every), 10_000):
        assert _walk(client, "/v1/replicas", "replicas", "replica_id", limit) == every, limit
    for filters in ({"model": "a"}, {"node": "gpu-1"}, {"state": "READY"}, {"model": "a", "state": "READY"}):
        expected = [r for r in every if all(r[k] == v for k, v in filters.items())]
        assert _walk(client, "/v1/replicas", "replicas", "replica_id", 2, **filters) == expected, filters
    first = _get(client, "/v1/replicas", limit=5)
    assert first["total"] == len(every) and first["next"] == every[4]["replica_id"]
    last = _get(client, "/v1/replicas", limit=5, after=every[-1]["replica_id"])
    assert last == {"replicas": [], "next": None, "total": len(every)}
    # after a name that is not in the list: the items after it in the order (a replica gone between two pages)
    assert _get(client, "/v1/replicas", limit=2, after="a-1-00")["replicas"][0]["replica_id"] == "a-1-1"
    assert _get(client, "/v1/replicas", after="zeta-0")["replicas"] == []  # after, without a limit: the rest


def test_a_model_filter_reads_that_model_s_status_only(served: tuple[TestClient, ControlService]) -> None:
    client, service = served
    lists = client.app.state.lists  # type: ignore[attr-defined]
    assert [r["replica_id"] for r in _get(client, "/v1/replicas", model="fraud")["replicas"]] == \
        ["fraud-0", "fraud-1", "fraud-2"]
    assert lists._index is None  # no record of another model was built
    _get(client, "/v1/replicas", node="gpu-1")
    assert lists._index is not None


def test_the_unfiltered_list_is_built_once_per_statuses_and_follows_a_change(
        served: tuple[TestClient, ControlService]) -> None:
    client, service = served
    lists = client.app.state.lists  # type: ignore[attr-defined]
    first = client.get("/v1/replicas", headers=AUTH).content
    index = lists._index
    assert client.get("/v1/replicas", headers=AUTH).content == first and lists._index is index  # reused
    # a pass publishes a new dict: one model's status replaced, the others the same objects
    statuses = dict(service.controller.statuses)
    statuses["fraud"] = _status("fraud", 4, salt=1)
    service.controller.statuses = statuses
    after_pass = _get(client, "/v1/replicas")["replicas"]
    assert after_pass == _records(service) and len(after_pass) == sum(MODELS.values()) + 1
    assert lists._index is not index
    # the next pass: new status objects for every model, equal replicas but one model's: only its records are new
    kept = lists._index.per_model
    statuses = {n: _status(n, len(s.replicas), s.phase, salt=2 if n == "a" else 0) if n != "fraud" else s
                for n, s in statuses.items()}
    service.controller.statuses = statuses
    assert _get(client, "/v1/replicas")["replicas"] == _records(service)
    now = lists._index.per_model
    assert [n for n in now if now[n][1] is not kept[n][1]] == ["a"]
    # the same dict, changed in place (a controller that updates only the models that changed)
    statuses["zeta"] = _status("zeta", 2, salt=2)
    statuses.pop("a-1")
    assert _get(client, "/v1/replicas")["replicas"] == _records(service)
    assert _get(client, "/v1/replicas", node="gpu-1")["replicas"] == [r for r in _records(service)
                                                                       if r["node"] == "gpu-1"]


def test_models_filter_by_name_and_phase_and_page(served: tuple[TestClient, ControlService],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from sie.control.api.routers import models as routes

    client, service = served
    every = _get(client, "/v1/models")["models"]
    names = [m["name"] for m in every]
    assert names == sorted(names) == ["a", "a-1", "broken", "fraud", "pending-only", "zeta"]
    phases = {m["name"]: m["phase"] for m in every}
    assert phases == {"a": "Ready", "a-1": "Degraded", "broken": "Invalid", "fraud": "Progressing",
                      "pending-only": "Pending", "zeta": "Ready"}
    for phase in ("Ready", "Degraded", "Invalid", "Pending", "Unschedulable"):
        assert _get(client, "/v1/models", phase=phase)["models"] == [m for m in every if m["phase"] == phase], phase
    assert _get(client, "/v1/models", model="fraud")["models"] == [m for m in every if m["name"] == "fraud"]
    assert _get(client, "/v1/models", model="nope")["models"] == []
    for limit in (1, 2, 4, 6, 100):
        assert _walk(client, "/v1/models", "models", "name", limit) == every, limit
    assert _walk(client, "/v1/models", "models", "name", 1, phase="Ready") == [every[0], every[-1]]
    built: list[str] = []
    real = routes.model_json
    monkeypatch.setattr(routes, "model_json", lambda service, name, *a: built.append(name) or real(service, name, *a))
    page = _get(client, "/v1/models", limit=2, after="a-1")
    assert [m["name"] for m in page["models"]] == ["broken", "fraud"] and page["next"] == "fraud"
    assert built == ["broken", "fraud"] and page["total"] == 6  # only the page's models were built


def test_nodes_filter_by_status_and_page(served: tuple[TestClient, ControlService]) -> None:
    client, _service = served
    every = _get(client, "/v1/nodes")["nodes"]
    assert [n["name"] for n in every] == ["cpu-1", "gpu-1", "gpu-2"]
    assert [n["name"] for n in _get(client, "/v1/nodes", status="online")["nodes"]] == ["cpu-1", "gpu-1"]
    assert [n["name"] for n in _get(client, "/v1/nodes", status="offline")["nodes"]] == ["gpu-2"]
    for limit in (1, 2, 3):
        assert _walk(client, "/v1/nodes", "nodes", "name", limit) == every
    assert _walk(client, "/v1/nodes", "nodes", "name", 1, status="online") == every[:2]


@pytest.mark.parametrize(("path", "parameter", "value", "says"), [
    ("/v1/replicas", "limit", "0", "greater than or equal to 1"),
    ("/v1/replicas", "limit", "10001", "less than or equal to 10000"),
    ("/v1/replicas", "limit", "many", "valid integer"),
    ("/v1/replicas", "state", "RUNNING", "'READY'"),
    ("/v1/replicas", "model", "Fraud", "lowercase"),
    ("/v1/replicas", "node", "gpu/1", "a node name"),
    ("/v1/replicas", "after", "../etc", "no '/'"),
    ("/v1/models", "phase", "ready", "'Ready'"),
    ("/v1/models", "model", "-x", "start with a letter or digit"),
    ("/v1/models", "after", "A" * 201, "lowercase"),
    ("/v1/models", "limit", "-1", "greater than or equal to 1"),
    ("/v1/nodes", "status", "up", "'online' or 'offline'"),
    ("/v1/nodes", "after", ".hidden", "a node name"),
    ("/v1/nodes", "limit", "10001", "less than or equal to 10000"),
])
def test_a_bad_value_is_a_422_naming_the_parameter(served: tuple[TestClient, ControlService], path: str,
                                                  parameter: str, value: str, says: str) -> None:
    client, _service = served
    response = client.get(path, params={parameter: value}, headers=AUTH)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["errors"][0]["field"] == f"query.{parameter}" and says in body["errors"][0]["reason"], body
    assert parameter in body["error"] and says in body["error"], body


def test_the_openapi_document_lists_the_parameters(served: tuple[TestClient, ControlService]) -> None:
    client, _service = served
    paths = client.get("/openapi.json", headers=AUTH).json()["paths"]
    named = {path: {p["name"] for p in paths[path]["get"].get("parameters", ())}
             for path in ("/v1/replicas", "/v1/models", "/v1/nodes")}
    assert named == {"/v1/replicas": {"model", "node", "state", "limit", "after"},
                     "/v1/models": {"model", "phase", "limit", "after"},
                     "/v1/nodes": {"status", "limit", "after"}}


def test_the_cached_answer_is_the_bytes_the_response_model_writes(served: tuple[TestClient, ControlService]) -> None:
    """The unfiltered list is dumped by orjson once per statuses; it must be what pydantic's dump of the response
    model gives (what FastAPI answers for a filtered list): non-ASCII, escapes, control characters, cool-downs."""
    from pydantic import TypeAdapter

    from sie.control.api.views import ReplicaList

    client, service = served
    odd = ReplicaView("odd-0", "odd", "1.0.0-\u00fc", "gpu-1", (0, 3), 81559, ReplicaState.CRASHED,
                      reason='exit 1: "quoted"\n\ttab \\ back \x01\x1f \u2028 \U0001f600 </script>', restarts=7,
                      cooldowns=({"node": "gpu-2", "until_ms": 1_796_000_000_123, "reason": "fa\u00efled"},),
                      other_version="1.1.0 ready", process="pid-1")
    service.controller.statuses = {**service.controller.statuses,
                                   "odd": ModelStatus("odd", "1.0.0", "P1", "scoring", "Degraded", None, 1, 0, (odd,))}
    body = client.get("/v1/replicas", headers=AUTH).content
    adapter = TypeAdapter(ReplicaList)
    assert body == adapter.dump_json(adapter.validate_python({"replicas": _records(service)}))
