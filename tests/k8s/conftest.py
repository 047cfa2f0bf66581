"""Fixtures of the Kubernetes tests: one real kube-apiserver per test session (tests/k8s/kube_env.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s.kube_env import KubeApiServer, tools_dir


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    bin_dir, why = tools_dir()
    if bin_dir is None:
        pytest.skip(why)
    server = KubeApiServer(bin_dir, tmp_path_factory.mktemp("kube")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def crd_installed(kube: KubeApiServer) -> KubeApiServer:
    from sie.k8s.crd import CRD_NAME, CRD_PATH

    kube.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    return kube
