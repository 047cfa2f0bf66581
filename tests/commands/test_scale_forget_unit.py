"""`sie scale` and `sie node forget` before Kafka (issue 38, items 2 and 3): the rule that turns a scale request into
the applied spec with another count, and what the API and the CLI refuse (with the numbers and the fix) before
anything is published.  The accepted paths run end to end in tests/test_day_two_e2e.py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from sie.cli import cli
from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from sie.schemas.spec_scale import ScaleError, ScaleRequest, describe_change, scale_request, scaled
from tests.control.reconcile.test_control_unit import gpu, heartbeat, register, spec_record
from tests.support.helpers import OPERATOR_TOKEN, with_api_tokens

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def _spec(replicas: int = 2):
    from sie.schemas.spec_store import spec_from_record

    return spec_from_record(spec_record("alpha", 1024, replicas=replicas))


def test_replicas_sets_a_fixed_count_and_bounds_keep_what_is_not_given():
    spec = _spec(2)
    three = scaled(spec, ScaleRequest(replicas=3))
    assert (three.sla.min_replicas, three.sla.max_replicas) == (3, 3)
    assert describe_change(spec, three) == "replicas 2 -> 3"
    assert three.model_dump(exclude={"sla"}) == spec.model_dump(exclude={"sla"})  # nothing else changes
    bounds = scaled(spec, ScaleRequest(max_replicas=5))
    assert (bounds.sla.min_replicas, bounds.sla.max_replicas) == (2, 5)
    assert describe_change(spec, bounds) == "min 2 -> 2, max 2 -> 5"
    assert scaled(bounds, ScaleRequest(min_replicas=0)).sla.min_replicas == 0


@pytest.mark.parametrize(("replicas", "lo", "hi", "says"), [
    (None, None, None, "say how many"),
    (2, 1, None, "not both"),
    (0, None, None, "greater than or equal to 1"),
    (None, -1, None, "greater than or equal to 0"),
])
def test_a_request_that_says_nothing_or_contradicts_itself_is_refused(replicas, lo, hi, says):
    with pytest.raises(ScaleError, match=says):
        scale_request(replicas, lo, hi)


def test_min_above_max_names_both_numbers_and_the_applied_ones():
    with pytest.raises(ScaleError, match=r"alpha: cannot scale to min 4, max 2 \(applied: min 2, max 2\)"):
        scaled(_spec(2), ScaleRequest(min_replicas=4))


@pytest.fixture()
def api(tmp_path: Path):
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    service = ControlService(settings, http_port=None)
    client = TestClient(create_app(service, TokenStore(settings), ()), raise_server_exceptions=False)
    return client, service


def _post(client: TestClient, path: str, body: object) -> tuple[int, dict]:
    answer = client.post(path, content=json.dumps(body), headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    return answer.status_code, answer.json()


def test_the_scale_route_refuses_an_unknown_model_and_a_bad_body_before_kafka(api):
    client, service = api
    status, body = _post(client, "/v1/models/ghost/scale", {"replicas": 2})
    assert status == 404 and body["error"] == "model 'ghost' is not applied"
    service.state.apply_spec("alpha", spec_record("alpha", 1024, replicas=2))
    status, body = _post(client, "/v1/models/alpha/scale", {"replicas": 2, "min_replicas": 1})
    assert status == 422 and "not both" in json.dumps(body["errors"])
    status, body = _post(client, "/v1/models/alpha/scale", {"min_replicas": 5})
    assert status == 422 and "cannot scale to min 5, max 2" in body["error"]
    status, body = _post(client, "/v1/models/alpha/scale", {"replica": 2})  # a typo is not ignored
    assert status == 422 and "replica" in json.dumps(body["errors"])


def test_the_forget_route_refuses_an_unknown_or_online_node(api):
    client, service = api
    status, body = _post(client, "/v1/nodes/ghost/forget", {})
    assert status == 404 and "node 'ghost' is not registered" in body["error"]
    register(service.state, "node-a", [gpu(0)])
    heartbeat(service.state, "node-a", service.clock(), [gpu(0)])
    status, body = _post(client, "/v1/nodes/node-a/forget", {})
    assert status == 409 and "is online" in body["error"] and "stop its agent first" in body["error"]


def test_the_cli_refuses_before_reading_kafka():
    result = CliRunner().invoke(cli, ["scale", "alpha"], obj=None)
    assert result.exit_code != 0 and "say how many" in (result.output + str(result.exception))
