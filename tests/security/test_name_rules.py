"""Every name rule matches the WHOLE name (issue 37, item 7).

``re.match`` with ``^...$`` lets a trailing newline through (Python's ``$`` also matches before a final ``\\n``):
a model ``churn\\n`` printed like ``churn`` and could be neither shown nor deleted through the API.  Each rule is
checked with the newline, and a source check keeps ``.match`` off every anchored pattern in the packages that
decode names from data.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.kernel.errors import ConfigError, SpecError
from sie.kernel.names import Names, check_instance, check_model_name, check_node_name, check_replica_id
from sie.schemas.spec import load

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sie", "schemas", "streams", "control", "workers", "connectors", "k8s")


def _refused(check: Callable[[str], Any], value: str) -> bool:
    try:
        result = check(value)
    except (ConfigError, ValueError):
        return True
    return result is not None and result is not value and result is not False


CHECKS: dict[str, Callable[[str], Any]] = {
    "model name": check_model_name,
    "replica id": check_replica_id,
    "node name": check_node_name,
    "instance": check_instance,
    "data topic": lambda t: Names().data_topic_problem("churn", t),
}


@pytest.mark.parametrize("rule", sorted(CHECKS))
def test_a_trailing_newline_never_passes_a_name_rule(rule: str):
    check = CHECKS[rule]
    good = {"model name": "churn", "replica id": "churn-0", "instance": "churn-0",
            "data topic": "orders.scored", "node name": "gpu-node-7.example.internal"}[rule]
    assert not _refused(check, good), f"{rule}: {good!r} must pass"
    for bad in (good + "\n", good + "\r\n", "\n" + good):
        assert _refused(check, bad), f"{rule}: {bad!r} passed"


def _seed() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "fraud-scorer.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("where", [("metadata", "name"), ("spec", "model", "name"), ("spec", "model", "version"),
                                   ("spec", "serviceType")])
def test_the_spec_parser_refuses_a_name_ending_in_a_newline_naming_the_field(where: tuple[str, ...]):
    doc = _seed()
    load(copy.deepcopy(doc), origin="t", base_dir=ROOT / "examples")  # the seed itself passes
    target = doc
    for part in where[:-1]:
        target = target[part]
    target[where[-1]] = str(target[where[-1]]) + "\n"
    if where[-1] == "name":  # metadata.name and model.name must agree; both get the newline
        doc["metadata"]["name"] = doc["spec"]["model"]["name"] = target[where[-1]]
    with pytest.raises(SpecError) as refused:
        load(doc, origin="t", base_dir=ROOT / "examples")
    assert where[-1] in str(refused.value), str(refused.value)


def test_connector_and_backfill_names_refuse_a_trailing_newline():
    from sie.connectors.backfill import check_job_id
    from sie.schemas.connector_spec import parse_connector_spec

    with pytest.raises(ConfigError):
        check_job_id("job-1\n")
    check_job_id("job-1")
    doc = {"apiVersion": "sie.lmsys.org/v1", "kind": "CdcConnector", "metadata": {"name": "orders\n"},
           "spec": {"format": "debezium", "sourceTopic": "cdc", "model": "churn", "tables": ["t"]}}
    with pytest.raises(SpecError, match="name"):
        parse_connector_spec(doc)


def _match_calls_on_anchored_patterns(path: Path) -> list[str]:
    """``X.match(...)`` where X is a module-level ``re.compile("^...$")``, and ``re.match("^...$", ...)``."""
    tree = ast.parse(path.read_text())
    anchored: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "compile"
                and node.value.args and isinstance(node.value.args[0], (ast.Constant,))
                and str(node.value.args[0].value).endswith(("$", "$'", '$"'))):
            anchored.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("match", "search"):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in anchored:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {owner.id}.{node.func.attr}")
            if (isinstance(owner, ast.Name) and owner.id == "re" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).endswith("$")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} re.{node.func.attr}")
    return found


def test_no_anchored_pattern_is_used_with_match_or_search_anywhere():
    found = [hit for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for hit in _match_calls_on_anchored_patterns(path)]
    assert found == [], "use .fullmatch for a whole-name rule (a '$' lets a trailing newline through): " + ", ".join(found)


@pytest.mark.parametrize("node", ["../etc", "a/b", ".hidden", "", "x" * 254, "node a", "ノード"])
def test_a_node_name_that_is_not_a_host_name_is_refused_by_the_agent_and_the_state_reader(node: str):
    """A node name is a Kafka key and a folder under the agent's work directory (``<work-dir>/<node>/``)."""
    from sie.workers.agent.loop import AgentConfig

    with pytest.raises(ConfigError, match=r"sie agent --node: must match"):
        AgentConfig(node=node)
    with pytest.raises(ConfigError, match="nodes record key"):
        check_node_name(node, "nodes record key")
    for good in ("node-a", "ip-10-0-0-7.ec2.internal", "k8s-worker:1"):
        assert AgentConfig(node=good).node == good
