"""The capability table of docs/security.md, asserted.

* The W/R cells of every system topic and Kafka role ARE what ``sie acls plan`` grants (the doc cannot drift).
* On the real broker, a principal holding only Write on a control topic writes malicious records there, and each
  ends as a refusal naming its reason (a spec or connector error in the control plane's state, a FAILED replica
  with the reason on ``replica-status``): no process starts, no file lands outside the agent's work directory, no
  URL is fetched, no system topic's config changes, the readers keep running.  (Artifacts: test_manifests.py;
  rollouts: test_rollout_records.py; the secured broker: tests/infra/test_kafka_secure.py.)
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from sie.control.reconcile.feeder import STATE_TOPICS, StateFeeder
from sie.control.reconcile.records import ClusterState
from sie.kernel.acls import ModelScope, plan
from sie.kernel.admin import ensure_topics, topic_configs
from sie.kernel.names import SYSTEM_TOPICS, Names
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.connector_spec import parse_connector_spec
from sie.schemas.connector_store import publish_connector
from sie.schemas.spec import load
from sie.schemas.spec_policy import SpecPolicy
from sie.schemas.spec_store import publish_spec
from sie.workers.agent import AgentConfig
from tests.security.http_stub import StubServer
from tests.support.helpers import REPO_ROOT, TopicTail, wait_until
from tests.support.llm_fixtures import llm_spec_doc
from tests.workers.test_agent_kafka import publish_assignment, run_agent

DOC = REPO_ROOT / "docs" / "security.md"
KAFKA_ROLES = ("scorer", "agent", "control", "connector", "backfill", "producer", "consumer")


def capability_table() -> dict[str, dict[str, str]]:
    """``{system topic suffix: {role: "W" | "R" | "-"}}`` from the "### System topics" table of docs/security.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### System topics"):text.index("### Data topics and groups")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        table[cells[0].strip("`")] = dict(zip(KAFKA_ROLES, cells[1:1 + len(KAFKA_ROLES)]))
    return table


def planned(names: Names, role: str) -> dict[str, set[str]]:
    """The operations ``role``'s plan grants on each system topic (suffix -> operations)."""
    model = [ModelScope.default(names, "m")]
    scope: dict[str, Any] = {"connector": {"connector": "c", "source_topics": ["team.src"], "models": model},
                             "backfill": {"models": model}}.get(role, {})
    out: dict[str, set[str]] = {}
    for rule in plan(names, "cdc" if role == "connector" else role, "p", **scope):
        if rule.resource == "topic" and names.is_system_topic(rule.name):
            out.setdefault(rule.name.split(".", 1)[1], set()).add(rule.operation)
    return out


def test_the_capability_table_is_exactly_what_the_acl_planner_grants():
    table = capability_table()
    assert set(table) == set(SYSTEM_TOPICS)
    names = Names("p")
    for role in KAFKA_ROLES:
        ops = planned(names, role)
        for suffix in SYSTEM_TOPICS:
            cell = table[suffix][role]
            granted = ops.get(suffix, set())
            expected = {"W": "write" in granted, "R": "read" in granted and "write" not in granted,
                        "-": not granted & {"read", "write"}}
            assert cell in expected and expected[cell], f"{suffix} / {role}: the doc says {cell}, the plan {granted}"


def test_the_topics_the_control_plane_waits_for_at_start_are_visible_to_its_principal():
    """``sie control --no-ensure-topics`` (the chart's) waits until its topics exist; on a cluster with ACLs a topic
    its principal may not describe looks missing, so it must wait only for what ``plan(control)`` lets it see.  It
    waited for every system topic, ``backfill-plans`` among them, and the chart's control pod never became Ready
    on the secured broker (tests/k8s/test_pods_secured.py)."""
    from sie.commands.control import awaited_topics

    names = Names("blue")
    visible = {r.name for r in plan(names, "control", "p") if r.resource == "topic" and r.pattern == "literal"}
    awaited = awaited_topics(Settings(topic_prefix="blue"))
    assert set(awaited) <= visible, set(awaited) - visible
    assert {"blue.specs", "blue.assignments", "blue.control-leader"} <= set(awaited)
    assert "blue.backfill-plans" not in awaited


@pytest.fixture()
def cluster(kafka_settings: Settings, tmp_path: Path) -> Any:
    prefix = f"cap{uuid.uuid4().hex[:8]}"
    settings = kafka_settings.with_overrides(topic_prefix=prefix, cache_dir=tmp_path / "cache")
    ensure_topics(settings, system_topics(prefix), replication_factor=1)
    stub = StubServer(200)
    yield settings, stub, tmp_path
    stub.close()


