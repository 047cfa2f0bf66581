"""End to end on a real kube-apiserver and the real broker: ``kubectl apply`` a ModelService -> the operator
-> the control plane (specs topic) -> two agents' workers READY -> ``kubectl get modelservices`` says 2/2.

No kubelet runs here, so SIE's pods never start: the control plane, the agents and the operator run as
processes, exactly the commands the chart's pods run (``sie control``, ``sie agent``, ``sie operator
run``).  The operator runs with a token of the chart's own ServiceAccount, so the chart's RBAC is what it
gets: nothing more.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.kernel.settings import Settings
from tests.k8s.kube_env import KubeApiServer
from tests.support.cluster_harness import REPO, Cluster, free_port, try_get, wait_for
from tests.support.helpers import consume_all

pytestmark = pytest.mark.kafka

CHART = REPO / "infra" / "helm" / "sie"


def _install_operator_rbac(kube: KubeApiServer, ns: str) -> Path:
    """The chart's ServiceAccount, Roles and RoleBindings of the operator, applied for real; its kubeconfig."""
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns}}))
    text = kube.helm("template", "sie", str(CHART), "--namespace", ns, "--kube-version", "1.37.2",
                     "--show-only", "templates/rbac-operator.yaml", "--show-only", "templates/serviceaccounts.yaml").stdout
    docs = [d for d in yaml.safe_load_all(text) if d and (d["kind"] != "ServiceAccount"
                                                         or d["metadata"]["name"] == "sie-operator")]
    kube.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    return kube.service_account_kubeconfig(ns, "sie-operator")


class OperatorProc:
    def __init__(self, cluster: Cluster, kube: KubeApiServer, kubeconfig: Path, ns: str, control_port: int,
                 name: str) -> None:
        self.health = free_port()
        self.log = cluster.root / f"operator-{name}.log"
        args = [sys.executable, "-m", "sie", "operator", "run", "--control-url", f"http://127.0.0.1:{control_port}",
                "--namespace", ns, "--lease-namespace", ns, "--lease-name", "sie-operator", "--identity", name,
                "--resync-s", "2", "--health-port", str(self.health), "--health-host", "127.0.0.1",
                "--kubeconfig", str(kubeconfig)]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def passes(self) -> int:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith("sie_operator_passes "):
                return int(float(line.split()[1]))
        return -1

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


def _cr(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any] | None:
    out = kube.kubectl("-n", ns, "get", "modelservice", name, "-o", "yaml", check=False)
    return yaml.safe_load(out.stdout) if out.returncode == 0 else None


def _spec_records(settings: Settings, name: str) -> list[Any]:
    return [r for r in consume_all(settings, settings.names.system_topic("specs")) if r.key == name.encode()]


def _events(kube: KubeApiServer, ns: str, name: str) -> list[str]:
    out = kube.kubectl("-n", ns, "get", "events", "--field-selector", f"involvedObject.name={name}",
                       "-o", "jsonpath={range .items[*]}{.reason}{'\\n'}{end}")
    return out.stdout.split()


