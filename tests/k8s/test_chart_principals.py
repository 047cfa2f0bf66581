"""The chart's pods run as one Kafka principal per component (issue 37, item 1): before, control, agent, workers and
the topics Job shared one KafkaUser with every ACL.  Now (``kafka.strimzi.users`` or ``kafka.users.*``) each pod
mounts only its component's Secret, the agent hands its workers their own principal (role scorer), and the
KafkaUsers the chart renders carry exactly ``sie acls plan``'s ACLs; the capability table of docs/security.md is
checked against what each rendered pod's principal may write."""

from __future__ import annotations

from typing import Any

import yaml

from sie.k8s.kafkausers import COMPONENTS, TEMPLATE_PATH, component_acls, render_template
from sie.kernel.names import SYSTEM_TOPICS
from tests.k8s.kube_env import REPO, KubeApiServer
from tests.security.test_capabilities import capability_table

CHART = REPO / "infra" / "helm" / "sie"
SECURED = CHART / "ci" / "secured-kafka-values.yaml"
PREFIX = "blue"
#: docs/security.md's capability table calls the workers' role (scorer) by its role name
TABLE_ROLE = {"control": "control", "agent": "agent", "workers": "scorer"}


def _render(kube: KubeApiServer, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "sie", str(CHART), "--namespace", "sie", "--kube-version", "1.37.2", "-f", str(SECURED),
            "--set", f"topicPrefix={PREFIX}"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(kube.helm(*args).stdout) if d]


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment", "Job")}


def _kafka_secrets(pod: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for v in pod.get("volumes", []) if v["name"] in ("kafka-user", "kafka-workers")}


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}


def test_the_committed_kafkauser_template_is_what_the_acl_planner_generates():
    assert TEMPLATE_PATH.read_text(encoding="utf-8") == render_template(), \
        "run python -m sie.k8s.kafkausers --write (the ACL plan changed)"


def test_each_component_runs_as_its_own_principal_holding_exactly_its_planned_acls(kube: KubeApiServer):
    docs = _render(kube, "kafka.strimzi.users=true")
    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}
    assert set(users) == {f"sie-{c}" for c in COMPONENTS}
    for component in COMPONENTS:
        user = users[f"sie-{component}"]
        assert user["spec"]["authorization"]["acls"] == component_acls(PREFIX, component), component
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    pods = _pods(docs)
    control, agent, topics = pods["sie-control"], pods["sie-agent"], pods["sie-topics"]
    assert _kafka_secrets(control) == {"sie-control"} and _env(control)["SIE_SASL_USERNAME"] == "sie-control"
    assert _kafka_secrets(agent) == {"sie-agent", "sie-workers"}
    assert _env(agent)["SIE_SASL_USERNAME"] == "sie-agent"
    assert _env(agent)["SIE_WORKER_SASL_USERNAME"] == "sie-workers"
    assert _env(agent)["SIE_WORKER_SASL_PASSWORD_FILE"] == "/etc/sie/kafka-workers/password"
    assert _kafka_secrets(topics) == {"sie"}  # the administrator: it creates the topics
    assert not _kafka_secrets(pods["sie-operator"]), "the operator needs no Kafka credential at all"