def _hostile_specs(prefix: str, url: str) -> dict[str, Any]:
    """Specs a principal with Write on specs (or assignments) could write, each refused for one named reason."""
    rules = load(REPO_ROOT / "examples" / "fraud-rules.yaml", topic_prefix=prefix).to_document()
    own = {"requests": f"{prefix}.model.sysover.requests", "backfill": f"{prefix}.model.sysover.backfill"}
    return {
        "sysover": ({**rules, "name": "sysover", "group_id": f"{prefix}.control",
                     "topics": {**own, "results": f"{prefix}.specs", "dead_letters": f"{prefix}.assignments"}},
                    f"spec.topics.results: {prefix}.specs is SIE's system topic"),
        "abbrev": (load(llm_spec_doc([], name="abbrev", extra_args=["--trust-remote"]),
                        topic_prefix=prefix).to_document(),
                   "'--trust-remote' abbreviates --trust-remote-code"),
        "exfil": (load(llm_spec_doc([url + "/collect"], name="exfil"), topic_prefix=prefix).to_document(),
                  "is not under this node's LLM endpoints"),
        "popen": ({**rules, "name": "popen", "topics": {k: v.replace("fraud-rules", "popen")
                                                        for k, v in rules["topics"].items()},
                   "group_id": rules["group_id"].replace("fraud-rules", "popen"),
                   "backend": {**rules["backend"], "callable": "subprocess:Popen"}},
                  "spec.backend.callable: module 'subprocess' is not in this node's allowed modules"),
    }


@pytest.mark.kafka
def test_malicious_records_on_the_control_topics_end_as_named_refusals(cluster: Any):
    from confluent_kafka import Producer

    from sie.schemas.spec_models import ModelService

    settings, stub, tmp_path = cluster
    prefix = settings.topic_prefix
    hostile = _hostile_specs(prefix, stub.url)
    compacted = {t.name: t for t in system_topics(prefix) if t.compacted}
    before = {name: topic_configs(settings, name)["cleanup.policy"] for name in compacted}

    # --- Write on <p>.specs and <p>.connectors (what the control principal or an operator token reaches) -----
    for doc, _reason in hostile.values():
        publish_spec(settings, ModelService.from_document(doc), ensure_topic=False)
    connector = parse_connector_spec({"name": "tospecs", "format": "canal-json", "source_topic": "team.orders",
                                      "model": "fraud-rules", "tables": ["shop.*"], "request_topic": f"{prefix}.specs"})
    publish_connector(settings, connector, paused=False)
    producer = Producer(settings.kafka_client_config(**{"acks": "all"}))
    # a record no reader can decode, on every topic the control plane reads (but replica-status: this test's own
    # reader of it, TopicTail, decodes every record)
    for suffix in set(STATE_TOPICS) - {"replica-status"}:
        producer.produce(f"{prefix}.{suffix}", key=b"junk", value=b"\x00\xffnot-avro\n\x1b[2J")
    assert producer.flush(30) == 0

    state = ClusterState(spec_policy=SpecPolicy.from_settings(settings))
    feeder = StateFeeder(settings, state).start()
    try:
        wait_until(lambda: feeder.caught_up.is_set(), timeout=60, message="the control plane's state caught up")
        for name, (_doc, reason) in hostile.items():
            assert name not in state.specs
            assert reason in state.spec_errors.get(name, ""), (name, state.spec_errors.get(name))
        assert "tospecs" not in state.connectors
        assert state.connector_errors["tospecs"].startswith(f"connector refused: connector.requestTopic: {prefix}.specs")
        assert feeder.stale_reason() is None  # the junk was skipped, the feed runs on
    finally:
        feeder.stop()

    # --- Write on <p>.assignments: the same specs, and a replica id that is a path ----------------------
    fine = hostile["popen"][0] | {"name": "fine", "backend": load(REPO_ROOT / "examples" / "fraud-rules.yaml",
                                                                  topic_prefix=prefix).to_document()["backend"]}
    replicas = [{"replica_id": f"{name}-0", "model": name, "version": doc["version"], "gpu_indices": [],
                 "gpu_memory_mb": 0, "spec_json": json.dumps(doc)} for name, (doc, _r) in hostile.items()]
    replicas.append({"replica_id": "../../../escaped", "model": "fine", "version": fine["version"], "gpu_indices": [],
                     "gpu_memory_mb": 0, "spec_json": json.dumps(fine)})
    publish_assignment(settings, "n1", 1, replicas)
    status = TopicTail(settings, f"{prefix}.replica-status")
    work = tmp_path / "work"
    agent, stop, thread = run_agent(AgentConfig(node="n1", simulate_gpus="1xL4-24GB", heartbeat_s=0.5, work_dir=work),
                                    settings)
    try:
        expected = {f"{name}-0": reason for name, (_d, reason) in hostile.items()}
        expected["../../../escaped"] = "replica refused: assignment replica_id: must match"
        for replica_id, reason in expected.items():
            failed = wait_until(lambda: status.find(replica_id=replica_id, state="FAILED"), timeout=30,
                                message=lambda: f"FAILED {replica_id}; seen {status.values()[-3:]}")[0]
            assert reason in failed["reason"], (replica_id, failed["reason"])
            assert [v["state"] for v in status.find(replica_id=replica_id)] == ["PENDING", "FAILED"]  # never started
        assert thread.is_alive() and agent.supervisor.table.current("abbrev-0").handle is None
    finally:
        stop.set()
        thread.join(30)
        status.close()

    assert stub.hits == []  # no URL a spec named was fetched
    assert not (tmp_path / "escaped").exists() and not any(p.name == "escaped" for p in tmp_path.parent.iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._:-]+", p.name) for p in work.rglob("*") if p.is_dir())
    after = {name: topic_configs(settings, name)["cleanup.policy"] for name in compacted}
    assert after == before and set(after.values()) == {"compact"}
