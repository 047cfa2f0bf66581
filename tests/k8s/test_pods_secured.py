"""The chart's pods on a SECURED Kafka, one principal per component, on the real one-node cluster (issue 37: "the
chart's pods run with per-role principals whose ACLs are the planned ones, and no worker can read a credential
other than its own").

    broker   LocalKafka(secure=True) on the node's address: SASL_SSL + SCRAM-SHA-512, StandardAuthorizer with
             nothing allowed without an ACL; its controller listener on loopback (out of the pods' reach)
    users    one SCRAM user per chart component, named like the chart's KafkaUsers: sie-control, sie-agent,
             sie-workers, each granted exactly `sie acls apply --role <its role>` (the project's planner); the
             topics Job runs as the broker's administrator (it creates topics, which no role may)
    chart    helm install with kafka.users.{control,agent,workers} (Secrets made here, key `password`),
             kafka.sasl.userSecret for the topics Job, kafka.tls.caSecret (the broker's CA), agent.workerUid 10002
    checks   every pod Ready; each pod mounts its own principal's password (compared by SHA-256 from inside
             the pod) and no other; the broker holds for each principal exactly the planned bindings; a
             ModelService scores keyed requests exactly once (read_committed) through the workers' principal;
             inside the agent pod, as the worker uid (tests/k8s/worker_probe.py): the worker runs as that uid
             with no capability, its environment names only its own principal, it cannot open the agent's or
             the workers' Secret (EACCES) but opens its own copy, and the broker refuses its principal a write to
             specs/assignments/artifact-chunks/rollouts and a change of specs' retention
             (TOPIC_AUTHORIZATION_FAILED) while it writes its model's results.

Skipped, saying why, where the node cannot run (tests/k8s/node_env.py). The node and the image are the fixtures of
tests/k8s/conftest.py (the image built once per session); helpers are test_pods.py's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sie.infra.kafka.local import LocalKafka, free_base_port
from sie.infra.kafka.security import ADMIN
from sie.k8s.kafkausers import COMPONENTS, component_acls, strimzi_acls
from sie.kernel.acls import plan, to_binding
from sie.kernel.settings import Settings
from tests.k8s.node_env import TIMINGS, Node
from tests.k8s.test_pods import (
    CHART,
    MODEL,
    NS,
    TAG,
    _apply_model,
    _exactly_once,
    _model_spec,
    _pods,
    _ready,
    _traffic,
    _values,
)
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.k8s_node, pytest.mark.kafka,
              pytest.mark.timeout(float(os.environ.get("SIE_K8S_TOOLS_WAIT_S") or 0) + 1800)]

PREFIX = "sie"  # the chart's topicPrefix (test_pods' helpers use it too)
#: chart component -> its SCRAM user, named like the KafkaUser the chart would render (<release>-<component>)
USERS = {component: f"sie-{component}" for component in COMPONENTS}
#: the topics Job's Secret (kafka.sasl.userSecret): the broker's administrator, the one principal that creates topics
ADMIN_SECRET = "sie-kafka-admin"
CA_SECRET = "sie-kafka-ca"
WORKER_UID = 10002  # values.yaml agent.workerUid
PROBE = Path(__file__).with_name("worker_probe.py")


@pytest.fixture(scope="module")
def secured(node: Node, base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A secured KRaft broker on the node's bridge address (what pods reach), one SCRAM user per chart component
    holding exactly its role's planned ACLs (applied with `sie acls apply`)."""
    from sie.commands.acls import command as acls_cli

    kafka = LocalKafka(base_settings, brokers=1, base_port=free_base_port(2), hosts=[node.ip],
                       data_dir=tmp_path_factory.mktemp("node-kafka-secured"), detach=False, secure=True)
    t0 = time.monotonic()
    kafka.up(timeout=180)
    try:
        admin = kafka.settings_for_clients().with_overrides(topic_prefix=PREFIX)
        for component, user in USERS.items():
            kafka.create_user(user)
            done = CliRunner().invoke(acls_cli, ["apply", "--role", COMPONENTS[component], "--principal", user],
                                      obj=admin)
            assert done.exit_code == 0, done.output
        TIMINGS["secured broker up + users + ACLs"] = time.monotonic() - t0
        yield kafka
    finally:
        kafka.down()


def _admin(kafka: LocalKafka) -> Settings:
    return kafka.settings_for_clients().with_overrides(topic_prefix=PREFIX)


def _secret(name: str, key: str, value: str) -> str:
    """A Secret's manifest (applied through stdin: no password on a command line)."""
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                           "type": "Opaque", "data": {key: base64.b64encode(value.encode()).decode()}})


def _sha(kafka: LocalKafka, user: str) -> str:
    return "sha256:" + hashlib.sha256(kafka.security.password(user).encode()).hexdigest()


