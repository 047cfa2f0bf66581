"""The control API without Kafka: authentication and roles on every route, the spec policy on POST,
limits (body size, slow clients), errors without internals, OpenAPI, TLS.

Writes that pass every check reach Kafka and are covered in test_control_kafka.py; here a POST that
passes would try to publish, so the operator-side tests stop at the refusals.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

with warnings.catch_warnings():  # starlette asks for its httpx2 fork; httpx is what SIE's CLI uses
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from sie.control.api import guard as guard_module
from sie.control.api import routes as api_module
from sie.control.api.auth import (
    TokenStore,
    add_token,
    client_token,
    ensure_initial_token,
    hash_token,
    read_token_entries,
    revoke_token,
)
from sie.control.api.routes import create_app
from sie.control.api.server import ApiServer
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from tests.support.helpers import OPERATOR_TOKEN, VIEWER_TOKEN, with_api_tokens

ARTIFACT = "/v1/artifacts/sha256:" + "0" * 64
ROUTES = [("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/v1/nodes"), ("GET", "/v1/replicas"),
          ("GET", "/v1/models"), ("GET", "/v1/models/some-model"), ("GET", "/v1/events"),
          ("GET", "/v1/prometheus/targets"), ("POST", "/v1/models"), ("PUT", "/v1/models"),
          ("DELETE", "/v1/models/some-model"),
          ("GET", "/v1/connectors"), ("GET", "/v1/connectors/some-model"), ("POST", "/v1/connectors"),
          ("POST", "/v1/connectors/some-model/pause"), ("POST", "/v1/connectors/some-model/resume"),
          ("DELETE", "/v1/connectors/some-model"), ("GET", ARTIFACT), ("PUT", ARTIFACT),
          ("POST", "/v1/models/some-model/scale"), ("POST", "/v1/nodes/some-model/forget")]
WRITES = [r for r in ROUTES if r[0] != "GET"]
READS = [r for r in ROUTES if r[0] == "GET" and r[1] != ARTIFACT]  # an artifact lookup reads Kafka

POPEN_SPEC = """
name: evil
version: "1"
backend:
  type: torch
  format: safetensors
  artifact: {artifact}
  moduleClass: "subprocess:Popen"
  moduleKwargs: {{args: "touch {marker}", shell: true}}
