"""Fixtures of the Kubernetes tests: one real kube-apiserver per test session (tests/k8s/kube_env.py), and for the
tests whose pods really start (``k8s_node``: test_pods.py, test_pods_secured.py) SIE's image, built once per
session, and scripts/k8s_node.sh's one-node cluster, brought up per module with the image imported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.kube_env import KubeApiServer, tools_dir
from tests.k8s.node_env import IMAGE_TAG, TIMINGS, Node, build_image, node_down, node_prerequisites, node_up


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


@pytest.fixture(scope="session")
def node_image() -> Path:
    """SIE's CPU image (infra/image/build.sh, ``sie:IMAGE_TAG``) as a docker archive: built once per session, where
    the one-node cluster can run (else the test skips, saying why)."""
    why = node_prerequisites()
    if why:
        pytest.skip(why)
    archive, TIMINGS["image build"] = build_image(IMAGE_TAG)
    return archive


@pytest.fixture(scope="module")
def node(node_image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The one-node cluster with the image imported (no registry); down again when the module is done."""
    root = tmp_path_factory.mktemp("node")
    node, TIMINGS["cluster up"] = node_up(root)
    try:
        TIMINGS["image import"] = node.import_image(node_image)
        yield node
    finally:
        node_down()
        print("timings (s):", json.dumps({k: round(v, 1) for k, v in TIMINGS.items()}))
        TIMINGS.clear()
