"""The chart serves the control API over https by default (issue 37, item 2): the operator sends its token only
over https (or to loopback), so a default install must give the control plane a certificate and the operator
its CA.  A CA the chart generates is kept across upgrades (``lookup``); with cert-manager installed the chart
asks it instead; ``api.tls.mode=disabled`` is plain http (and the operator then refuses to send its token)."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.kube_env import REPO, KubeApiServer

CHART = REPO / "infra" / "helm" / "sie"


def _render(kube: KubeApiServer, ns: str, *extra: str) -> list[dict[str, Any]]:
    text = kube.helm("template", "sie", str(CHART), "--namespace", ns, "--kube-version", "1.37.2", *extra).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def _container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return dict(doc["spec"]["template"]["spec"]["containers"][0])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_a_default_install_serves_https_with_a_generated_ca_the_operator_trusts(kube: KubeApiServer, tmp_path: Path):
    docs = _render(kube, "team")
    operator = _env(_container(docs, "Deployment", "sie-operator"))
    control = _env(_container(docs, "StatefulSet", "sie-control"))
    assert operator["SIE_CONTROL_URL"] == "https://sie-control.team.svc:8470"
    assert operator["SIE_API_CA"] == "/etc/sie/api-tls/ca.crt"
    assert control["SIE_API_TLS_CERT"] == "/etc/sie/api-tls/tls.crt"
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "sie-api-tls"]
    assert secret["type"] == "kubernetes.io/tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    # the certificate verifies against the CA for the very host name the operator's URL names
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname",
                               "sie-control.team.svc", str(tmp_path / "tls.crt")], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_with_cert_manager_the_chart_asks_it_for_the_certificate(kube: KubeApiServer):
    docs = _render(kube, "team", "--api-versions", "cert-manager.io/v1")
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert set(certs) == {"sie-api-ca", "sie-api-tls"}
    assert certs["sie-api-tls"]["spec"]["secretName"] == "sie-api-tls"
    assert "sie-control.team.svc" in certs["sie-api-tls"]["spec"]["dnsNames"]
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "sie-api-tls"]
    assert _env(_container(docs, "Deployment", "sie-operator"))["SIE_CONTROL_URL"].startswith("https://")


def test_tls_disabled_is_plain_http_and_nothing_mounts_a_certificate(kube: KubeApiServer):
    docs = _render(kube, "team", "--set", "api.tls.mode=disabled")
    assert _env(_container(docs, "Deployment", "sie-operator"))["SIE_CONTROL_URL"].startswith("http://")
    assert "SIE_API_TLS_CERT" not in _env(_container(docs, "StatefulSet", "sie-control"))
    assert not [d for d in docs if d["kind"] in ("Certificate", "Issuer") or d["metadata"]["name"] == "sie-api-tls"]


def test_the_generated_ca_is_kept_across_an_upgrade(kube: KubeApiServer):
    ns = f"sie-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    args = ["sie", str(CHART), "--namespace", ns, "--no-hooks", "--set", "topics.job.enabled=false"]
    kube.helm("install", *args)

    def data() -> dict[str, str]:
        out = kube.kubectl("-n", ns, "get", "secret", "sie-api-tls", "-o", "yaml").stdout
        return dict(yaml.safe_load(out)["data"])

    first = data()
    kube.helm("upgrade", *args)
    assert data() == first