@pytest.fixture(scope="module")
def secured_release(node: Node, secured: LocalKafka) -> Iterator[Node]:
    """The Secrets of each component and the CA, then helm install with a principal per component."""
    node.kubectl("label", "node", node.name, "nvidia.com/gpu.present=true", "--overwrite")
    node.kubectl("create", "namespace", NS)
    secrets = [_secret(user, "password", secured.security.password(user)) for user in USERS.values()]
    secrets += [_secret(ADMIN_SECRET, "password", secured.security.password(ADMIN)),
                _secret(CA_SECRET, "ca.crt", secured.security.ca_cert.read_text())]
    node.kubectl("apply", "-f", "-", input="---\n".join(secrets))
    values = _values(node, secured.settings_for_clients(), TAG)
    values["kafka"].update({
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "userSecret": ADMIN_SECRET, "username": ADMIN},
        "users": {"control": USERS["control"], "agent": USERS["agent"], "workers": USERS["workers"]},
        "tls": {"caSecret": CA_SECRET}})
    # one control pod and one operator: the 2-core node runs the rest of the test faster (test_pods.py covers HA)
    values["control"]["replicas"] = 1
    values["operator"]["replicas"] = 1
    path = node.root / "values-secured.yaml"
    path.write_text(yaml.safe_dump(values))
    t0 = time.monotonic()
    node.helm("install", "sie", str(CHART), "-n", NS, "-f", str(path), "--timeout", "10m")
    TIMINGS["secured: helm install (incl. the topics Job)"] = time.monotonic() - t0

    def all_ready() -> bool:
        pods = _pods(node, "control") + _pods(node, "agent") + _pods(node, "operator")
        return len(pods) == 3 and all(_ready(p) for p in pods)

    wait_until(all_ready, 600, 2, lambda: f"control, agent and operator Ready\n{node.diagnostics()}")
    TIMINGS["secured: install -> all Ready"] = time.monotonic() - t0
    yield node
    node.helm("uninstall", "sie", "-n", NS, "--timeout", "2m", check=False)  # the node goes down next


@pytest.fixture(scope="module")
def secured_model(secured_release: Node, secured: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The fraud model applied as a user does (its topics made by the administrator first: no role may create
    topics); its `kubectl get modelservices` row once 1/1 READY."""
    from sie.commands.topics import command as topics_cli

    spec = _model_spec(tmp_path_factory.mktemp("model"))
    made = CliRunner().invoke(topics_cli, ["ensure", "-f", str(spec)], obj=_admin(secured))
    assert made.exit_code == 0, made.output
    t0 = time.monotonic()
    row = _apply_model(secured_release, spec)
    TIMINGS["secured: kubectl apply -> READY"] = time.monotonic() - t0
    return row


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def _kafka_secrets(pod: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for v in pod["spec"].get("volumes", [])
            if "secret" in v and v["name"].startswith("kafka-") and v["name"] != "kafka-ca"}


def _exec(node: Node, pod: dict[str, Any], container: str, *cmd: str, stdin: str | None = None) -> str:
    args = ["-n", NS, "exec", *(["-i"] if stdin is not None else []), pod["metadata"]["name"], "-c", container, "--",
            *cmd]
    return node.kubectl(*args, input=stdin, timeout=120).stdout


def _mounted_password(node: Node, pod: dict[str, Any], container: str, path: str) -> str:
    """The SHA-256 of a password file as the pod's container reads it (never the password itself)."""
    code = ("import hashlib, sys; "
            "print('sha256:' + hashlib.sha256(open(sys.argv[1], 'rb').read().strip()).hexdigest())")
    return _exec(node, pod, container, "python3", "-c", code, path).strip()


def test_each_component_runs_as_its_own_principal_holding_exactly_its_planned_acls(secured_release: Node,
                                                                                   secured: LocalKafka):
    node = secured_release
    # the topics Job ran as the administrator (helm keeps the hook's manifest; the Job itself is deleted on success)
    events = node.kubectl("-n", NS, "get", "events", "--field-selector", "involvedObject.kind=Job",
                          "-o", "jsonpath={range .items[*]}{.involvedObject.name}={.reason}{'\\n'}{end}").stdout.split()
    assert "sie-topics=Completed" in events, events
    (job,) = [d for d in yaml.safe_load_all(node.helm("get", "hooks", "sie", "-n", NS).stdout)
              if d and d["kind"] == "Job"]
    job_env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job_env["SIE_SASL_USERNAME"] == ADMIN

    (control,), (agent,), (operator,) = _pods(node, "control"), _pods(node, "agent"), _pods(node, "operator")
    assert (_env(control)["SIE_SASL_USERNAME"], _kafka_secrets(control)) == (USERS["control"], {USERS["control"]})
    assert (_env(agent)["SIE_SASL_USERNAME"], _env(agent)["SIE_WORKER_SASL_USERNAME"]) == \
        (USERS["agent"], USERS["workers"])
    assert _kafka_secrets(agent) == {USERS["agent"], USERS["workers"]}
    assert not _kafka_secrets(operator) and "SIE_SASL_USERNAME" not in _env(operator)
    # from inside: what each container reads at its password path is its own principal's password
    assert _mounted_password(node, control, "control", "/etc/sie/kafka-user/password") == _sha(secured, USERS["control"])
    assert _mounted_password(node, agent, "agent", "/etc/sie/kafka-user/password") == _sha(secured, USERS["agent"])
    assert _mounted_password(node, agent, "agent", "/etc/sie/kafka-workers/password") == \
        _sha(secured, USERS["workers"])

    # the broker's view: each principal holds exactly its role's plan, which is what the chart's KafkaUser carries
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from sie.kernel.admin import admin_client

    admin = admin_client(_admin(secured))
    for component, user in USERS.items():
        rules = plan(_admin(secured).names, COMPONENTS[component], user)
        assert strimzi_acls(rules) == component_acls(PREFIX, component), component
        held = admin.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}",
                                                    None, AclOperation.ANY, AclPermissionType.ANY),
                                   request_timeout=30).result(timeout=30)
        assert set(held) == {to_binding(r) for r in rules}, component


