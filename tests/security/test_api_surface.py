"""Hole 8: ``/openapi.json`` answered without a token, and a ``%0a`` in a path parameter was decoded into the audit
event and the INFO log (a forged log line).  Now the document needs a viewer token (``/docs``, ``/redoc`` are not
served), a path holding a control character is refused (400) before routing without being echoed, and audit
details are escaped whatever they quote.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from sie.control.api.audit import escape_text
from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app, route_table
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from tests.support.helpers import OPERATOR_TOKEN, VIEWER_TOKEN, with_api_tokens

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class FakeAudit:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def record(self, principal: Any, action: str, model: str | None, outcome: str, client: str) -> None:
        self.events.append((action, model, outcome))


@pytest.fixture()
def client(tmp_path: Path) -> tuple[TestClient, FakeAudit]:
    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    audit = FakeAudit()
    app = create_app(ControlService(settings, http_port=None), TokenStore(settings), (), audit)
    return TestClient(app, raise_server_exceptions=False), audit


def test_the_openapi_document_needs_a_token_and_no_docs_page_is_served(client: tuple[TestClient, FakeAudit]):
    http, _ = client
    anonymous = http.get("/openapi.json")
    assert anonymous.status_code == 401 and "paths" not in anonymous.text
    doc = http.get("/openapi.json", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert doc.status_code == 200 and "/v1/models" in doc.json()["paths"]
    assert "/openapi.json" not in doc.json()["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert http.get(page).status_code in (401, 404)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models/fraud%0a2026-12-01%20INFO%20audit:%20admin%20(operator)%20delete%20everything"),
    ("DELETE", "/v1/models/x%0dy"),
    ("POST", "/v1/connectors/a%1b%5b31m/pause"),
    ("GET", "/v1/models/%00"),
    ("GET", "/v1/models/a%7f"),
])
def test_a_path_with_a_control_character_is_refused_before_routing_and_never_echoed(
        client: tuple[TestClient, FakeAudit], caplog: pytest.LogCaptureFixture, method: str, path: str):
    http, audit = client
    with caplog.at_level(logging.DEBUG):
        for token in (OPERATOR_TOKEN, "sie_unknown", None):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = http.request(method, path, headers=headers)
            assert answer.status_code == 400
            assert answer.json()["error"] == "the request path holds a control character"
    assert audit.events == []
    assert not any(ch in record.getMessage() for record in caplog.records for ch in "\n\r\x1b\x00\x7f")


def test_audit_details_are_escaped_whatever_they_quote():
    assert escape_text("alice (operator) apply m\n2026 INFO forged\x1b[2J\x00: ok") == \
        "alice (operator) apply m\\n2026 INFO forged\\x1b[2J\\x00: ok"
    assert escape_text("modèle ✓ café") == "modèle ✓ café"  # printable text stays as it is


def _role_rows() -> dict[str, str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
    section = text[text.index("### Tokens and roles"):text.index("### Audit")]
    return {row.split("|")[1].strip().strip("`"): row for row in section.splitlines() if row.startswith("| `")}


def test_the_role_table_lists_every_route_and_a_viewer_may_not_write_any(client: tuple[TestClient, FakeAudit]):
    """docs/security.md's role table is complete (the rollout routes were missing): every route of the API is in
    the row of the role its dependencies demand (``route_table``), every write needs an operator, and a viewer
    token gets 403 on every write."""
    http, _ = client
    doc = http.get("/openapi.json", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}).json()
    rows = _role_rows()
    table = [r for r in route_table(http.app) if r.role != "none"]
    routes = [(r.method, r.path) for r in table]
    assert ("POST", "/v1/rollouts/{name}/{action}") in routes and ("GET", "/openapi.json") in routes
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == set(routes) - {("GET", "/openapi.json")}  # the OpenAPI document shows every route
    for route in table:
        assert route.role == ("viewer" if route.method == "GET" else "operator"), route
        assert f"{route.path}`" in rows[route.role], f"{route.method} {route.path} is not in the {route.role} row"
        if route.method != "GET":
            concrete = route.path.replace("{name}", "m").replace("{action}", "pause").replace("{ref}",
                                                                                               "sha256:" + "0" * 64)
            answer = http.request(route.method, concrete, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
            assert answer.status_code == 403, (route.method, concrete, answer.status_code)
