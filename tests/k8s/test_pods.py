"""SIE's pods on a real node: scripts/k8s_node.sh's one-node cluster (kubelet 1.37 on cgroup v1, containerd, runc,
the CNI bridge), SIE's CPU image built by infra/image/build.sh and imported without a registry, a KRaft broker on
the node's address (the pods reach it over the bridge; nothing leaves the machine).

Skipped, saying why, where the node cannot run (tests/k8s/node_env.py: root, the Debian tools, the node binaries).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.kernel.settings import Settings
from tests.k8s.node_env import IMAGE_TAG, TIMINGS, Node
from tests.support.helpers import wait_until

# the first test waits for the node binaries (CI builds them in the background) and builds the image
pytestmark = [pytest.mark.k8s_node, pytest.mark.kafka,
              pytest.mark.timeout(float(os.environ.get("SIE_K8S_TOOLS_WAIT_S") or 0) + 1800)]

TAG = IMAGE_TAG
IMAGE = f"sie:{TAG}"
#: what each pod of SIE's chart runs with (values.yaml podSecurityContext/securityContext)
RESTRICTED = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                        "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def node_kafka(node: Node, base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A single KRaft broker listening on (and advertising) the node's bridge address: what pods reach."""
    from sie.infra.kafka.local import LocalKafka, free_base_port

    kafka = LocalKafka(base_settings, brokers=1, base_port=free_base_port(2), hosts=[node.ip],
                       data_dir=tmp_path_factory.mktemp("node-kafka"), detach=False)
    kafka.up(timeout=180)
    try:
        yield base_settings.with_overrides(bootstrap_servers=kafka.bootstrap_servers)
    finally:
        kafka.down()


def _pod(name: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED, "automountServiceAccountToken": False,
                     "containers": [{"name": "sie", "image": IMAGE, "imagePullPolicy": "Never", "args": args,
                                     "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                                     "securityContext": CONTAINER_RESTRICTED,
                                     "volumeMounts": [{"name": "cache", "mountPath": "/var/cache/sie"},
                                                      {"name": "tmp", "mountPath": "/tmp"}]}],
                     "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}}


def _run_to_completion(node: Node, pod: dict[str, Any], timeout: float = 300.0) -> tuple[str, dict[str, Any]]:
    """Create the pod, wait until it Succeeded (a Failed pod fails the test with its logs); (its logs, its status)."""
    ns = f"t-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", ns)
    node.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(pod))
    name = pod["metadata"]["name"]

    def finished() -> dict[str, Any] | None:
        status = json.loads(node.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)["status"]
        if status.get("phase") == "Failed":
            logs = node.kubectl("-n", ns, "logs", name, check=False)
            raise AssertionError(f"pod {name} failed: {status}\n{logs.stdout}{logs.stderr}")
        return status if status.get("phase") == "Succeeded" else None

    try:
        status = wait_until(finished, timeout, 0.5, lambda: f"pod {name} Succeeded\n{node.diagnostics()}")
        logs = node.kubectl("-n", ns, "logs", name).stdout
    finally:
        node.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return logs, status


def test_a_pod_of_the_sie_image_runs_on_the_node(node: Node):
    t0 = time.monotonic()
    logs, status = _run_to_completion(node, _pod("version", ["--version"]))
    TIMINGS["first pod (create -> Succeeded)"] = time.monotonic() - t0
    assert logs.strip() == f"sie {TAG}", logs
    # its address is on the bridge the script made, from the node's pod range
    assert status["podIP"].rsplit(".", 1)[0] == node.ip.rsplit(".", 1)[0], status
    node_obj = json.loads(node.kubectl("get", "node", node.name, "-o", "json").stdout)
    assert node_obj["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node_obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")


def test_a_pod_reaches_kafka_on_the_node_and_makes_sie_topics(node: Node, node_kafka: Settings):
    from confluent_kafka.admin import AdminClient

    prefix = f"pod{uuid.uuid4().hex[:6]}"
    logs, _ = _run_to_completion(node, _pod("topics", ["topics", "ensure"], {
        "SIE_BOOTSTRAP_SERVERS": node_kafka.bootstrap_servers, "SIE_TOPIC_PREFIX": prefix,
        "SIE_CACHE_DIR": "/var/cache/sie"}))
    topics = AdminClient({"bootstrap.servers": node_kafka.bootstrap_servers}).list_topics(timeout=30).topics
    assert f"{prefix}.specs" in topics, (logs, sorted(topics))


# -- the chart on the node ---------------------------------------------------------------------------------------
CHART = Path(__file__).resolve().parents[2] / "infra" / "helm" / "sie"
NS = "sie"
MODEL = "fraud-pods"


