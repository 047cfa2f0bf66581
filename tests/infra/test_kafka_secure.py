"""SIE on a secured broker (SASL_SSL + SCRAM-SHA-512 + TLS, StandardAuthorizer, nothing allowed without an ACL).

Every component runs as its own principal holding only the ACLs ``sie acls plan`` gives its role:
the exactly-once scorer end to end; a scorer missing one ACL stops at once with an error naming the
permission; the control plane and an agent whose worker runs as the scorer principal; a CDC stage; a
backfill.  Each test makes its own users and prefix, so they share one broker.  Secrets never show in
logs, errors, ``--help`` or ``sie kafka status``.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from sie.kernel.acls import ModelScope, apply, plan
from sie.kernel.admin import admin_client, ensure_model_topics, ensure_topics
from sie.kernel.authz import NotAuthenticated, NotAuthorized
from sie.kernel.names import Names
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.spec import load
from sie.schemas.spec_policy import SpecPolicy
from tests.security.test_worker_uid import node_dir  # noqa: F401  (a fixture)
from tests.support.helpers import EXAMPLES, OPERATOR_TOKEN, consume_all, wait_until, with_api_tokens
from tests.support.scorer_fixtures import ScorerThread

pytestmark = [pytest.mark.kafka, pytest.mark.secure_kafka]

RULES = EXAMPLES / "fraud-rules.yaml"
EXAMPLE_INPUT = {"amount": 950.0, "merchant_risk": 0.8, "hour": 3, "account_age_days": 5, "is_foreign": True,
                 "tx_count_24h": 9}


class Principal:
    """A SCRAM user made for one test, with the ACLs of one role."""

    def __init__(self, kafka: Any, prefix: str, role: str, **scope: Any) -> None:
        self.name = f"{role}-{uuid.uuid4().hex[:8]}"
        self.password_file = kafka.create_user(self.name)
        self.settings = kafka.settings_for_clients(self.name).with_overrides(topic_prefix=prefix)
        self.rules = plan(self.settings.names, role, self.name, **scope)

    def grant(self, admin: Settings, without: Any = None) -> None:
        rules = [r for r in self.rules if without is None or not without(r)]
        assert len(rules) < len(self.rules) or without is None, "the rule to leave out is not in the plan"
        apply(admin_client(admin), rules)

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()


@pytest.fixture()
def world(secure_kafka: Any) -> dict[str, Any]:
    """A fresh cluster prefix, its topics (made by the admin) and the fraud-rules model under it."""
    prefix = f"sec{uuid.uuid4().hex[:8]}"
    admin = secure_kafka.settings_for_clients().with_overrides(topic_prefix=prefix)
    ensure_topics(admin, system_topics(prefix))
    spec = load(RULES, topic_prefix=prefix)
    t = spec.topics
    ensure_model_topics(admin, [t.requests, t.results, t.dead_letters, t.backfill, Names.backfill_dead_letter_topic(t.backfill)], 2)
    return {"kafka": secure_kafka, "prefix": prefix, "admin": admin, "spec": spec}


def _rules_backend(spec: Any, settings: Settings) -> Any:
    from sie.workers.backends import backend_config_from_spec, create_backend

    policy = SpecPolicy.from_settings(settings)
    backend = create_backend(backend_config_from_spec(policy.enforce(spec), policy))
    backend.load()
    return backend


def _produce(settings: Settings, topic: str, n: int, tag: str) -> list[str]:
    from confluent_kafka import Producer

    producer = Producer(settings.kafka_client_config(**{"enable.idempotence": True, "acks": "all"}))
    ids = [f"{tag}-{i}" for i in range(n)]
    errors: list[str] = []
    for i, rid in enumerate(ids):
        producer.produce(topic, orjson.dumps({"id": rid, "inputs": {**EXAMPLE_INPUT, "amount": 10.0 + i}}),
                         key=rid.encode(), on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not errors, errors[:3]
    return ids


def _secrets(kafka: Any, *extra: Principal) -> list[str]:
    from sie.infra.kafka.security import USERS

    return [kafka.security.password(u) for u in USERS] + [p.password for p in extra]


def test_exactly_once_scorer_end_to_end_under_its_least_privilege_principal(world: dict[str, Any], capfd: Any,
                                                                           caplog: Any) -> None:
    kafka, admin, spec = world["kafka"], world["admin"], world["spec"]
    scorer = Principal(kafka, world["prefix"], "scorer", models=[ModelScope.of_spec(spec)])
    producer = Principal(kafka, world["prefix"], "producer", models=[ModelScope.of_spec(spec)])
    scorer.grant(admin)
    producer.grant(admin)
    assert {(r.operation, r.resource) for r in scorer.rules} == {
        ("read", "topic"), ("write", "topic"), ("describe_configs", "topic"), ("read", "group"),
        ("write", "transactional_id")}  # nothing on the cluster, no create

    run = ScorerThread(scorer.settings, spec, instance="s0", backend_factory=lambda s: _rules_backend(s, scorer.settings))
    try:
        wait_until(lambda: run.ready.is_set() or run.error, 60, message="scorer ready")
        assert run.error is None, run.error
        ids = _produce(producer.settings, spec.topics.requests, 60, "eos")
        results = consume_all(admin, spec.topics.results, expected=60, timeout=60)
    finally:
        run.close()
    assert run.error is None, run.error
    seen = [json.loads(r.value)["id"] for r in results]
    assert sorted(seen) == sorted(ids), "every request exactly once"
    assert consume_all(admin, spec.topics.dead_letters, timeout=10) == []
    assert run.summary.results == 60 and run.summary.aborts == 0

    # the producer principal may write requests (and read specs to find them), nothing else: reading the results
    # is refused, by name
    from sie.kernel.authz import topic_denied

    denied = topic_denied(admin_client(producer.settings), spec.topics.results,
                          producer.settings.kafka_client_config(), "READ")
    assert denied is not None and re.search(r"may not READ topic 'sec\w+\.model\.fraud-rules\.results'", str(denied))
    out, err = capfd.readouterr()
    text = out + err + caplog.text + repr(scorer.settings) + repr(producer.settings)
    for secret in _secrets(kafka, scorer, producer):
        assert secret not in text


@pytest.mark.parametrize("missing, expected", [
    (lambda r: r.resource == "transactional_id", r"may not WRITE transactional id 'sec\w+\.scorer\.fraud-rules\.s0'"),
    (lambda r: r.resource == "group", r"may not READ group 'sec\w+\.scorer\.fraud-rules'"),
    (lambda r: r.operation == "write" and r.name.endswith(".results"), r"may not WRITE topic 'sec\w+\.model\.fraud-rules\.results'"),
], ids=["transactional-id", "group", "results-topic"])
def test_a_principal_lacking_one_acl_stops_with_the_missing_permission(world: dict[str, Any], missing: Any,
                                                                      expected: str) -> None:
    kafka, admin, spec = world["kafka"], world["admin"], world["spec"]
    scorer = Principal(kafka, world["prefix"], "scorer", models=[ModelScope.of_spec(spec)])
    scorer.grant(admin, without=missing)
    _produce(admin, spec.topics.requests, 5, "denied")
    run = ScorerThread(scorer.settings, spec, instance="s0", backend_factory=lambda s: _rules_backend(s, scorer.settings))
    try:
        wait_until(lambda: not run.thread.is_alive(), 60, message="the scorer to stop on its own")
    finally:
        run.close(raise_error=False)
    elapsed = time.monotonic() - run.started
    assert isinstance(run.error, NotAuthorized), repr(run.error)
    assert f"User:{scorer.name}" in str(run.error)
    import re

    assert re.search(expected, str(run.error)), str(run.error)
    assert elapsed < 45, f"took {elapsed:.0f}s to report a missing ACL"
    assert consume_all(admin, spec.topics.results, timeout=10) == []  # nothing half-written


def test_wrong_password_is_a_clear_error_within_seconds(world: dict[str, Any]) -> None:
    from sie.kernel.admin import wait_for_cluster

    wrong = world["admin"].model_copy(update={"sasl_password_file": None, "sasl_password": "not-the-password"})
    started = time.monotonic()
    with pytest.raises(NotAuthenticated, match="refused the credentials of user 'admin'") as info:
        wait_for_cluster(wrong, timeout=30)
    assert time.monotonic() - started < 10
    assert "not-the-password" not in str(info.value)


def test_control_plane_and_agent_run_as_their_principals(world: dict[str, Any], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The control plane (API write -> specs -> assignment), an agent, and its worker as the scorer principal."""
    import httpx

    from sie.control.reconcile.config import ControlConfig
    from sie.control.service import ControlService
    from sie.workers.agent import Agent, AgentConfig

    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    control = Principal(kafka, prefix, "control")
    agent_p = Principal(kafka, prefix, "agent", nodes=["sn1"])
    scorer = Principal(kafka, prefix, "scorer", models=[ModelScope.of_spec(spec)])
    for p in (control, agent_p, scorer):
        p.grant(admin)
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))  # the model package is installed on this node
    agent_settings = agent_p.settings.model_copy(update={
        "worker_sasl_username": scorer.name, "worker_sasl_password_file": scorer.password_file})
    svc = ControlService(with_api_tokens(control.settings), ControlConfig(reconcile_interval_s=0.3),
                         instance_id="sec-cp", http_port=0).start()
    agent = Agent(AgentConfig(node="sn1", simulate_gpus="1xL4-24GB", heartbeat_s=0.5, work_dir=tmp_path), agent_settings)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{svc.http_port}"
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", headers=auth).json()["role"] == "leader", 60, message="leading")
        answer = httpx.post(f"{url}/v1/models", content=RULES.read_text(), headers=auth)
        assert answer.status_code == 202, answer.text
        wait_until(lambda: (m := httpx.get(f"{url}/v1/models/fraud-rules", headers=auth).json()).get("phase") == "Ready"
                   and m, 90, message=lambda: f"fraud-rules Ready; {httpx.get(f'{url}/v1/models/fraud-rules', headers=auth).json()}")
        ids = _produce(admin, spec.topics.requests, 20, "cp")
        results = consume_all(admin, spec.topics.results, expected=20, timeout=60)
        assert sorted(json.loads(r.value)["id"] for r in results) == sorted(ids)
    finally:
        stop.set()
        thread.join(30)
        svc.stop()
    worker_log = next(tmp_path.rglob("worker.log")).read_text()
    for secret in _secrets(kafka, control, agent_p, scorer):
        assert secret not in worker_log