def test_a_modelservice_scores_keyed_requests_exactly_once_through_the_workers_principal(secured_model: list[str],
                                                                                        secured: LocalKafka):
    assert secured_model[1:4] == ["1/1", "Ready", "1.0.0"], secured_model
    stream, tail = _traffic(_admin(secured), "s")
    try:
        _exactly_once(tail, stream.send(300), 300)
    finally:
        tail.close()


def test_a_worker_reads_only_its_own_credential_and_the_broker_refuses_its_principal_the_system_topics(
        secured_release: Node, secured: LocalKafka, secured_model: list[str]):
    from sie.kernel.names import ModelTopics

    node = secured_release
    (agent,) = _pods(node, "agent")
    results = ModelTopics.default_for(MODEL, PREFIX).results
    report = json.loads(_exec(node, agent, "agent", "python3", "-", str(WORKER_UID), PREFIX, results,
                              stdin=PROBE.read_text()))
    procs = report["processes"]
    workers = [p for p in procs if "sie.workers." in p["cmdline"]]
    agents = [p for p in procs if " agent " in f" {p['cmdline']} " and p not in workers]
    assert workers and agents, f"no worker or no agent process in the agent container: {procs}"
    # every worker runs as the worker uid, no group of the pod, no capability, no_new_privs; the agent as root
    for p in workers:
        assert (p["uid"], p["euid"], p["groups"], p["cap_eff"], p["no_new_privs"]) == \
            (WORKER_UID, WORKER_UID, [], "0000000000000000", "1"), p
    assert all(p["uid"] == 0 for p in agents), agents
    assert report["probe_uid"] == [WORKER_UID, WORKER_UID, WORKER_UID, []]
    # its environment names its own principal and its copy of the password, nothing of the agent's
    env = report["worker_env"]
    assert env["SIE_SASL_USERNAME"] == USERS["workers"] and env["SIE_SECURITY_PROTOCOL"] == "SASL_SSL", env
    assert env["SIE_SASL_PASSWORD_FILE"].startswith("/var/lib/sie/agent/"), env
    leaked = [k for k in report["worker_env_keys"] if k.startswith("SIE_WORKER_SASL") or k in (
        "SIE_SASL_PASSWORD", "SIE_API_TOKEN", "SIE_API_TOKENS")]
    assert not leaked, leaked
    # as the worker uid: the agent's and the workers' Secrets are closed, its own copy open (the workers' password)
    assert report["open"] == {"agent": "EACCES", "workers_secret": "EACCES",
                              "own_copy": _sha(secured, USERS["workers"]), "service_account_token": "ENOENT"}, \
        report["open"]
    # the broker: the workers' principal may write its model's results and nothing of the control plane's
    kafka = report["kafka"]
    assert kafka == {f"write {PREFIX}.specs": "TOPIC_AUTHORIZATION_FAILED",
                     f"write {PREFIX}.assignments": "TOPIC_AUTHORIZATION_FAILED",
                     f"write {PREFIX}.artifact-chunks": "TOPIC_AUTHORIZATION_FAILED",
                     f"write {PREFIX}.rollouts": "TOPIC_AUTHORIZATION_FAILED",
                     f"alter {PREFIX}.specs retention.ms": "TOPIC_AUTHORIZATION_FAILED",
                     f"write {results}": "ok"}, kafka