def _values(node: Node, kafka: Settings, tag: str) -> dict[str, Any]:
    """The chart on a 2-core node: small requests (the defaults ask for more CPU than this node has), Kafka on the
    node's address, simulated GPUs, the image imported into containerd (pullPolicy Never: no registry)."""
    small = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "2Gi"}}
    return {"image": {"repository": "sie", "tag": tag, "pullPolicy": "Never"},
            "kafka": {"bootstrapServers": kafka.bootstrap_servers, "replicationFactor": 1},
            "control": {"resources": small},
            "agent": {"simulateGpus": "2xA100-80GB", "resources": {**small, "limits": {"memory": "6Gi"}}},
            "operator": {"resources": small, "watchNamespaces": [NS], "resyncSeconds": 2}}


def _pods(node: Node, component: str) -> list[dict[str, Any]]:
    out = node.kubectl("-n", NS, "get", "pods", "-l", f"app.kubernetes.io/component={component}", "-o", "json")
    return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _restarts(pods: list[dict[str, Any]]) -> dict[str, int]:
    return {p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
            for p in pods}


#: the name in the chart's API certificate (its Service); the tests reach a pod by its IP and check this name
API_SERVER_NAME = "sie-control"


def _api_ca(node: Node) -> Path:
    """The CA of the chart's generated API certificate (Secret ``sie-api-tls``, key ``ca.crt``), as a file."""
    import base64

    path = node.root / "api-ca.pem"
    if not path.exists():
        secret = json.loads(node.kubectl("-n", NS, "get", "secret", "sie-api-tls", "-o", "json").stdout)
        path.write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    return path


def _api_get(node: Node, pod: dict[str, Any], path: str, token: str | None = None) -> Any:
    """GET a control pod's HTTPS API by its IP, the certificate checked against the CA and the Service's name."""
    import ssl

    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(verify=ssl.create_default_context(cafile=str(_api_ca(node))), timeout=10) as client:
        response = client.get(f"https://{pod['status']['podIP']}:8470{path}", headers=headers,
                              extensions={"sni_hostname": API_SERVER_NAME})
    response.raise_for_status()
    return response.json()


def _role(node: Node, pod: dict[str, Any]) -> str | None:
    import httpx

    try:
        return _api_get(node, pod, "/healthz").get("role")
    except (httpx.HTTPError, KeyError, ValueError):
        return None


@pytest.fixture(scope="module")
def release(node: Node, node_kafka: Settings) -> Iterator[Node]:
    """helm install on the node; (its teardown: helm uninstall, no SIE pod left)."""
    node.kubectl("label", "node", node.name, "nvidia.com/gpu.present=true", "--overwrite")
    values = node.root / "values.yaml"
    values.write_text(yaml.safe_dump(_values(node, node_kafka, TAG)))
    t0 = time.monotonic()
    # no --wait: the pods' readiness waits for the topics, which the post-install hook Job makes
    node.helm("install", "sie", str(CHART), "-n", NS, "--create-namespace", "-f", str(values), "--timeout", "10m")
    TIMINGS["helm install (incl. the topics Job)"] = time.monotonic() - t0
    yield node
    node.helm("uninstall", "sie", "-n", NS, "--wait", "--timeout", "5m", check=False)


def test_helm_install_brings_every_component_up(release: Node):
    node = release
    t0 = time.monotonic()
    # the post-install hook Job ran to completion (helm install waits for it; hook-succeeded then deletes it)
    events = node.kubectl("-n", NS, "get", "events", "--field-selector", "involvedObject.kind=Job",
                          "-o", "jsonpath={range .items[*]}{.involvedObject.name}={.reason}{'\\n'}{end}").stdout.split()
    assert "sie-topics=Completed" in events, events

    def all_ready() -> bool:
        control, agents, operators = _pods(node, "control"), _pods(node, "agent"), _pods(node, "operator")
        return (len(control) == 2 and len(agents) == 1 and len(operators) == 2
                and all(_ready(p) for p in control + agents + operators))

    wait_until(all_ready, 600, 2, lambda: f"control 2/2, agent 1/1, operator 2/2 Ready\n{node.diagnostics()}")
    TIMINGS["install -> all Ready"] = TIMINGS["helm install (incl. the topics Job)"] + time.monotonic() - t0
    roles = wait_until(lambda: (r := sorted(str(_role(node, p)) for p in _pods(node, "control"))) == ["leader", "standby"]
                       and r, 120, 1, lambda: f"one leader, one standby: {[_role(node, p) for p in _pods(node, 'control')]}")
    assert roles == ["leader", "standby"]


