"""The one-node cluster of scripts/k8s_node.sh (kubelet, containerd, CNI bridge) and SIE's CPU image in it, for
the tests whose pods really start (``k8s_node`` marker, tests/k8s/test_pods.py).

What they need, and what they say when it is missing (they skip, never fail, for a missing tool):
root; a cgroup v1 host; Debian's containerd, runc, CNI plugins and nftables; mmdebstrap, umoci and skopeo for the
image; the node binaries of scripts/k8s_tools.sh (built in the background by .ci/run, like the apiserver:
``SIE_K8S_TOOLS_WAIT_S`` waits for them). The image is built here by infra/image/build.sh (cached in
``SIE_IMAGE_DIR``, default ~/.cache/sie/image: a new commit only adds SIE's own layer) and imported into the node's
containerd with ``ctr images import``: no registry anywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.k8s.kube_env import TOOLS

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "scripts" / "k8s_node.sh"
BUILD = REPO / "infra" / "image" / "build.sh"
#: the image of the in-cluster tests: a directory of its own, so a build here never swaps the root filesystem
#: tests/infra/test_image.py may be running in (~/.cache/sie/image); the build caches are shared
IMAGE_DIR = Path(os.environ.get("SIE_K8S_IMAGE_DIR", Path.home() / ".cache" / "sie" / "image-k8s"))
IMAGE_WORK = Path(os.environ.get("SIE_IMAGE_DIR", Path.home() / ".cache" / "sie" / "image")) / "work"
#: the tag the in-cluster tests build and run (the chart's appVersion)
IMAGE_TAG = "0.1.0"
#: what the in-cluster tests measured (seconds), printed when a module's node goes down (tests/k8s/conftest.py)
TIMINGS: dict[str, float] = {}
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nft", "ip", "openssl", "mmdebstrap", "umoci",
              "skopeo")


def node_prerequisites() -> str:
    """Why the one-node cluster cannot run on this machine ("" when it can); waits for the node tools' build."""
    if os.geteuid() != 0:
        return "the one-node cluster needs root (containers, mounts, a bridge)"
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge")
    if missing:
        return (f"missing {', '.join(missing)}: apt-get install containerd runc containernetworking-plugins nftables "
                "mmdebstrap umoci skopeo")
    if "memory" not in Path("/proc/self/cgroup").read_text() or not Path("/sys/fs/cgroup/memory").is_dir():
        return "scripts/k8s_node.sh drives a cgroup v1 host (writable /sys/fs/cgroup/memory ...); this one is not"
    if subprocess.run([str(TOOLS), "--node-path"], capture_output=True).returncode == 0:
        return ""
    wait_s = float(os.environ.get("SIE_K8S_TOOLS_WAIT_S") or 0)
    if wait_s <= 0 or shutil.which("go") is None:
        return "the kubelet & co. are not built: scripts/k8s_tools.sh (~15 min more, once per machine)"
    try:
        built = subprocess.run([str(TOOLS)], capture_output=True, text=True, timeout=wait_s)
    except subprocess.TimeoutExpired:
        return f"the kubelet & co. still not built after {wait_s:g}s (SIE_K8S_TOOLS_WAIT_S)"
    return "" if built.returncode == 0 else f"scripts/k8s_tools.sh failed: {built.stderr.strip()[-500:]}"


def build_image(tag: str, timeout: float = 1800.0) -> tuple[Path, float]:
    """infra/image/build.sh --flavour cpu --tag TAG (niced); (the docker archive, seconds it took)."""
    t0 = time.monotonic()
    log = IMAGE_DIR.parent / "image-build.log"
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        done = subprocess.run(["nice", "-n", "10", "bash", str(BUILD), "--flavour", "cpu", "--tag", tag,
                               str(IMAGE_DIR)], stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              env={**os.environ, "PYTHON": sys.executable, "SIE_IMAGE_WORK": str(IMAGE_WORK)})
    tail = log.read_text(errors="replace")[-3000:]
    assert done.returncode == 0, f"infra/image/build.sh failed:\n{tail}"
    archive = IMAGE_DIR / f"sie-{tag}.docker.tar"
    assert archive.is_file(), f"no {archive} after the build:\n{tail}"
    return archive, time.monotonic() - t0


@dataclass
class Node:
    """A running one-node cluster: ``kubectl``/``helm`` as its admin."""

    env: dict[str, str]
    root: Path

    @property
    def ip(self) -> str:
        return self.env["SIE_K8S_NODE_IP"]

    @property
    def name(self) -> str:
        return self.env["SIE_K8S_NODE_NAME"]

    @property
    def bin(self) -> Path:
        return Path(self.env["SIE_K8S_BIN"])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", self.env["KUBECONFIG"], *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result

    def helm(self, *args: str, check: bool = True, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": self.env["KUBECONFIG"], "HELM_CACHE_HOME": str(self.root / "helm-cache"),
               "HELM_CONFIG_HOME": str(self.root / "helm-config"), "HELM_DATA_HOME": str(self.root / "helm-data")}
        result = subprocess.run([str(self.bin / "helm"), *args], capture_output=True, text=True, env=env,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result

    def import_image(self, archive: Path) -> float:
        t0 = time.monotonic()
        done = subprocess.run(["bash", str(NODE), "import", str(archive)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"ctr images import {archive}: {done.stderr}{done.stdout}"
        return time.monotonic() - t0

    def diagnostics(self) -> str:
        """What a failing test prints: pods, recent events, the node's component logs' tails."""
        parts = [self.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout,
                 self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-4000:]]
        logs = Path(self.env["KUBECONFIG"]).parent
        for name in ("kubelet", "containerd"):
            try:
                parts.append(f"--- {name}.log\n" + "\n".join(
                    (logs / f"{name}.log").read_text(errors="replace").splitlines()[-25:]))
            except OSError:
                pass
        return "\n".join(parts)


def node_up(root: Path, timeout: float = 600.0) -> tuple[Node, float]:
    """scripts/k8s_node.sh up (it first cleans what a killed earlier run left); (the node, seconds to Ready)."""
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(NODE), "up"], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        subprocess.run(["bash", str(NODE), "down"], capture_output=True, timeout=300)
        raise AssertionError(f"scripts/k8s_node.sh up failed:\n{done.stderr[-6000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("export "))
    env = dict(kv.split("=", 1) for kv in line.removeprefix("export ").split())
    return Node(env, root), time.monotonic() - t0


def node_down() -> None:
    done = subprocess.run(["bash", str(NODE), "down"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"scripts/k8s_node.sh down failed:\n{done.stderr}"