def test_cdc_stage_and_backfill_run_as_their_principals(world: dict[str, Any]) -> None:
    from sie.connectors.backfill import BackfillConfig, BackfillJob
    from sie.connectors.cdc import load_connector_spec
    from sie.connectors.cdc_stage import CdcStage, CdcStageConfig, field_types_of

    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    # CDC: canal change events -> requests of the model, exactly once, as the cdc principal
    connector = load_connector_spec(EXAMPLES / "cdc" / "orders-to-fraud.yaml")
    source = f"{prefix}-src.shop.orders"
    ensure_model_topics(admin, [source], 1)
    connector = connector.model_copy(update={"name": f"orders-{uuid.uuid4().hex[:6]}", "source_topic": source,
                                             "model": spec.name})
    ensure_model_topics(admin, [admin.names.cdc_dead_letter_topic(connector.name)], 1)
    cdc = Principal(kafka, prefix, "cdc", connector=connector.name, source_topics=[source],
                    models=[ModelScope.of_spec(spec)])
    cdc.grant(admin)
    events = [line for line in (EXAMPLES / "cdc" / "canal-orders.jsonl").read_bytes().splitlines() if line.strip()]
    from confluent_kafka import Producer

    producer = Producer(admin.kafka_client_config())
    for e in events:
        producer.produce(source, e)
    assert producer.flush(10) == 0
    stage = CdcStage(CdcStageConfig(settings=cdc.settings, connector=connector, instance="c0",
                                    field_types=field_types_of(spec), max_wait_ms=10,
                                    request_topic=spec.topics.requests))
    stop = threading.Event()
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", _catch(lambda: stage.run(stop))), daemon=True)
    thread.start()
    try:  # every source record committed (the stage's counters move only after a commit)
        wait_until(lambda: stage.summary().records >= len(events), 60,
                   message=lambda: f"the CDC stage to commit {len(events)} events ({stage.summary().line()})")
    finally:
        stop.set()
        thread.join(30)
    requests = consume_all(admin, spec.topics.requests, timeout=30)  # the stage stopped: this end is final
    assert not isinstance(box.get("r"), BaseException), box.get("r")
    assert requests

    # backfill: re-score the requests topic into the backfill topic, as the backfill principal
    backfill = Principal(kafka, prefix, "backfill", models=[ModelScope.of_spec(spec)])
    backfill.grant(admin)
    from sie.connectors.backfill_plan import parse_bound

    config = BackfillConfig(settings=backfill.settings, spec=spec, job_id=f"bf-{uuid.uuid4().hex[:6]}",
                            start=parse_bound("earliest", "--from"), end=parse_bound("now", "--to"))
    report = BackfillJob(config, progress=lambda _l: None).run(threading.Event(), _rules_backend(spec, backfill.settings))
    out = consume_all(admin, spec.topics.backfill, timeout=30)
    assert report.complete and len(out) == report.scored
    assert report.scored + sum(report.dead_letters.values()) == len(requests)