"""

ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))


class FakeAudit:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def record(self, principal: Any, action: str, model: str | None, outcome: str, client: str) -> None:
        self.events.append((principal.name if principal else None, action, model, outcome))


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return with_api_tokens(Settings(cache_dir=tmp_path / "cache"))


def _client(settings: Settings, public: tuple[str, ...] = (), service: Any = None) -> tuple[TestClient, FakeAudit]:
    audit = FakeAudit()
    svc = service or ControlService(settings, http_port=None)
    return TestClient(create_app(svc, TokenStore(settings), public, audit), raise_server_exceptions=False), audit


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_without_a_token_is_401(settings: Settings, method: str, path: str) -> None:
    client, audit = _client(settings)
    for headers in ({}, _auth("sie_not-a-token"), {"Authorization": "Basic dXNlcjpwYXNz"}):
        response = client.request(method, path, content="x: 1" if method != "GET" else None, headers=headers)
        assert response.status_code == 401, (method, path, headers, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Bearer" in response.json()["error"]
    assert audit.events == []  # nobody is known: nothing to attribute


@pytest.mark.parametrize("method,path", WRITES)
def test_a_viewer_token_writing_is_403_and_audited(settings: Settings, method: str, path: str) -> None:
    client, audit = _client(settings)
    response = client.request(method, path, content="x: 1", headers=_auth(VIEWER_TOKEN))
    assert response.status_code == 403
    assert "needs role operator" in response.json()["error"]
    assert audit.events == [("viewer", f"{method} {path}", "some-model" if "some-model" in path else None, "forbidden")]


@pytest.mark.parametrize("method,path", READS)
def test_reads_with_viewer_and_operator_tokens(settings: Settings, method: str, path: str) -> None:
    client, _ = _client(settings)
    for token in (VIEWER_TOKEN, OPERATOR_TOKEN):
        response = client.request(method, path, headers=_auth(token))
        expected = 404 if path.endswith("some-model") else 200
        assert response.status_code == expected, (path, response.text)
    if path == "/metrics":
        assert "sie_control_models" in response.text


def test_delete_of_an_unknown_model_by_an_operator_is_404_and_audited(settings: Settings) -> None:
    client, audit = _client(settings)
    response = client.delete("/v1/models/ghost", headers=_auth(OPERATOR_TOKEN))
    assert response.status_code == 404 and response.json()["error"] == "model 'ghost' is not applied"
    assert audit.events == [("operator", "delete", "ghost", "refused 404: model 'ghost' is not applied")]


def test_the_popen_spec_is_refused_naming_the_fields_and_never_runs(settings: Settings, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    client, audit = _client(settings)
    response = client.post("/v1/models", content=POPEN_SPEC.format(artifact=weights, marker=marker),
                           headers=_auth(OPERATOR_TOKEN))
    assert response.status_code == 422
    fields = {e["field"]: e["reason"] for e in response.json()["errors"]}
    assert "module 'subprocess' is not in this node's allowed modules" in fields["spec.backend.moduleClass"]
    assert "outside this node's model roots" in fields["spec.backend.artifact"]
    assert audit.events[0][:3] == ("operator", "apply", None) and audit.events[0][3].startswith("refused 422")
    assert not marker.exists()


def test_kwargs_that_are_not_plain_data_are_refused(settings: Settings) -> None:
    client, _ = _client(settings)
    deep = "{a: " * 12 + "1" + "}" * 12
    doc = ('name: m\nversion: "1"\nbackend: {type: python, callable: "models.fraud.rules:score"}\n'
           f"exampleInput: {deep}\n")
    response = client.post("/v1/models", content=doc, headers=_auth(OPERATOR_TOKEN))
    assert response.status_code == 422
    assert any("nested deeper than 8 levels" in e["reason"] for e in response.json()["errors"])


def test_the_yaml_alias_bomb_is_refused_fast(settings: Settings) -> None:
    client, _ = _client(settings)
    started = time.perf_counter()
    response = client.post("/v1/models", content=ALIAS_BOMB, headers=_auth(OPERATOR_TOKEN))
    elapsed = time.perf_counter() - started
    assert response.status_code == 422
    assert "aliases are not allowed" in response.json()["errors"][0]["reason"]
    assert elapsed < 1.0, f"refusing a 1 KB document took {elapsed:.2f}s"


def test_a_body_over_the_cap_is_413(settings: Settings) -> None:
    client, _ = _client(settings)
    response = client.post("/v1/models", content=b"a" * (api_module.MAX_BODY + 1), headers=_auth(OPERATOR_TOKEN))
    assert response.status_code == 413 and "larger than" in response.json()["error"]


def test_a_500_names_a_reference_not_the_exception(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(ControlService):
        def health(self) -> dict[str, Any]:
            raise RuntimeError("cannot reach kafka-secret-host.internal:9093 with /etc/sie/key.pem")

    client, _ = _client(settings, service=Broken(settings, http_port=None))
    response = client.get("/healthz", headers=_auth(VIEWER_TOKEN))
    assert response.status_code == 500
    body = response.text
    assert "kafka-secret-host" not in body and "key.pem" not in body and "RuntimeError" not in body
    ref = response.json()["error"].split("ref ")[1].split(")")[0]
    assert ref in caplog.text and "kafka-secret-host" in caplog.text  # the operator's log has it


def test_public_health_is_anonymous_and_says_little(settings: Settings) -> None:
    client, _ = _client(settings, public=("/healthz",))
    anonymous = client.get("/healthz")
    assert anonymous.status_code == 200 and set(anonymous.json()) == {"status", "role", "state_caught_up"}
    assert "feeder_last_error" in client.get("/healthz", headers=_auth(VIEWER_TOKEN)).json()
    assert client.get("/metrics").status_code == 401  # only what was listed is open
    with pytest.raises(ValueError, match="cannot be public"):
        Settings(api_public_paths="/v1/models")


def test_connector_and_artifact_writes_are_checked_before_kafka(settings: Settings) -> None:
    client, audit = _client(settings.with_overrides(max_artifact_bytes=1000))
    op = _auth(OPERATOR_TOKEN)
    response = client.post("/v1/connectors", content="name: orders\nformat: nope\n", headers=op)
    assert response.status_code == 422
    fields = {e["field"] for e in response.json()["errors"]}
    assert {"connector.format", "connector.sourceTopic", "connector.model", "connector.tables"} <= fields
    response = client.post("/v1/connectors/ghost/pause", headers=op)
    assert response.status_code == 404 and response.json()["error"] == "connector 'ghost' is not applied"
    assert audit.events[-1] == ("operator", "pause connector", "ghost", "refused 404: connector 'ghost' is not applied")
    response = client.put("/v1/artifacts/md5:abc", content=b"x", headers=op)
    assert response.status_code == 422 and "sha256:<64 lowercase hex digits>" in response.json()["error"]
    response = client.put(ARTIFACT, content=b"x" * 1001, headers=op)  # the artifact cap, not the 1 MiB one
    assert response.status_code == 413 and "larger than 1000 bytes" in response.json()["error"]
    response = client.put(ARTIFACT, params={"name": "../etc/passwd"}, content=b"x", headers=op)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "query.name"


def test_openapi_document_lists_routes_and_the_bearer_scheme(settings: Settings) -> None:
    client, _ = _client(settings)
    assert client.get("/openapi.json").status_code == 401  # what routes exist is for holders of a token
    doc = client.get("/openapi.json", headers=_auth(VIEWER_TOKEN)).json()
    assert {"/v1/models", "/v1/models/{name}", "/v1/nodes", "/v1/replicas", "/healthz", "/metrics", "/v1/connectors",
            "/v1/connectors/{name}", "/v1/connectors/{name}/pause", "/v1/artifacts/{ref}"} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


# ---- tokens ----------------------------------------------------------------------------------------


def test_tokens_are_hashed_at_rest_and_reloaded(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    store = TokenStore(settings, recheck_s=0.0)
    token = add_token(settings.api_tokens_file, "alice", "viewer")
    text = settings.api_tokens_file.read_text()
    assert token not in text and hash_token(token) in text
    assert settings.api_tokens_file.stat().st_mode & 0o777 == 0o600
    principal = store.authenticate(token)
    assert principal is not None and (principal.name, principal.role) == ("alice", "viewer")
    assert revoke_token(settings.api_tokens_file, "alice")
    assert store.authenticate(token) is None


def test_first_start_creates_one_operator_token_for_the_local_cli(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    path = ensure_initial_token(settings)
    assert path == settings.api_token_file and path.stat().st_mode & 0o777 == 0o600
    token = client_token(settings)
    assert token and TokenStore(settings).authenticate(token).role == "operator"  # type: ignore[union-attr]
    assert ensure_initial_token(settings) is None  # configured now: nothing new
    assert len(read_token_entries(settings.api_tokens_file)) == 1
    # configured tokens: nothing is generated
    other = with_api_tokens(Settings(cache_dir=tmp_path / "other"))
    assert ensure_initial_token(other) is None and not other.api_token_file.exists()


# ---- the real server: slow clients, TLS ------------------------------------------------------------------


def _serve(settings: Settings, **tls: Any) -> ApiServer:
    app = create_app(ControlService(settings, http_port=None), TokenStore(settings), (), FakeAudit())
    return ApiServer(app, "127.0.0.1", 0, **tls).start()


def test_a_client_that_never_sends_its_headers_is_dropped(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_module, "HEADER_TIMEOUT_S", 0.5)
    server = _serve(settings)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
            started = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 4
    finally:
        server.stop()


def test_a_body_that_never_arrives_is_408(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_module, "BODY_TIMEOUT_S", 0.5)
    server = _serve(settings)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(f"POST /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\n"
                         "Content-Length: 100\r\n\r\nname: slow".encode())
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    finally:
        server.stop()


def _openssl_cert(directory: Path) -> tuple[Path, Path]:
    key, cert = directory / "api.key", directory / "api.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


def test_tls_serves_https_verified_against_the_ca(settings: Settings, tmp_path: Path) -> None:
    cert, key = _openssl_cert(tmp_path)
    server = _serve(settings, tls_cert=cert, tls_key=key)
    try:
        assert server.scheme == "https"
        url = f"https://127.0.0.1:{server.port}/v1/nodes"
        ok = httpx.get(url, headers=_auth(VIEWER_TOKEN), verify=ssl.create_default_context(cafile=str(cert)))
        assert ok.status_code == 200 and ok.json() == {"nodes": []}
        with pytest.raises(httpx.ConnectError):  # not trusted without the CA
            httpx.get(url, headers=_auth(VIEWER_TOKEN))
    finally:
        server.stop()


def test_the_cli_checks_the_certificate_against_the_tls_server_name(settings: Settings, tmp_path: Path) -> None:
    """A certificate for a Service name (``sie-control``), reached at an address it does not name (a pod IP, here
    127.0.0.1): refused unless SIE_API_TLS_SERVER_NAME names it (kubectl's tls-server-name); the CA still decides."""
    from sie.commands._api import ControlApi
    from sie.kernel.errors import SieError

    key, cert = tmp_path / "api.key", tmp_path / "api.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=sie-control", "-addext", "subjectAltName=DNS:sie-control"],
                   check=True, capture_output=True)
    server = _serve(settings, tls_cert=cert, tls_key=key)
    try:
        url = f"https://127.0.0.1:{server.port}"
        cli = settings.with_overrides(api_ca=cert, api_token=SecretStr(VIEWER_TOKEN))
        with pytest.raises(SieError, match="did not answer GET /v1/nodes"):  # the name does not match the address
            ControlApi(cli, url).get("/v1/nodes")
        named = cli.with_overrides(api_tls_server_name="sie-control")
        assert ControlApi(named, url).get("/v1/nodes") == {"nodes": []}
        with pytest.raises(SieError, match="did not answer GET /v1/nodes"):  # the name is checked, not skipped
            ControlApi(cli.with_overrides(api_tls_server_name="other"), url).get("/v1/nodes")
    finally:
        server.stop()


def test_the_port_in_use_is_a_clear_error(settings: Settings) -> None:
    from sie.kernel.errors import ConfigError

    first = _serve(settings)
    try:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            ApiServer(create_app(ControlService(settings, http_port=None), TokenStore(settings)), "127.0.0.1",
                      first.port).start()
    finally:
        first.stop()