def test_the_capability_table_holds_for_the_principals_of_the_rendered_pods(kube: KubeApiServer):
    docs = _render(kube, "kafka.strimzi.users=true")
    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}
    table = capability_table()
    for component, role in TABLE_ROLE.items():
        ops: dict[str, set[str]] = {}
        for acl in users[f"sie-{component}"]["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            if resource["type"] == "topic" and resource["patternType"] == "literal" and \
                    resource["name"].startswith(PREFIX + "."):
                ops.setdefault(resource["name"][len(PREFIX) + 1:], set()).update(acl["operations"])
        for suffix in SYSTEM_TOPICS:
            granted = ops.get(suffix, set())
            cell = "W" if "Write" in granted else "R" if "Read" in granted else "-"
            assert cell == table[suffix][role], f"{suffix}: sie-{component} (role {role}) has {cell}, the doc says " \
                                                f"{table[suffix][role]}"


def test_own_secrets_per_component_without_strimzi(kube: KubeApiServer):
    docs = _render(kube, "kafka.users.control=ctl", "kafka.users.agent=agt", "kafka.users.workers=wrk",
                   "kafka.users.topics=adm")
    pods = _pods(docs)
    assert not [d for d in docs if d["kind"] == "KafkaUser"]
    assert (_kafka_secrets(pods["sie-control"]), _kafka_secrets(pods["sie-agent"]),
            _kafka_secrets(pods["sie-topics"])) == ({"ctl"}, {"agt", "wrk"}, {"adm"})


def test_the_kafkauser_examples_per_role_are_the_plan():
    from sie.k8s.kafkausers import examples, role_scope, strimzi_acls
    from sie.kernel.acls import ROLES, plan
    from sie.kernel.names import Names

    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(examples("green", "churn"))}
    assert set(docs) == {f"sie-{role}" for role in ROLES}
    for role in ROLES:
        scope = role_scope(role, "green", "churn")
        assert docs[f"sie-{role}"]["spec"]["authorization"]["acls"] == \
            strimzi_acls(plan(Names("green"), role, "x", **scope)), role


def _agent_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == "agent")


def _secret_modes(pod: dict[str, Any]) -> dict[str, int]:
    """The modes of the Kafka credentials (the CA bundle is public: 0444)."""
    return {v["name"]: v["secret"]["defaultMode"] for v in pod.get("volumes", []) if v["name"].startswith("kafka-")
            and v["name"] != "kafka-ca"}


def test_workers_run_as_their_own_uid_and_the_agent_gets_only_the_capabilities_to_start_them(kube: KubeApiServer):
    """Issue 37, "no worker can read a credential other than its own": the agent runs its workers as
    agent.workerUid (no group of the pod), its own secrets are 0400 files of its own uid, and only the agent
    container holds CAP_SETUID/SETGID/CHOWN (Kubernetes grants added capabilities to uid 0 only)."""
    pods = _pods(_render(kube, "kafka.strimzi.users=true"))
    agent = pods["sie-agent"]
    container = _agent_container(agent)
    context = container["securityContext"]
    assert (context["runAsUser"], context["runAsNonRoot"], context["allowPrivilegeEscalation"],
            context["readOnlyRootFilesystem"], context["privileged"]) == (0, False, False, True, False)
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "SETGID", "SETUID"]}
    assert "fsGroup" not in agent["securityContext"], "a pod group would make the agent's secrets group-readable"
    env = _env(agent)
    assert (env["SIE_WORKER_UID"], env["SIE_WORKER_GID"]) == ("10002", "10002")
    assert int(env["SIE_WORKER_UID"]) not in (0, agent["securityContext"]["runAsUser"])
    assert _secret_modes(agent) == {"kafka-user": 0o400, "kafka-workers": 0o400}
    # the workers' Secret is mounted into the agent only, which copies it for the worker uid (SIE_WORKER_SASL_*)
    assert env["SIE_WORKER_SASL_PASSWORD_FILE"] == "/etc/sie/kafka-workers/password"
    for name, pod in pods.items():
        assert "sie-workers" not in _kafka_secrets(pod) or name == "sie-agent", name
        for c in pod["containers"]:
            if c is not container:
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, name
                assert c["securityContext"].get("runAsUser", pod["securityContext"]["runAsUser"]) != 0, name


def test_without_a_worker_uid_the_agent_runs_as_before(kube: KubeApiServer):
    """agent.workerUid=null: non-root, no capability, group-readable secrets; workers share the agent's uid
    (docs/security.md says what this mode does not protect)."""
    agent = _pods(_render(kube, "kafka.strimzi.users=true", "agent.workerUid=null"))["sie-agent"]
    context = _agent_container(agent)["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]} and "runAsUser" not in context
    assert agent["securityContext"]["runAsNonRoot"] is True and agent["securityContext"]["fsGroup"] == 10001
    assert "SIE_WORKER_UID" not in _env(agent)
    assert _secret_modes(agent) == {"kafka-user": 0o440, "kafka-workers": 0o440}