def _catch(fn: Any) -> Any:
    try:
        return fn()
    except BaseException as exc:
        return exc


def test_secrets_stay_out_of_status_help_plans_and_broker_logs(secure_kafka: Any) -> None:
    from sie.cli import cli
    from sie.commands.kafka import command as kafka_cli

    runner = CliRunner()
    status = runner.invoke(kafka_cli, ["status", "--data-dir", str(secure_kafka.data_dir)], obj=secure_kafka.settings)
    assert status.exit_code == 0, status.output
    assert "secured: SASL_SSL" in status.output
    env = secure_kafka.security.client_env("admin")
    outputs = [status.output]
    for args in (["kafka", "up", "--help"], ["acls", "plan", "--role", "scorer", "--principal", "sie-scorer"],
                 ["token", "--help"], ["--help"]):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    settings = secure_kafka.settings_for_clients()
    outputs += [repr(settings), str(settings), str(settings.model_dump())]
    logs = [p.read_text(errors="replace") for p in secure_kafka.data_dir.rglob("*.log")]
    assert logs, "the broker wrote logs"
    text = "\n".join(outputs + logs)
    for secret in _secrets(secure_kafka):
        assert secret not in text


class _Ran:
    def __init__(self, exit_code: int, output: str) -> None:
        self.exit_code, self.output = exit_code, output