def test_kubectl_apply_to_ready_restart_changes_nothing_and_delete_removes_the_model(
        crd_installed: KubeApiServer, kafka_settings: Settings, tmp_path: Path):
    kube = crd_installed
    ns = f"sie-e2e-{uuid.uuid4().hex[:6]}"
    kubeconfig = _install_operator_rbac(kube, ns)
    with Cluster(kafka_settings, tmp_path / "cluster") as cluster:
        cluster.start_control("c1")
        cluster.start_agent("node-a")
        cluster.start_agent("node-b")
        port = cluster.wait_leader().port
        # both agents registered before the model is placed: on one node alone its replicas would be moved back
        # toward the spread (docs/control-plane.md, "Spread restored") while the test reads the model's state
        wait_for(lambda: len([n for n in (try_get(port, "/v1/nodes") or {}).get("nodes", [])
                              if n["status"] == "online"]) == 2, 60, lambda: "both agents online; " + cluster.logs())
        spec_file = cluster.write_spec("fraud-scorer", name="fraud-k8s", replicas=2)
        # what a user does: upload the artifact through the API and get the resource to kubectl apply
        made = cluster.sie("operator", "resource", "-f", str(spec_file), "-n", ns,
                           "--control-url", f"http://127.0.0.1:{port}")
        assert made.returncode == 0, made.stderr
        resource = yaml.safe_load(made.stdout)
        assert set(resource["spec"]["backend"]["artifact"]) >= {"sha256", "name"}  # by content, no local path
        operator = OperatorProc(cluster, kube, kubeconfig, ns, port, "op-1")
        try:
            kube.kubectl("apply", "-f", "-", input=made.stdout)

            def ready_row() -> str | None:
                assert operator.proc.poll() is None, f"the operator exited:\n{operator.tail()}"
                row = kube.kubectl("-n", ns, "get", "modelservices", "fraud-k8s", "--no-headers").stdout.split()
                return " ".join(row) if row[1:3] == ["2/2", "Ready"] else None

            row = wait_for(ready_row, 180, lambda: f"fraud-k8s 2/2 Ready; CR {_cr(kube, ns, 'fraud-k8s')}\n"
                                                    f"operator:\n{operator.tail()}\n{cluster.logs()}")
            assert row.split()[3] == "1.0.0"
            cr = _cr(kube, ns, "fraud-k8s")
            conditions = {c["type"]: c for c in cr["status"]["conditions"]}
            assert conditions["Ready"]["status"] == "True" and conditions["Accepted"]["status"] == "True"
            assert cr["metadata"]["finalizers"] == ["sie.lmsys.org/operator"]
            assert cluster.ready_model("fraud-k8s", 2) is not None
            (published,) = _spec_records(cluster.settings, "fraud-k8s")
            assert _events(kube, ns, "fraud-k8s").count("Applied") == 1

            # the operator dies mid-way (SIGKILL: no clean release) and a new one takes the Lease over
            operator.stop(signal.SIGKILL)
            operator = OperatorProc(cluster, kube, kubeconfig, ns, port, "op-2")
            wait_for(lambda: operator.passes() >= 3, 90, lambda: f"op-2 reconciling; log:\n{operator.tail()}")
            lease = yaml.safe_load(kube.kubectl("-n", ns, "get", "lease", "sie-operator", "-o", "yaml").stdout)
            assert lease["spec"]["holderIdentity"] == "op-2"
            assert _spec_records(cluster.settings, "fraud-k8s") == [published], "a restart re-published the spec"
            assert _events(kube, ns, "fraud-k8s").count("Applied") == 1
            # still (or again) 2/2 Ready under the new operator: a replica's status may blink under a loaded machine,
            # which is the control plane's report, not the restart's doing (the two asserts above are)
            wait_for(ready_row, 90, lambda: f"fraud-k8s 2/2 Ready under op-2; CR {_cr(kube, ns, 'fraud-k8s')}\n"
                                           f"operator:\n{operator.tail()}")

            # an invalid change: refused with the field named, in a condition and an Event; the model keeps serving
            kube.kubectl("-n", ns, "patch", "modelservice", "fraud-k8s", "--type=merge",
                         "-p", '{"spec": {"exampleInput": {"amount": "lots"}}}')

            def refused() -> dict[str, Any] | None:
                got = _cr(kube, ns, "fraud-k8s") or {}
                accepted = {c["type"]: c for c in got.get("status", {}).get("conditions", [])}.get("Accepted", {})
                return accepted if accepted.get("status") == "False" else None

            accepted = wait_for(refused, 60, lambda: f"Accepted=False; log:\n{operator.tail()}")
            assert "spec.exampleInput" in accepted["message"]
            assert "InvalidSpec" in _events(kube, ns, "fraud-k8s")
            assert cluster.ready_model("fraud-k8s", 2) is not None
            assert _spec_records(cluster.settings, "fraud-k8s") == [published]

            # kubectl delete: the finalizer holds the CR until the model is deleted from SIE
            kube.kubectl("-n", ns, "delete", "modelservice", "fraud-k8s", "--wait=true", "--timeout=90s")
            assert _cr(kube, ns, "fraud-k8s") is None
            records = _spec_records(cluster.settings, "fraud-k8s")
            assert records[0] == published and records[-1].value is None  # the tombstone, before the CR went
            wait_for(lambda: not [r for r in cluster.all_workers() if r.startswith("fraud-k8s")], 90,
                     lambda: f"fraud-k8s's workers drained; {cluster.all_workers()}")
            gone = try_get(port, "/v1/models/fraud-k8s")
            assert gone is None or "spec" not in gone, gone  # no applied spec left
        finally:
            operator.stop()


def test_a_resource_named_like_a_model_sie_apply_applied_never_takes_it_over_nor_deletes_it(
        crd_installed: KubeApiServer, kafka_settings: Settings, tmp_path: Path):
    """Issue 37, item 4: a ModelService named like a model `sie apply` applied became its owner, and deleting it
    deleted that model.  The operator now owns only models carrying its mark in SIE's spec record."""
    kube = crd_installed
    ns = f"sie-own-{uuid.uuid4().hex[:6]}"
    kubeconfig = _install_operator_rbac(kube, ns)
    with Cluster(kafka_settings, tmp_path / "cluster") as cluster:
        cluster.start_control("c1")
        port = cluster.wait_leader().port
        url = f"http://127.0.0.1:{port}"
        spec_file = cluster.write_spec("fraud-scorer", name="fraud-own", replicas=1)
        applied = cluster.sie("apply", "-f", str(spec_file), "--control-url", url)
        assert applied.returncode == 0, applied.stderr
        (published,) = _spec_records(cluster.settings, "fraud-own")
        made = cluster.sie("operator", "resource", "-f", str(spec_file), "-n", ns, "--control-url", url)
        assert made.returncode == 0, made.stderr
        operator = OperatorProc(cluster, kube, kubeconfig, ns, port, "op-own")
        try:
            kube.kubectl("apply", "-f", "-", input=made.stdout)

            def not_owner() -> dict[str, Any] | None:
                assert operator.proc.poll() is None, f"the operator exited:\n{operator.tail()}"
                got = _cr(kube, ns, "fraud-own") or {}
                accepted = {c["type"]: c for c in got.get("status", {}).get("conditions", [])}.get("Accepted", {})
                return accepted if accepted.get("reason") == "NotOwner" else None

            accepted = wait_for(not_owner, 90, lambda: f"NotOwner; CR {_cr(kube, ns, 'fraud-own')}\n{operator.tail()}")
            assert "sie apply" in accepted["message"]
            assert _spec_records(cluster.settings, "fraud-own") == [published], "the operator overwrote the model"
            kube.kubectl("-n", ns, "delete", "modelservice", "fraud-own", "--wait=true", "--timeout=90s")
            assert _cr(kube, ns, "fraud-own") is None
            assert _spec_records(cluster.settings, "fraud-own") == [published], "deleting the CR deleted the model"
            still = try_get(port, "/v1/models/fraud-own")
            assert still is not None and still["spec"]["owner"] is None, still
        finally:
            operator.stop()
