"""The chart and the CRD against a real kube-apiserver 1.37 (tests/k8s/kube_env.py; skipped without Go).

What a platform team does first: ``helm lint``, ``helm template | kubectl apply --dry-run=server`` with
its values, ``kubectl apply -f`` the article's ModelService.  Every rendered object must be accepted by the
API server itself (schemas, defaulting, admission), not just parse as YAML.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.k8s.crd import CRD_PATH
from sie.k8s.resource import to_resource
from sie.schemas.spec import load
from tests.k8s.kube_env import REPO, KubeApiServer

CHART = REPO / "infra" / "helm" / "sie"
SECURED = CHART / "ci" / "secured-kafka-values.yaml"
ARTICLE = REPO / "examples" / "article"


def _namespace(kube: KubeApiServer, name: str | None = None) -> str:
    name = name or f"sie-{uuid.uuid4().hex[:8]}"
    manifest = yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.kubectl("apply", "-f", "-", input=manifest)
    return name


def _render(kube: KubeApiServer, namespace: str, *values: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", "sie", str(CHART), "--namespace", namespace, "--kube-version", "1.37.2"]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    text = kube.helm(*args).stdout
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("values", [(), (SECURED,)], ids=["defaults", "secured-kafka"])
def test_helm_lint(kube: KubeApiServer, values: tuple[Path, ...]):
    args = ["lint", str(CHART), "--strict", "--kube-version", "1.37.2"]
    for v in values:
        args += ["-f", str(v)]
    out = kube.helm(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", [(), (SECURED,)], ids=["defaults", "secured-kafka"])
def test_every_rendered_object_passes_the_api_servers_dry_run(crd_installed: KubeApiServer, values):
    kube = crd_installed
    ns = _namespace(kube)
    if values:
        for watched in yaml.safe_load(SECURED.read_text())["operator"]["watchNamespaces"]:
            _namespace(kube, watched)
    docs = _render(kube, ns, *values)
    kinds = sorted({d["kind"] for d in docs})
    assert {"StatefulSet", "DaemonSet", "Deployment", "Job", "PodDisruptionBudget", "Service", "NetworkPolicy",
            "Role", "RoleBinding", "ServiceAccount", "ConfigMap"} <= set(kinds), kinds
    assert all(d["metadata"].get("namespace") for d in docs), "every namespaced object names its namespace"
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs))
    accepted = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(docs), f"{len(docs)} objects rendered, the API server accepted:\n{result.stdout}"


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment", "Job")}


def test_every_pod_is_locked_down_and_only_the_operator_gets_a_token(kube: KubeApiServer):
    docs = _render(kube, "sie", SECURED)
    for where, pod in _pods(docs).items():
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod.get("automountServiceAccountToken", True) is ("operator" in where), where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]["drop"]) == \
                (True, False, ["ALL"]), where
            # the one exception: the agent is root with only what starting its workers as agent.workerUid needs
            # (tests/k8s/test_chart_principals.py); every other container runs as the pod's non-root user
            is_agent = where == "DaemonSet/sie-agent" and c["name"] == "agent"
            assert sc["capabilities"].get("add", []) == (["CHOWN", "SETGID", "SETUID"] if is_agent else []), where
            assert sc.get("runAsUser", pod["securityContext"]["runAsUser"]) == (0 if is_agent else 10001), where
    rules = [r for d in docs if d["kind"] == "Role" for r in d["rules"]]
    resources = {res for r in rules for res in r["resources"]}
    assert resources == {"modelservices", "modelservices/status", "modelservices/finalizers", "events", "leases"}
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_every_probed_port_listens_beyond_loopback_only_in_the_pod(kube: KubeApiServer):
    """SIE's processes bind their health/metrics ports to loopback unless told otherwise (SIE_METRICS_BIND): each
    container the kubelet probes must be told, or its probes fail and the pod never becomes ready."""
    probed = {where: c for where, pod in _pods(_render(kube, "sie", SECURED)).items() for c in pod["containers"]
              if "readinessProbe" in c or "livenessProbe" in c}
    assert {"StatefulSet/sie-control", "DaemonSet/sie-agent", "Deployment/sie-operator"} <= set(probed), sorted(probed)
    for where, c in probed.items():
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env.get("SIE_METRICS_BIND") == "0.0.0.0", where


def test_the_agent_advertises_its_pod_ip_and_kafka_comes_from_the_kafkauser_secret(kube: KubeApiServer):
    docs = _render(kube, "sie", SECURED)
    agent = _pods(docs)["DaemonSet/sie-agent"]["containers"][0]
    env = {e["name"]: e for e in agent["env"]}
    assert env["SIE_ADVERTISE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["SIE_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert env["SIE_SASL_USERNAME"]["value"] == "sie"  # Strimzi names the Secret after the KafkaUser
    assert env["SIE_SASL_PASSWORD_FILE"]["value"] == "/etc/sie/kafka-user/password"
    assert env["SIE_SSL_CA_LOCATION"]["value"] == "/etc/sie/kafka-ca/ca.crt"
    volumes = {v["name"]: v for v in _pods(docs)["DaemonSet/sie-agent"]["volumes"]}
    assert volumes["kafka-user"]["secret"]["secretName"] == "sie"
    assert volumes["kafka-ca"]["secret"]["secretName"] == "my-cluster-cluster-ca-cert"
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize(("setting", "named"), [
    ("control.replica=3", "replica"),
    ("kafka.securityProtocol=SASL_SSL", "userSecret"),
    ("agent.workDir.type=nfs", "type"),
])
def test_values_schema_refuses_a_bad_value_naming_it(kube: KubeApiServer, setting: str, named: str):
    args = ["template", "sie", str(CHART), "--set", setting]
    out = kube.helm(*args, check=False)
    assert out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert named in out.stderr


# ------------------------------------------------------------------------------------------------- CRD


def _get(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any]:
    return yaml.safe_load(kube.kubectl("-n", ns, "get", "modelservice", name, "-o", "yaml").stdout)


def _same_spec(a: Any, b: Any) -> None:
    da = {k: v for k, v in a.to_document().items() if k not in ("source", "warnings")}
    db = {k: v for k, v in b.to_document().items() if k not in ("source", "warnings")}
    assert da == db


def test_the_article_modelservice_applies_as_written_and_round_trips(crd_installed: KubeApiServer):
    kube = crd_installed
    path = ARTICLE / "qwen2-7b-scoring.yaml"
    out = kube.kubectl("apply", "-f", str(path))  # kubectl's default --validate=strict: unknown keys refused
    assert "modelservice.sie.lmsys.org/qwen2-7b-scoring created" in out.stdout
    stored = _get(kube, "default", "qwen2-7b-scoring")
    original = yaml.safe_load(path.read_text())
    assert stored["spec"] == original["spec"]  # nothing pruned, nothing defaulted away
    back = {"apiVersion": stored["apiVersion"], "kind": stored["kind"],
            "metadata": {"name": stored["metadata"]["name"]}, "spec": stored["spec"]}
    _same_spec(load(back), load(original))
    listed = kube.kubectl("get", "crd", "modelservices.sie.lmsys.org").stdout
    assert "modelservices.sie.lmsys.org" in listed
    assert "modelservices" in kube.kubectl("api-resources", "--api-group=sie.lmsys.org").stdout
    kube.kubectl("delete", "-f", str(path))


def test_the_flat_article_spec_round_trips_through_a_resource(crd_installed: KubeApiServer):
    kube = crd_installed
    (spec,) = load(ARTICLE / "model-spec.yaml", many=True)
    resource = to_resource(spec, namespace="default")
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(resource))
    stored = _get(kube, "default", spec.name)
    back = load({"apiVersion": stored["apiVersion"], "kind": stored["kind"],
                 "metadata": {"name": spec.name}, "spec": stored["spec"]})
    _same_spec(back, spec)
    kube.kubectl("delete", "modelservice", spec.name, "-n", "default")


def _refusal(kube: KubeApiServer, change: dict[str, Any]) -> str:
    doc = yaml.safe_load((ARTICLE / "qwen2-7b-scoring.yaml").read_text())
    doc["metadata"]["name"] = doc["spec"]["model"]["name"] = f"bad-{uuid.uuid4().hex[:6]}"
    for path, value in change.items():
        node = doc
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    out = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert out.returncode != 0, f"the API server accepted an invalid ModelService: {out.stdout}"
    return out.stderr


@pytest.mark.parametrize(("change", "named"), [
    ({"spec.sla.min_replicas": 5}, "spec.sla.min_replicas: Invalid value"),
    ({"spec.backend.type": "onnx"}, 'spec.backend.type: Unsupported value: "onnx"'),
    ({"spec.sla.max_replicas": 0}, "spec.sla.max_replicas: Invalid value: 0"),
    ({"spec.backend.tp_size": 2}, 'unknown field "spec.backend.tp_size"'),
    ({"spec.rollout": {"steps": [50, 10, 100]}}, "spec.rollout.steps: Invalid value"),
    ({"spec.model.name": "other"}, "spec.model.name: Invalid value"),
])
def test_the_crd_refuses_an_invalid_modelservice_naming_the_field(crd_installed: KubeApiServer, change, named):
    assert named in _refusal(crd_installed, change)


def test_the_chart_ships_the_generated_crd(kube: KubeApiServer):
    text = kube.helm("template", "sie", str(CHART), "--include-crds", "--kube-version", "1.37.2").stdout
    crds = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "CustomResourceDefinition"]
    assert crds == [yaml.safe_load(CRD_PATH.read_text())]