def _cli_as(kafka: Any, principal: Principal | None, prefix: str, args: list[str]) -> _Ran:
    """``sie ARGS`` as a user runs it (``sie.cli.main``: errors as the one line a user sees), with the
    principal's SIE_* variables (paths, no secret) and the prefix."""
    import contextlib
    import io
    import os

    from sie.cli import main

    user = principal.name if principal is not None else "admin"
    env = {**kafka.security.client_env(user), "SIE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "SIE_TOPIC_PREFIX": prefix}
    saved = {k: os.environ.get(k) for k in env}
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return _Ran(code, out.getvalue() + err.getvalue())


def _unreadable_source(world: dict[str, Any]) -> str:
    topic = f"{world['prefix']}-other.orders"
    ensure_model_topics(world["admin"], [topic], 1)
    return topic


@pytest.mark.parametrize("role, args, topic", [
    ("producer", ["tail", "results"], lambda w: w["spec"].topics.results),
    ("producer", ["tail", "dlq"], lambda w: w["spec"].topics.dead_letters),
    ("producer", ["dlq", "redrive"], lambda w: w["spec"].topics.dead_letters),
    ("backfill", ["backfill", "--from", "earliest", "--to", "now", "--source-topic", _unreadable_source],
     _unreadable_source),
], ids=["tail-results", "tail-dlq", "dlq-redrive", "backfill-source"])
def test_a_topic_the_principal_may_not_read_is_named_as_such_not_as_missing(world: dict[str, Any], role: str,
                                                                           args: list[Any], topic: Any) -> None:
    """Issue 28.2: as `sie-producer`, `sie tail results` said 'topic ... does not exist ... nothing was scored
    yet' about a topic that exists: on a cluster with ACLs an undescribable topic looks absent."""
    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    principal = Principal(kafka, prefix, role, models=[ModelScope.of_spec(spec)])
    principal.grant(admin)
    argv = [a(world) if callable(a) else a for a in args] + ["--spec", str(RULES)]
    result = _cli_as(kafka, principal, prefix, argv)
    assert result.exit_code == 1, result.output
    assert f"not authorized: User:{principal.name} may not READ topic '{topic(world)}'" in result.output, \
        result.output
    assert "does not exist" not in result.output
    assert f"--principal {principal.name}" in result.output  # the fix: what to grant, with sie acls plan


def test_a_missing_topic_still_reads_as_missing_on_a_secured_cluster(world: dict[str, Any]) -> None:
    result = _cli_as(world["kafka"], None, f"{world['prefix']}x", ["tail", "results", "--spec", str(RULES)])
    assert result.exit_code == 1
    assert "does not exist" in result.output and "nothing was scored for fraud-rules yet" in result.output


def test_describe_model_names_the_acl_its_traffic_line_lacks(world: dict[str, Any]) -> None:
    """`sie describe model` read the model topics' traffic; as a principal without Read on them it said
    'does not exist yet: nothing was sent'."""
    from sie.schemas.spec_store import publish_spec

    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    publish_spec(admin, spec)
    control = Principal(kafka, prefix, "control")
    control.grant(admin, without=lambda r: r.resource == "topic" and r.name == admin.names.model_topic_prefix)
    result = _cli_as(kafka, control, prefix, ["describe", "model", spec.name])
    assert result.exit_code == 0, result.output
    assert (f"Traffic:     unavailable: not authorized: User:{control.name} may not READ topic "
            f"'{spec.topics.requests}'") in result.output, result.output
    assert "does not exist" not in result.output


def test_the_export_block_of_kafka_up_secure_connects_the_next_command(secure_kafka: Any) -> None:
    """Issue 28.3: the block printed by `sie kafka up --secure` had no SIE_BOOTSTRAP_SERVERS: pasted as is,
    the next command went to 127.0.0.1:9092 (no broker, or a plaintext dev broker)."""
    from sie.commands.kafka import command as kafka_cli

    up = CliRunner().invoke(kafka_cli, ["up", "--secure", "--base-port", str(secure_kafka.layout.base_port),
                                        "--data-dir", str(secure_kafka.data_dir)], obj=secure_kafka.settings)
    assert up.exit_code == 0, up.output
    exports = dict(line.strip().removeprefix("export ").split("=", 1) for line in up.output.splitlines()
                   if line.strip().startswith("export "))
    assert exports["SIE_BOOTSTRAP_SERVERS"] == secure_kafka.bootstrap_servers
    assert not any("password" in v.lower() and not k.endswith("_FILE") for k, v in exports.items())
    import os

    saved = {k: os.environ.get(k) for k in exports}
    os.environ.update(exports)  # pasted into the shell as printed
    try:
        settings = Settings()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    from sie.kernel.admin import wait_for_cluster

    assert wait_for_cluster(settings, timeout=20).brokers, "the next command reaches the secured broker as admin"


def test_each_principal_writes_exactly_its_capability_cells_and_a_crafted_spec_grants_the_scorer_nothing(
        world: dict[str, Any]) -> None:
    """docs/security.md's capability table on the secured broker: every role's principal, holding exactly the plan
    of its role, tries to write every system topic; exactly the table's W cells succeed.  A spec crafted to name
    system topics as its results, dead letters and group gets no plan at all, and no topic is ensured for it."""
    from confluent_kafka import Producer

    from sie.kernel.admin import topic_configs
    from sie.kernel.errors import ConfigError
    from sie.kernel.names import SYSTEM_TOPICS
    from sie.schemas.spec_models import SpecTopics
    from tests.security.test_capabilities import KAFKA_ROLES, capability_table

    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    crafted = spec.model_copy(update={
        "topics": SpecTopics(requests=spec.topics.requests, results=f"{prefix}.specs",
                             dead_letters=f"{prefix}.assignments", backfill=spec.topics.backfill),
        "group_id": f"{prefix}.control"})
    with pytest.raises(ConfigError, match=rf"refusing to plan ACLs: fraud-rules: topics.results: {prefix}.specs is "
                                          "SIE's system topic"):
        plan(admin.names, "scorer", "sie-scorer", models=[ModelScope.of_spec(crafted)])
    with pytest.raises(ConfigError, match="SIE's system topic"):
        ensure_model_topics(admin, [crafted.topics.results, crafted.topics.dead_letters], 2)

    table = capability_table()
    model = [ModelScope.of_spec(spec)]
    scopes: dict[str, dict[str, Any]] = {"scorer": {"models": model}, "connector": {
        "connector": "orders", "source_topics": ["team.orders"], "models": model}, "backfill": {"models": model},
        "producer": {"models": model}}
    wrote: dict[str, set[str]] = {}
    for role in KAFKA_ROLES:
        principal = Principal(kafka, prefix, "cdc" if role == "connector" else role, **scopes.get(role, {}))
        principal.grant(admin)
        producer = Producer(principal.settings.kafka_client_config(**{"acks": "all", "message.timeout.ms": 20_000}))
        delivered: dict[str, Any] = {}
        for suffix in SYSTEM_TOPICS:
            producer.produce(f"{prefix}.{suffix}", key=b"capability-probe", value=b"probe",
                             on_delivery=lambda err, _m, s=suffix: delivered.__setitem__(s, err))
        assert producer.flush(60) == 0
        assert set(delivered) == set(SYSTEM_TOPICS)
        refused = {s: e for s, e in delivered.items() if e is not None}
        assert all("TOPIC_AUTHORIZATION_FAILED" in e.name() for e in refused.values()), refused
        wrote[role] = {s for s, e in delivered.items() if e is None}
    assert wrote == {role: {s for s in SYSTEM_TOPICS if table[s][role] == "W"} for role in KAFKA_ROLES}
    assert wrote["scorer"] == set()
    compacted = [t.name for t in system_topics(prefix) if t.compacted]
    assert {topic_configs(admin, name)["cleanup.policy"] for name in compacted} == {"compact"}


ROLE_COMMANDS = {  # sie.kernel.acls.COMMAND_ROLES: the command each data-path role runs, with --model
    "producer": [["produce", "--model", "{model}", "--file", "{requests}"]],
    "consumer": [["tail", "results", "--model", "{model}"], ["tail", "dlq", "--model", "{model}"]],
    "backfill": [["backfill", "--model", "{model}", "--from", "earliest", "--to", "now"]],
}


@pytest.mark.parametrize("role", sorted(ROLE_COMMANDS))
def test_each_cli_command_works_as_its_role_and_is_refused_as_another_naming_the_grant(
        world: dict[str, Any], role: str, tmp_path: Path) -> None:
    """Issue 38.6: after `sie acls apply --role producer --model churn`, `sie produce --model churn` failed with
    `may not READ topic 'sie.specs'` and a hint that led nowhere.  Each role's plan now covers what its commands
    read and write, and a command run under another role's principal names the role and grant it needs."""
    from sie.kernel.acls import COMMAND_ROLES
    from sie.schemas.spec_store import publish_spec

    kafka, admin, spec, prefix = world["kafka"], world["admin"], world["spec"], world["prefix"]
    publish_spec(admin, spec)
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(json.dumps({"id": f"r{i}", "inputs": EXAMPLE_INPUT}) for i in range(3)) + "\n")
    principal = Principal(kafka, prefix, role, models=[ModelScope.default(admin.names, spec.name)])
    principal.grant(admin)
    for other_role, commands in ROLE_COMMANDS.items():
        for args in commands:
            argv = [a.format(model=spec.name, requests=requests) for a in args]
            result = _cli_as(kafka, principal, prefix, argv)
            command_role = COMMAND_ROLES[f"sie {argv[0]}"]
            assert command_role == other_role
            if other_role == role:
                assert result.exit_code == 0, (argv, result.output)
            else:
                assert result.exit_code == 1, (argv, result.output)
                assert f"not authorized: User:{principal.name}" in result.output, result.output
                assert (f"runs as role {other_role}: an administrator grants it with `sie acls apply --role "
                        f"{other_role} --principal {principal.name} --model {spec.name}") in result.output, \
                    result.output
    if role == "producer":  # what it sent arrived
        assert len(consume_all(admin, spec.topics.requests, expected=3, timeout=30)) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root (CI runs as root)")