def _api_env(node: Node) -> dict[str, str]:
    """The CLI's environment for the chart's control API (HTTPS by default): the operator token from the chart's
    Secret, the API's CA, and the certificate's name, since the CLI reaches a pod by its IP on the node's bridge."""
    import base64

    secret = json.loads(node.kubectl("-n", NS, "get", "secret", "sie-api", "-o", "json").stdout)
    token = base64.b64decode(secret["data"]["operator-token"]).decode()
    return {**os.environ, "SIE_API_TOKEN": token, "SIE_API_CA": str(_api_ca(node)),
            "SIE_API_TLS_SERVER_NAME": API_SERVER_NAME}


def _leader(node: Node) -> dict[str, Any] | None:
    return next((p for p in _pods(node, "control") if _ready(p) and _role(node, p) == "leader"), None)


def _model_row(node: Node) -> list[str]:
    return node.kubectl("-n", NS, "get", "modelservices", MODEL, "--no-headers", check=False).stdout.split()


def _wait_model_ready(node: Node, timeout: float) -> list[str]:
    return wait_until(lambda: (row := _model_row(node))[1:3] == ["1/1", "Ready"] and row, timeout, 2,
                      lambda: f"{MODEL} 1/1 Ready: {_model_row(node)}\n{node.diagnostics()}")


def _traffic(kafka: Settings, tag: str):  # -> (RequestStream, ResultTail)
    from sie.kernel.names import ModelTopics
    from tests.support.cluster_harness import RequestStream, ResultTail, example_input

    settings = kafka.with_overrides(topic_prefix="sie")
    t = ModelTopics.default_for(MODEL, "sie")
    topics = {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters}
    example = example_input(REPO_EXAMPLES / "fraud-scorer.yaml")
    return RequestStream(settings, topics["requests"], example, tag, rate_per_s=10), ResultTail(settings, topics)


REPO_EXAMPLES = CHART.parents[2] / "examples"


def _exactly_once(tail: Any, ids: list[str], timeout: float) -> None:
    wait_until(lambda: tail.count(ids) == len(ids), timeout, 1,
               lambda: f"{len(ids)} results, got {tail.count(ids)}")
    tail.read_to_end()  # a duplicate committed after the last awaited one is seen too
    lost, dups, stray = tail.audit(ids)
    # the tail reads the results topic from its start: the earlier tests' ids (another tag) are there too
    tag = ids[0].rsplit("-", 1)[0] + "-"
    ours = [i for i in stray if i.startswith(tag)]
    assert not lost and not dups and not ours, (lost[:5], dict(list(dups.items())[:5]), ours[:5])
    assert all(kind == "result" for i in ids for _, kind in tail.arrivals[i]), "a request was dead-lettered"


def _model_spec(folder: Path) -> Path:
    """The fraud-scorer example as model ``MODEL`` (one replica), its artifact a path on this machine."""
    doc = yaml.safe_load((REPO_EXAMPLES / "fraud-scorer.yaml").read_text())
    doc["metadata"]["name"] = doc["spec"]["model"]["name"] = MODEL
    doc["spec"]["backend"]["artifact"] = str((REPO_EXAMPLES / doc["spec"]["backend"]["artifact"]).resolve())
    doc["spec"]["sla"].update(min_replicas=1, max_replicas=1)
    spec = folder / f"{MODEL}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec


