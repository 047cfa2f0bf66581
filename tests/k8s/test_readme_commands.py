"""The README's Kubernetes commands, run as written against a real kube-apiserver 1.37 (issue 38, item 5).

``helm template`` failed with ``chart requires kubeVersion: >=1.27.0-0 which is incompatible with Kubernetes
v1.20.0`` unless ``--kube-version`` was given (only the tests gave it); ``kubectl get modelservices`` showed the
requested version in its VERSION column; a normal start emitted a ``Warning`` Event (``PhaseProgressing``).

Each command of the README's Kubernetes block runs through bash from the repository root with the tools of
scripts/k8s_tools.sh first on PATH and KUBECONFIG naming the test's API server.  Where a command cannot run as
written here it says why: the image build (tests/infra/test_image.py builds it), ``helm install`` gets
``--no-hooks`` (its post-install hook is the topics Job, whose pod needs a kubelet and Kafka: without one Helm
waits for it until its timeout), and ``sie operator resource ... --control-url ...`` names no control plane.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import yaml

from sie.k8s.operator import Reconciler
from tests.k8s.kube_env import REPO, KubeApiServer
from tests.k8s.test_reconciler import FakeControl, _cr


def readme_kubernetes_commands() -> list[str]:
    """The commands of the README's "On Kubernetes" bash block: continuation lines joined, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## On Kubernetes", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the README's Kubernetes section has no bash block"
    commands, current = [], ""
    for line in block.group(1).splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        words = shlex.split(current, comments=True)  # a comment's apostrophe is not a quote
        if words:
            commands.append(" ".join(w if "|" == w else shlex.quote(w) for w in words))
        current = ""
    return commands


def _run(kube: KubeApiServer, command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{kube.bin}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(kube.kubeconfig), "HELM_CACHE_HOME": str(kube.root / "helm-cache"),
           "HELM_CONFIG_HOME": str(kube.root / "helm-config"), "HELM_DATA_HOME": str(kube.root / "helm-data")}
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n-> {done.returncode}: {done.stderr}{done.stdout}"
    return done


def test_the_readme_kubernetes_commands_run_as_written(kube: KubeApiServer) -> None:
    commands = readme_kubernetes_commands()
    kinds = [c.split()[0:2] for c in commands]
    assert kinds == [["infra/image/build.sh"], ["helm", "template"], ["helm", "install"], ["kubectl", "apply"],
                     ["kubectl", "get"], ["sie", "operator"]], commands
    ran = []
    for command in commands:
        if command.startswith(("infra/image/build.sh", "sie operator resource")):
            continue  # the module docstring says why
        if command.startswith("helm template"):
            rendered = [d for d in yaml.safe_load_all(_run(kube, command).stdout) if d]
            assert {"StatefulSet", "DaemonSet", "Deployment"} <= {d["kind"] for d in rendered}
        elif command.startswith("helm install"):
            _run(kube, command + " --no-hooks")
        elif command.startswith("kubectl get modelservices"):
            out = _run(kube, command).stdout
            assert out.split("\n", 1)[0].split() == ["NAME", "READY", "PHASE", "VERSION", "REQUESTED", "AGE"], out
        else:
            _run(kube, command)
        ran.append(command.split()[0:2])
    assert len(ran) == 4
    # the chart's objects exist in namespace sie; the article's ModelService in default
    kube.kubectl("-n", "sie", "get", "statefulset/sie-control", "daemonset/sie-agent")
    kube.kubectl("-n", "default", "get", "modelservice", "qwen2-7b-scoring")


def test_version_shows_the_served_version_and_requested_the_spec_s(kube: KubeApiServer) -> None:
    from sie.k8s.crd import CRD_NAME, CRD_PATH

    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    kube.kubectl("apply", "-f", str(REPO / "examples" / "article" / "qwen2-7b-scoring.yaml"))
    # what the operator writes after a refused update: the cluster still serves 1.1.0 while 1.2.0 is asked for
    status = {"status": {"phase": "Ready", "ready": "2/2", "version": "1.1.0"}}
    kube.kubectl("-n", "default", "patch", "modelservice", "qwen2-7b-scoring", "--subresource=status",
                 "--type=merge", "-p", yaml.safe_dump(status))
    out = kube.kubectl("-n", "default", "get", "modelservices").stdout.splitlines()
    header, row = out[0].split(), next(line.split() for line in out if line.startswith("qwen2-7b-scoring"))
    assert dict(zip(header, row))["VERSION"] == "1.1.0" and dict(zip(header, row))["REQUESTED"] == "1.2.0", out


def test_a_normal_start_is_normal_events_only():
    control = FakeControl()
    control.view = {**control.view, "phase": "Progressing", "ready_replicas": 0, "desired_replicas": 2,
                    "reason": "starting"}
    r = Reconciler(control, "sie")
    first = r.reconcile(_cr(), None)
    control.view = {**control.view, "ready_replicas": 1, "reason": "1 of 2 READY"}
    progressing = r.reconcile({**_cr(), "status": first.status}, None)
    control.view = {**control.view, "phase": "Ready", "ready_replicas": 2, "reason": None}
    ready = r.reconcile({**_cr(), "status": progressing.status}, None)
    phase_events = [e for out in (first, progressing, ready) for e in out.events if e[1].startswith("Phase")]
    assert phase_events and all(kind == "Normal" for kind, _, _ in phase_events), phase_events
    control.view = {**control.view, "phase": "Degraded", "ready_replicas": 1, "reason": "gpu-02 offline"}
    degraded = r.reconcile({**_cr(), "status": ready.status}, None)
    assert ("Warning", "PhaseDegraded") in [e[:2] for e in degraded.events]
