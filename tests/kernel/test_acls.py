"""The ACL plan of each role: derived from Names (a prefix change moves every binding), least privilege."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sie.cli import cli
from sie.kernel.acls import PREFIXED, ROLES, ModelScope, plan, principal_of, to_binding
from sie.kernel.errors import ConfigError
from sie.kernel.names import Names


def _scope(names: Names, role: str) -> dict:
    m = [ModelScope.default(names, "fraud")]
    return {
        "scorer": {"models": m}, "agent": {"nodes": ["n1"]}, "control": {}, "producer": {"models": m},
        "cdc": {"connector": "orders", "source_topics": ["canal.shop.orders"], "models": m},
        "backfill": {"models": m, "job": "j1"}, "consumer": {"models": m},
    }[role]


@pytest.mark.parametrize("role", ROLES)
def test_every_name_comes_from_the_prefix(role: str) -> None:
    for prefix in ("sie", "blue"):
        names = Names(prefix)
        rules = plan(names, role, "svc", **_scope(names, role))
        assert rules
        for rule in rules:
            assert rule.principal == "User:svc"
            assert rule.name.startswith(prefix + ".") or rule.name == "canal.shop.orders", rule
            assert rule.operation not in ("create", "alter_configs", "idempotent_write"), rule  # nobody creates


def test_scorer_is_literal_per_model_and_prefixed_cluster_wide() -> None:
    names = Names("sie")
    rules = {(r.operation, r.resource, r.name, r.pattern) for r in plan(names, "scorer", "s", **_scope(names, "scorer"))}
    assert ("read", "topic", "sie.model.fraud.requests", "literal") in rules
    assert ("write", "topic", "sie.model.fraud.results", "literal") in rules
    assert ("write", "topic", "sie.model.fraud.dlq", "literal") in rules
    assert ("read", "group", "sie.scorer.fraud", "literal") in rules
    assert ("write", "transactional_id", "sie.scorer.fraud.", "prefixed") in rules
    assert not any(op == "write" and name.endswith(".requests") for op, _, name, _ in rules)
    assert not any(resource == "cluster" for _, resource, _, _ in rules)
    assert ("read", "topic", "sie.rollouts", "literal") in rules  # the version weights of a rollout
    wide = plan(names, "scorer", "s")
    assert all(r.pattern == PREFIXED for r in wide if r.name != "sie.rollouts")


def test_a_spec_with_its_own_topics_and_group_is_planned_as_written() -> None:
    from sie.schemas.spec import load

    spec = load({"name": "m", "version": "1", "backend": {"type": "python", "callable": "models.fraud.rules:score"},
                 "topics": {"requests": "in.m", "results": "out.m"},
                 "kafka_input": {"topic": "in.m", "group_id": "legacy-group"}})
    rules = {(r.operation, r.name) for r in plan(Names("sie"), "scorer", "s", models=[ModelScope.of_spec(spec)])}
    assert {("read", "in.m"), ("write", "out.m"), ("read", "legacy-group")} <= rules


def test_roles_that_need_a_scope_say_which() -> None:
    with pytest.raises(ConfigError, match="--connector"):
        plan(Names(), "cdc", "c")
    with pytest.raises(ConfigError, match="--model"):
        plan(Names(), "backfill", "b")
    with pytest.raises(ConfigError, match="role: one of"):
        plan(Names(), "root", "x")


def test_principals_and_bindings() -> None:
    from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    assert principal_of("svc") == "User:svc"
    assert principal_of("User:CN=sie-scorer,O=acme") == "User:CN=sie-scorer,O=acme"
    rule = plan(Names(), "scorer", "s", models=[ModelScope.default(Names(), "fraud")])[-1]
    binding = to_binding(rule)
    assert (binding.restype, binding.resource_pattern_type, binding.operation, binding.permission_type) == (
        ResourceType.TRANSACTIONAL_ID, ResourcePatternType.PREFIXED, AclOperation.WRITE, AclPermissionType.ALLOW)


def test_sie_acls_plan_prints_the_bindings() -> None:
    result = CliRunner().invoke(cli, ["acls", "plan", "--role", "agent", "--principal", "sie-agent", "--node", "n1"],
                                env={"SIE_TOPIC_PREFIX": "blue"})
    assert result.exit_code == 0, result.output
    assert "User:sie-agent" in result.output and "blue.assignments" in result.output and "blue.agent.n1" in result.output
