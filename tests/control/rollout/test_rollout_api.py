"""Rollouts on the control API: roles, starting one by applying a new version, steering, standby answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app
from sie.control.rollout.service import Rollouts
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from tests.support.helpers import OPERATOR_TOKEN, VIEWER_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import ALLOWED_MODULES, echo_spec_doc


class Leader:
    is_leader = True
    epoch = 1


class Published:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def publish(self, records) -> None:
        self.records += records


class Audit:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def record(self, principal, action, model, outcome, client) -> None:
        self.events.append((principal.name if principal else None, action, model, outcome))


@pytest.fixture()
def env(tmp_path: Path):
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache", allowed_modules=list(ALLOWED_MODULES)))
    service = ControlService(settings, http_port=None)
    published = Published()
    leadership = Leader()
    from prometheus_client import CollectorRegistry

    service.registry = CollectorRegistry()
    service.rollouts = Rollouts(settings, leadership, published, reader=lambda _s: [], registry=service.registry)
    service.rollouts.tick()  # becomes leader: resumes (nothing stored) and drives
    doc = echo_spec_doc("m")
    from sie.schemas.spec import load

    stable = load(doc)
    service.state.apply_spec("m", {"name": "m", "version": "1.0.0", "spec_json": json.dumps(stable.to_document()),
                                   "applied_at_ms": 1, "deleted": False})
    audit = Audit()
    client = TestClient(create_app(service, TokenStore(settings), (), audit), raise_server_exceptions=False)
    return client, service, published, audit, leadership, doc


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _new_version(doc, version="1.1.0", rollout=None, breaking=False) -> str:
    doc = json.loads(json.dumps(doc))
    doc["spec"]["model"]["version"] = version
    if rollout is not None:
        doc["spec"]["rollout"] = rollout
    if breaking:
        doc["spec"]["outputSchema"]["fields"] = []
    return yaml.safe_dump(doc)


def test_reads_need_a_token_and_writes_need_an_operator(env):
    client, *_rest = env
    assert client.get("/v1/rollouts").status_code == 401
    assert client.get("/v1/rollouts", headers=_auth(VIEWER_TOKEN)).json() == {"rollouts": []}
    r = client.post("/v1/rollouts/m/pause", headers=_auth(VIEWER_TOKEN))
    assert r.status_code == 403
    r = client.post("/v1/rollouts/m/pause", headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 404 and "no rollout" in r.json()["error"]


def test_applying_a_new_version_with_a_rollout_block_starts_a_rollout(env):
    client, service, published, audit, _l, doc = env
    assert service.rollouts.in_progress("m") is None  # no rollout: nothing holds the autoscaler
    r = client.post("/v1/models", content=_new_version(doc, rollout={"steps": [50, 100], "intervalSeconds": 1}),
                    headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 202, r.text
    assert r.json()["rollout"] == "Pending" and r.json()["status"] == "/v1/rollouts/m"
    assert [(x.topic, x.record) for x in published.records] == [("rollouts", "Rollout")]
    service.rollouts.tick()
    got = client.get("/v1/rollouts/m", headers=_auth(VIEWER_TOKEN)).json()
    assert got["phase"] == "Surging" and got["canary_version"] == "1.1.0" and got["steps"] == [50, 100]
    # another version while this one runs: refused
    r = client.post("/v1/models", content=_new_version(doc, "1.2.0"), headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 409 and "rollout is in progress" in r.json()["error"]
    service.rollouts.tick()  # Canary(step 1)
    registry = service.registry
    assert registry.get_sample_value("sie_rollout_canary_weight_ratio", {"model_id": "m"}) == 0.5
    assert registry.get_sample_value("sie_rollout_phase", {"model_id": "m", "phase": "Canary"}) == 1
    assert registry.get_sample_value("sie_rollout_phase", {"model_id": "m", "phase": "Surging"}) == 0
    # the autoscaler's rollout hook: an unfinished rollout holds the model's scaling, and says why
    assert service.rollouts.in_progress("m") == "rollout to 1.1.0: Canary(step 1/2, 50%)"
    r = client.post("/v1/rollouts/m/pause", headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 200 and r.json()["label"].startswith("Paused[Canary(step 1/2, 50%)")
    r = client.post("/v1/rollouts/m/pause", headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 409 and "cannot pause in Paused" in r.json()["error"]
    r = client.post("/v1/rollouts/m/abort", headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 200 and r.json()["phase"] == "RollingBack" and r.json()["weight_percent"] == 0
    r = client.post("/v1/rollouts/m/explode", headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 422
    assert ("operator", "rollout pause", "m", "accepted: Paused[Canary(step 1/2, 50%)]") in audit.events


def test_a_breaking_version_is_refused_before_any_rollout(env):
    client, _s, published, *_rest = env
    r = client.post("/v1/models", content=_new_version(_rest[-1], breaking=True, rollout={}),
                    headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 409 and "schema_incompatible" in r.json()["error"]
    assert published.records == []


def test_a_standby_refuses_writes_naming_the_leader(env):
    client, service, _p, _a, leadership, doc = env
    leadership.is_leader = False
    service.rollouts.tick()
    r = client.post("/v1/models", content=_new_version(doc, rollout={}), headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 503 and "not the leader" in r.json()["error"]


def test_the_cli_steers_a_rollout_through_the_api(env, tmp_path):
    """`sie rollout pause|status|abort` and `sie get rollouts` against a served control API."""
    from click.testing import CliRunner

    from sie.cli import cli
    from sie.control.api.server import ApiServer

    client, service, _p, _a, _l, doc = env
    r = client.post("/v1/models", content=_new_version(doc, rollout={"steps": [50, 100], "intervalSeconds": 1}),
                    headers=_auth(OPERATOR_TOKEN))
    assert r.status_code == 202
    service.rollouts.tick()
    service.rollouts.tick()  # Canary(step 1/2, 50%)
    server = ApiServer(create_app(service, TokenStore(service.settings), (), Audit()), "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{server.port}"
    runner = CliRunner()
    env_vars = {"SIE_API_TOKEN": OPERATOR_TOKEN, "SIE_CONTROL_URL": url}
    try:
        out = runner.invoke(cli, ["rollout", "pause", "m"], env=env_vars)
        assert out.exit_code == 0, out.output
        assert "m: Paused[Canary(step 1/2, 50%)] (canary 50%, epoch 1)" in out.output
        out = runner.invoke(cli, ["get", "rollouts"], env={**env_vars, "SIE_API_TOKEN": VIEWER_TOKEN})
        assert out.exit_code == 0 and "1.0.0" in out.output and "Paused[Canary(step 1/2, 50%)]" in out.output
        out = runner.invoke(cli, ["rollout", "status", "m"], env=env_vars)
        assert out.exit_code == 0 and "Surging -> Canary" in out.output and "paused by operator" in out.output
        import re  # issue 28.4: readable times (UTC ISO, seconds after the start), never raw epoch ms

        assert not re.search(r"\b\d{13}\b", out.output), out.output
        assert re.search(r"^  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z +\+\d+\.\ds +Surging -> Canary", out.output,
                         re.M), out.output
        out = runner.invoke(cli, ["rollout", "abort", "m"], env={**env_vars, "SIE_API_TOKEN": VIEWER_TOKEN})
        assert out.exit_code != 0 and "needs role operator" in str(out.exception)
        out = runner.invoke(cli, ["rollout", "abort", "m"], env=env_vars)
        assert out.exit_code == 0 and "RollingBack" in out.output
    finally:
        server.stop()
