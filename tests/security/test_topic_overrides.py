"""Hole 5: a spec's topic and group overrides (and a connector's request topic) could name SIE's system topics.

``topics.results: <p>.specs``, ``deadLetters: <p>.assignments``, ``kafka_input.group_id: <p>.control`` were
accepted; ``sie acls plan --role scorer -f SPEC`` then granted the scorer Write on specs and assignments, and
ensuring the model's topics flipped compacted system topics to ``cleanup.policy=delete``.  Now the naming module
(``Names.data_topic_problem`` / ``group_problem``) refuses anything under ``<p>.`` but the model's own names, in the
spec policy (CLI, API, control plane, agent, worker), in the ACL planner, in ``ensure_model_topics`` / ``sie topics
ensure`` and for connectors (API, control plane, CDC stage).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sie.cli import cli
from sie.control.reconcile.records import ClusterState
from sie.kernel.acls import ModelScope, plan
from sie.kernel.admin import ensure_model_topics
from sie.kernel.errors import ConfigError
from sie.kernel.names import Names
from sie.kernel.settings import Settings
from sie.schemas.connector_spec import connector_name_problems, parse_connector_spec
from sie.schemas.spec import load
from sie.schemas.spec_policy import SpecPolicy
from tests.support.helpers import EXAMPLES

P = "sie"
RULES = yaml.safe_load((EXAMPLES / "fraud-rules.yaml").read_text())


def _doc(topics: dict[str, str] | None = None, kafka_input: dict[str, str] | None = None) -> dict[str, Any]:
    doc = json.loads(json.dumps(RULES))
    if topics is not None:
        doc["spec"]["topics"] = topics
    if kafka_input is not None:
        doc["spec"]["kafka_input"] = kafka_input
    return doc


EVIL = [
    ({"results": f"{P}.specs"}, None, "spec.topics.results: sie.specs is SIE's system topic"),
    ({"deadLetters": f"{P}.assignments"}, None, "spec.topics.deadLetters: sie.assignments is SIE's system topic"),
    ({"requests": f"{P}.model.other-model.requests"}, None, "spec.topics.requests: sie.model.other-model.requests is in "
                                                           "SIE's own namespace 'sie.'"),
    ({"backfill": f"{P}.control-leader"}, None, "spec.topics.backfill: sie.control-leader is SIE's system topic"),
    (None, {"topic": f"{P}.connectors"}, "spec.topics.requests: sie.connectors is SIE's system topic"),
    (None, {"group_id": f"{P}.control"}, "spec.kafka_input.group_id: sie.control is in SIE's own namespace 'sie.'"),
    (None, {"group_id": f"{P}.agent.node-1"}, "spec.kafka_input.group_id: sie.agent.node-1 is in SIE's own namespace"),
]


@pytest.mark.parametrize(("topics", "kafka_input", "reason"), EVIL)
def test_the_spec_policy_refuses_system_and_foreign_names_with_the_field(topics, kafka_input, reason):
    spec = load(_doc(topics, kafka_input), topic_prefix=P)
    problems = SpecPolicy(topic_prefix=P).check(spec)
    assert any(p.startswith(reason) for p in problems), problems


def test_a_model_owns_one_word_under_its_namespace_but_not_another_models_below_it():
    names = Names(P)
    assert names.data_topic_problem("m", f"{P}.model.m.dead_letters") is None
    assert "in SIE's own namespace" in names.data_topic_problem("m", f"{P}.model.m.v2.requests")  # model m.v2's
    assert "in SIE's own namespace" in names.data_topic_problem("m", f"{P}.model.mx.requests")


def test_own_defaults_and_the_teams_own_topics_pass():
    own = Names(P).model_topics(RULES["metadata"]["name"])
    for topics, kafka_input in (({"results": own.results}, None),
                                ({"requests": "team.orders", "results": "team.scores", "deadLetters": "team.dlq"},
                                 {"group_id": "team-scorer"})):
        assert SpecPolicy(topic_prefix=P).check(load(_doc(topics, kafka_input), topic_prefix=P)) == []


@pytest.mark.parametrize(("topics", "kafka_input", "reason"), EVIL)
def test_the_acl_planner_never_grants_a_system_topic_for_a_crafted_spec(topics, kafka_input, reason):
    spec = load(_doc(topics, kafka_input), topic_prefix=P)
    for role in ("scorer", "backfill", "producer"):
        with pytest.raises(ConfigError, match="refusing to plan ACLs"):
            plan(Names(P), role, "p", models=[ModelScope.of_spec(spec)])


def test_the_planners_last_check_holds_even_for_scopes_built_by_hand():
    names = Names(P)
    scope = ModelScope("m", names.model_topics("m").requests, f"{P}.specs", f"{P}.model.m.dlq", f"{P}.model.m.backfill",
                       names.scorer_group("m"))
    with pytest.raises(ConfigError, match=r"m: topics.results: sie.specs is SIE's system topic"):
        plan(names, "scorer", "p", models=[scope])
    with pytest.raises(ConfigError, match=r"--source-topic sie.assignments: SIE's system topic"):
        plan(names, "cdc", "p", connector="c", source_topics=[f"{P}.assignments"],
             models=[ModelScope.default(names, "m")])
    granted = plan(names, "scorer", "p")  # the cluster-wide plan: PREFIXED <p>.model. plus rollouts read only
    assert {(r.name, r.operation) for r in granted if names.is_system_topic(r.name)} == {(f"{P}.rollouts", "read")}


def test_the_acls_cli_refuses_a_crafted_spec(tmp_path: Path):
    spec_file = tmp_path / "evil.yaml"
    spec_file.write_text(yaml.safe_dump(_doc({"results": f"{P}.specs", "deadLetters": f"{P}.assignments"})))
    result = CliRunner().invoke(cli, ["acls", "plan", "--role", "scorer", "--principal", "s", "-f", str(spec_file)])
    said = result.output + str(result.exception)  # sie's main() prints a SieError as one `error:` line
    assert result.exit_code != 0 and "WRITE" not in result.output
    assert "sie.specs is SIE's system topic" in said and "sie.assignments" in said


def test_ensuring_a_system_topic_as_a_models_topic_is_refused_before_kafka_is_asked(tmp_path: Path):
    nowhere = Settings(bootstrap_servers="127.0.0.1:1", cache_dir=tmp_path)  # nothing listens: a refusal, no timeout
    with pytest.raises(ConfigError, match=r"sie.specs: SIE's system topic\(s\), not a model's data topics"):
        ensure_model_topics(nowhere, [f"{P}.model.m.requests", f"{P}.specs"], 1)
    spec_file = tmp_path / "evil.yaml"
    spec_file.write_text(yaml.safe_dump(_doc({"deadLetters": f"{P}.assignments"})))
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "topics", "ensure", "-f", str(spec_file)])
    assert result.exit_code != 0 and "sie.assignments: SIE's system topic" in str(result.exception)


def _connector(**overrides: Any) -> Any:
    return parse_connector_spec({"name": "orders", "format": "debezium-json", "source_topic": "dbz.shop.orders",
                                 "model": "fraud-rules", "tables": ["shop.orders"], **overrides})


def test_a_connector_may_not_feed_a_system_topic_or_another_models():
    assert connector_name_problems(_connector(), P) == []
    assert connector_name_problems(_connector(request_topic=f"{P}.model.fraud-rules.requests"), P) == []
    (specs,) = connector_name_problems(_connector(request_topic=f"{P}.specs"), P)
    assert specs.startswith("connector.requestTopic: sie.specs is SIE's system topic")
    (other,) = connector_name_problems(_connector(request_topic=f"{P}.model.other.requests"), P)
    assert "in SIE's own namespace" in other
    (source,) = connector_name_problems(_connector(source_topic=f"{P}.assignments"), P)
    assert source.startswith("connector.sourceTopic: sie.assignments is SIE's system topic")


def test_the_cdc_stage_refuses_a_replica_document_naming_a_system_topic(tmp_path: Path):
    from sie.connectors.cdc_stage import CdcStage, CdcStageConfig

    config = CdcStageConfig(settings=Settings(cache_dir=tmp_path), connector=_connector(), instance="i-0",
                            request_topic=f"{P}.specs")
    with pytest.raises(ConfigError, match=r"connector 'orders' refused: request_topic: sie.specs is SIE's system topic"):
        CdcStage(config)


def test_the_control_plane_keeps_crafted_specs_and_connectors_off_its_desired_state(tmp_path: Path):
    from sie.schemas.connector_store import connector_record

    state = ClusterState(spec_policy=SpecPolicy.from_settings(Settings(cache_dir=tmp_path)))
    evil = load(_doc({"results": f"{P}.specs"}), topic_prefix=P)
    state.apply_spec(evil.name, {"spec_json": json.dumps(evil.to_document()), "deleted": False})
    assert evil.name not in state.specs
    assert "spec.topics.results: sie.specs is SIE's system topic" in state.spec_errors[evil.name]
    state.apply_connector("orders", connector_record(_connector(request_topic=f"{P}.assignments"), False, 1))
    assert "orders" not in state.connectors
    assert state.connector_errors["orders"].startswith("connector refused: connector.requestTopic: sie.assignments")