def test_on_a_secured_broker_the_worker_authenticates_with_its_copy_and_cannot_read_the_agents_password(
        secure_kafka: Any, node_dir: Path) -> None:  # noqa: F811
    """SASL_SSL with one SCRAM user per role: the agent as the agent principal (its password file 0400, root's),
    its worker as the scorer principal from the copy only the worker uid reads; the model scores requests."""
    import shutil
    import subprocess

    from tests.security.test_worker_uid_e2e import WORKER_UID, _start_agent, _stop, _uid_of, _worker_pid
    from tests.support.helpers import REPO_ROOT, TopicTail, produce_json
    from tests.workers.test_agent_kafka import publish_assignment, replica_assignment

    prefix = f"sec{uuid.uuid4().hex[:8]}"
    admin = secure_kafka.settings_for_clients().with_overrides(topic_prefix=prefix)
    ensure_topics(admin, system_topics(prefix))
    spec = load(REPO_ROOT / "examples" / "fraud-rules.yaml", topic_prefix=prefix)
    t = spec.topics
    ensure_model_topics(admin, [t.requests, t.results, t.dead_letters, t.backfill,
                                Names.backfill_dead_letter_topic(t.backfill)], 2)
    secrets = node_dir / "secrets"
    secrets.mkdir(mode=0o755)
    names: dict[str, str] = {}
    for role, scope in (("agent", {"nodes": ["n1"]}), ("scorer", {"models": [ModelScope.of_spec(spec)]})):
        name = f"{role}-{uuid.uuid4().hex[:8]}"
        shutil.copy(secure_kafka.create_user(name), secrets / role)
        os.chmod(secrets / role, 0o400)
        apply(admin_client(admin), plan(admin.names, role, name, **scope))
        names[role] = name
    ca = node_dir / "ca.crt"  # the broker's CA is public; its data directory is not the workers'
    shutil.copy(admin.ssl_ca_location, ca)
    os.chmod(ca, 0o444)
    agent_settings = secure_kafka.settings_for_clients(names["agent"])
    env = {"SIE_BOOTSTRAP_SERVERS": agent_settings.bootstrap_servers, "SIE_TOPIC_PREFIX": prefix,
           "SIE_SECURITY_PROTOCOL": str(agent_settings.security_protocol),
           "SIE_SASL_MECHANISM": str(agent_settings.sasl_mechanism), "SIE_SSL_CA_LOCATION": str(ca),
           "SIE_CACHE_DIR": str(node_dir / "cache"), "SIE_SASL_USERNAME": names["agent"],
           "SIE_SASL_PASSWORD_FILE": str(secrets / "agent"), "SIE_WORKER_SASL_USERNAME": names["scorer"],
           "SIE_WORKER_SASL_PASSWORD_FILE": str(secrets / "scorer"),
           **{k: v for k, v in agent_settings.to_env().items() if k == "SIE_KAFKA_EXTRA"}}
    doc = spec.to_document()
    status = TopicTail(admin, f"{prefix}.replica-status")
    heartbeats = TopicTail(admin, f"{prefix}.heartbeats")
    work = node_dir / "work"
    agent, log = _start_agent(node_dir, work, env)
    try:
        publish_assignment(admin, "n1", 1, [replica_assignment(doc)])
        wait_until(lambda: status.find(replica_id="fraud-rules-0", state="READY"), timeout=120,
                   message=lambda: f"READY; statuses {status.values()}; agent log {log.read_text()[-2000:]}")
        pid = wait_until(lambda: _worker_pid(heartbeats), timeout=20, message="a heartbeat with the READY worker's pid")
        assert _uid_of(pid) == WORKER_UID
        produce_json(admin, t.requests, [{"id": f"s-{i}", "inputs": {**doc["example_input"], "amount": 10.0 + i}}
                                         for i in range(10)])
        results = consume_all(admin, t.results, expected=10, timeout=60)
        assert sorted(r.json()["id"] for r in results) == sorted(f"s-{i}" for i in range(10))
        # what the worker's uid may open: its copy, not the agent's password (the same check model code would make)
        probe = subprocess.run(["setpriv", f"--reuid={WORKER_UID}", f"--regid={WORKER_UID}", "--clear-groups",
                                "cat", str(secrets / "agent")], capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "Permission denied" in probe.stderr
        worker_log = (work / "n1" / "fraud-rules-0" / "worker.log").read_text()
        assert (secrets / "agent").read_text().strip() not in worker_log
    finally:
        _stop(agent)
        status.close()
        heartbeats.close()