def _apply_model(node: Node, spec: Path) -> list[str]:
    """What a user does: upload the artifact through the leader's API (``sie operator resource``), kubectl apply the
    ModelService it prints; the model's row once it is 1/1 READY."""
    import subprocess
    import sys

    leader = wait_until(lambda: _leader(node), 120, 1, "a leading control pod")
    made = subprocess.run([sys.executable, "-m", "sie", "operator", "resource", "-f", str(spec), "-n", NS,
                           "--control-url", f"https://{leader['status']['podIP']}:8470"],
                          env=_api_env(node), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    t0 = time.monotonic()
    node.kubectl("apply", "-f", "-", input=made.stdout)
    row = _wait_model_ready(node, 600)
    TIMINGS["kubectl apply -> READY"] = time.monotonic() - t0
    return row


def test_kubectl_apply_a_modelservice_scores_1000_requests_exactly_once(release: Node, node_kafka: Settings,
                                                                         tmp_path: Path):
    node = release
    row = _apply_model(node, _model_spec(tmp_path))
    assert row[3] == "1.0.0", row
    stream, tail = _traffic(node_kafka, "k")
    try:
        ids = stream.send(1000)
        _exactly_once(tail, ids, 300)
    finally:
        tail.close()


def _replica_ids(node: Node) -> list[str]:
    """The model's replicas as the leader's API reports them (id, node, worker process, restarts, state)."""
    leader = _leader(node)
    assert leader is not None, "no leading control pod"
    model = _api_get(node, leader, f"/v1/models/{MODEL}", _api_env(node)["SIE_API_TOKEN"])
    # the worker process and its restart count: a replica restarted or moved changes one of them
    return sorted(f"{r['replica_id']}@{r['node']}/{r['process']}/{r['restarts']}/{r['state']}" for r in model["replicas"])


def test_deleting_the_leading_control_pod_hands_over_without_touching_a_replica(release: Node,
                                                                                 node_kafka: Settings):
    node = release
    _wait_model_ready(node, 120)
    before = _replica_ids(node)
    agent_restarts = _restarts(_pods(node, "agent"))
    leader = wait_until(lambda: _leader(node), 60, 1, "a leading control pod")
    stream, tail = _traffic(node_kafka, "l")
    stream.start()
    try:
        t0 = time.monotonic()
        node.kubectl("-n", NS, "delete", "pod", leader["metadata"]["name"], "--wait=false")
        new = wait_until(lambda: (p := _leader(node)) and p["metadata"]["name"] != leader["metadata"]["name"] and p,
                         120, 0.5, "the other control pod leading")
        TIMINGS["leader pod deleted -> other leads"] = time.monotonic() - t0
        assert new["metadata"]["name"] != leader["metadata"]["name"]
        wait_until(lambda: len([p for p in _pods(node, "control") if _ready(p)]) == 2, 300, 2,
                   lambda: f"the deleted control pod back and Ready\n{node.diagnostics()}")
        sent = stream.stop()
        ids = [f"l-{i}" for i in range(sent)]
        _exactly_once(tail, ids, 300)
    finally:
        stream._stop.set()
        tail.close()
    assert _replica_ids(node) == before, "the leader's deletion moved or restarted a replica"
    assert _restarts(_pods(node, "agent")) == agent_restarts


def test_deleting_the_agent_pod_brings_its_replicas_back(release: Node, node_kafka: Settings):
    node = release
    _wait_model_ready(node, 120)
    (agent,) = _pods(node, "agent")
    t0 = time.monotonic()
    node.kubectl("-n", NS, "delete", "pod", agent["metadata"]["name"], "--wait=true", "--timeout=120s")
    wait_until(lambda: [p for p in _pods(node, "agent") if _ready(p) and p["metadata"]["uid"] != agent["metadata"]["uid"]],
               300, 2, lambda: f"a new agent pod Ready\n{node.diagnostics()}")
    _wait_model_ready(node, 600)
    TIMINGS["agent pod deleted -> model READY again"] = time.monotonic() - t0
    stream, tail = _traffic(node_kafka, "a")
    try:
        _exactly_once(tail, stream.send(100), 300)
    finally:
        tail.close()


def test_helm_upgrade_to_a_new_image_tag_under_load_loses_and_doubles_nothing(release: Node, node_kafka: Settings):
    import subprocess

    node = release
    _wait_model_ready(node, 120)
    new_tag = f"{TAG}-upgrade"
    sock = Path(node.env["KUBECONFIG"]).parent / "containerd.sock"
    tagged = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "tag", "--force",
                             f"docker.io/library/sie:{TAG}", f"docker.io/library/sie:{new_tag}"],
                            capture_output=True, text=True, timeout=60)
    assert tagged.returncode == 0, tagged.stderr
    values = node.root / "values-upgrade.yaml"
    values.write_text(yaml.safe_dump(_values(node, node_kafka, new_tag)))
    stream, tail = _traffic(node_kafka, "u")
    stream.start()
    try:
        t0 = time.monotonic()
        node.helm("upgrade", "sie", str(CHART), "-n", NS, "-f", str(values), "--timeout", "10m")

        def upgraded() -> bool:
            pods = _pods(node, "control") + _pods(node, "agent") + _pods(node, "operator")
            return len(pods) == 5 and all(_ready(p) and p["spec"]["containers"][0]["image"] == f"sie:{new_tag}"
                                          for p in pods)

        wait_until(upgraded, 900, 2, lambda: f"every pod on sie:{new_tag} and Ready\n{node.diagnostics()}")
        _wait_model_ready(node, 600)
        TIMINGS["helm upgrade -> all Ready on the new tag"] = time.monotonic() - t0
        sent = stream.stop()
        _exactly_once(tail, [f"u-{i}" for i in range(sent)], 300)
    finally:
        stream._stop.set()
        tail.close()


def test_helm_uninstall_leaves_no_sie_pod(release: Node):
    node = release
    node.kubectl("-n", NS, "delete", "modelservice", MODEL, "--wait=true", "--timeout=120s", check=False)
    node.helm("uninstall", "sie", "-n", NS, "--wait", "--timeout", "5m")
    wait_until(lambda: not json.loads(node.kubectl("-n", NS, "get", "pods", "-o", "json").stdout)["items"], 180, 2,
               lambda: f"no pod left in {NS}\n{node.diagnostics()}")
