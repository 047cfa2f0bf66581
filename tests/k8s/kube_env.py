"""A real kube-apiserver 1.37 (with an embedded etcd) on loopback, for the Kubernetes tests.

The binaries come from ``scripts/k8s_tools.sh`` (built from Go modules once per machine into
``~/.cache/sie/k8s``; .ci/run builds them).  Where they are not built, or Go is missing, the tests that need
them skip and say which.  There is no kubelet, scheduler or container runtime: objects are created,
validated (server-side dry run, CRD schemas and CEL rules, RBAC) and watched, and pods never start; SIE's
processes run next to it as plain processes.

Auth: a token file with an admin (``system:masters``) and ``--authorization-mode=RBAC``; service-account
tokens are signed with a key made here by openssl, so ``kubectl create token`` gives a component exactly the
rights its chart grants (the operator test runs with those, not as admin).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "scripts" / "k8s_tools.sh"
K8S_VERSION = "1.37.2"


def tools_dir() -> tuple[Path | None, str]:
    """(bin dir, "") when kube-apiserver, kubectl and helm are built, else (None, why not).

    ``SIE_K8S_TOOLS_WAIT_S`` (CI sets it): when they are not built yet, run the build script for at most that
    long; it waits on the lock of a build already running (CI starts it in the background, niced, while the
    other tests run) and then finds everything built."""
    probe = subprocess.run([str(TOOLS), "--path"], capture_output=True, text=True)
    if probe.returncode == 0:
        return Path(probe.stdout.strip().splitlines()[-1]), ""
    wait_s = float(os.environ.get("SIE_K8S_TOOLS_WAIT_S") or 0)
    if wait_s > 0 and shutil.which("go") is not None:
        try:
            built = subprocess.run([str(TOOLS), "--no-node"], capture_output=True, text=True, timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None, f"kube-apiserver/kubectl/helm still not built after {wait_s:g}s (SIE_K8S_TOOLS_WAIT_S)"
        if built.returncode == 0:
            return Path(built.stdout.strip().splitlines()[-1]), ""
        return None, f"scripts/k8s_tools.sh failed: {built.stderr.strip()[-500:]}"
    if shutil.which("go") is None:
        return None, "Go is not installed, so kube-apiserver/kubectl/helm cannot be built (scripts/k8s_tools.sh)"
    return None, "kube-apiserver/kubectl/helm are not built yet: run scripts/k8s_tools.sh (~13 min, once per machine)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KubeApiServer:
    """One etcd + kube-apiserver process; ``kubectl(...)`` runs against it as admin (or as ``kubeconfig``)."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin = bin_dir
        self.root = root
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.admin_token = uuid.uuid4().hex
        self.kubeconfig = root / "admin.kubeconfig"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> KubeApiServer:
        r = self.root
        (r / "certs").mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(r / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(r / "sa.key"), "-pubout", "-out", str(r / "sa.pub")],
                       check=True, capture_output=True)
        (r / "tokens.csv").write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        env = {**os.environ, "SIE_ETCD_DATA_DIR": str(r / "etcd"),
               "SIE_ETCD_CLIENT_URL": f"http://127.0.0.1:{_free_port()}",
               "SIE_ETCD_PEER_URL": f"http://127.0.0.1:{_free_port()}"}
        args = [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers={env['SIE_ETCD_CLIENT_URL']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={r / 'certs'}",
            f"--token-auth-file={r / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={r / 'sa.pub'}",
            f"--service-account-signing-key-file={r / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ]
        log = open(r / "apiserver.log", "wb")
        try:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            log.close()
        self.kubeconfig.write_text(yaml.safe_dump(self.config_for("admin", self.admin_token)))
        from tests.support.helpers import wait_until

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, f"kube-apiserver exited: {self.log_tail()}"
            probe = self.kubectl("get", "--raw", "/readyz", check=False)
            return probe.returncode == 0 and probe.stdout.strip() == "ok"

        try:
            wait_until(ready, timeout, 0.5, lambda: f"kube-apiserver /readyz ok; log: {self.log_tail()}")
        except BaseException:
            self.stop()
            raise
        # the default namespace and the RBAC bootstrap roles are created by the server after /readyz
        self.wait_for(["get", "namespace", "default"], timeout)
        return self

    def config_for(self, user: str, token: str, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "sie",
            "clusters": [{"name": "local", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "sie", "context": {"cluster": "local", "user": user, "namespace": namespace}}],
        }

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result

    def wait_for(self, args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        from tests.support.helpers import wait_until

        def ok() -> subprocess.CompletedProcess[str] | None:
            result = self.kubectl(*args, check=False)
            return result if result.returncode == 0 else None

        return wait_until(ok, timeout, 0.5, f"kubectl {' '.join(args)}")

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.root / "helm-cache"),
               "HELM_CONFIG_HOME": str(self.root / "helm-config"), "HELM_DATA_HOME": str(self.root / "helm-data")}
        result = subprocess.run([str(self.bin / "helm"), *args], capture_output=True, text=True, env=env, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig holding a fresh token of ServiceAccount ``namespace/name`` (what a pod of it would get)."""
        token = self.kubectl("-n", namespace, "create", "token", name, "--duration=2h").stdout.strip()
        path = self.root / f"{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(self.config_for(f"system:serviceaccount:{namespace}:{name}", token, namespace)))
        return path

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join((self.root / "apiserver.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (the apiserver shuts down gracefully, then the embedded etcd closes), SIGKILL at 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.k8s.kube_env DIR``: the tests' API server for a person to try the chart and the operator on
    (docs/kubernetes.md, "Try it on a local API server"): started under DIR, its admin kubeconfig written to
    ``DIR/admin.kubeconfig``, stopped by Ctrl-C or SIGTERM."""
    import sys
    import threading

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.k8s.kube_env DIR", file=sys.stderr)
        return 2
    bin_dir, why = tools_dir()
    if bin_dir is None:
        print(why, file=sys.stderr)
        return 1
    root = Path(args[0]).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    server = KubeApiServer(bin_dir, root).start()
    print(f"kube-apiserver {K8S_VERSION} on {server.url}\nexport KUBECONFIG={server.kubeconfig}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            if server.proc is None or server.proc.poll() is not None:
                print(f"kube-apiserver exited: {server.log_tail()}", file=sys.stderr)
                return 1
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
