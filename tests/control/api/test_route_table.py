"""The API's one route table is read from the app (``route_table``): each route's role comes from its dependencies,
the status page's files need none, and docs/control-plane.md's table names exactly the routes that exist."""

from __future__ import annotations

import re
from pathlib import Path

from sie.control.api.auth import TokenStore
from sie.control.api.routes import Route, create_app, route_table
from sie.control.service import ControlService
from sie.kernel.settings import Settings

DOC = Path(__file__).resolve().parents[3] / "docs" / "control-plane.md"


def _table(tmp_path: Path) -> list[Route]:
    settings = Settings(cache_dir=tmp_path / "cache")
    return route_table(create_app(ControlService(settings, http_port=None), TokenStore(settings), ()))


def test_every_route_has_the_role_its_dependencies_demand(tmp_path: Path) -> None:
    table = {(r.method, r.path): r.role for r in _table(tmp_path)}
    assert table[("GET", "/v1/models")] == "viewer" and table[("GET", "/healthz")] == "viewer"
    assert table[("POST", "/v1/models")] == "operator"  # through the audited write, which needs an operator
    assert table[("PUT", "/v1/artifacts/{ref}")] == "operator"
    assert {path for (_m, path), role in table.items() if role == "none"} == {"/status", "/status/app.js",
                                                                             "/status/app.css"}
    assert all(role == "operator" for (method, _p), role in table.items() if method != "GET")


def _documented() -> set[tuple[str, str]]:
    """(method, path) of every row of the table in docs/control-plane.md's "HTTP API" section."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## HTTP API"):]
    section = section[:section.index("\n## ", 1)]
    pairs = set()
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3 or not cells[1].startswith("`/"):
            continue
        methods = cells[0].removeprefix("| ").split(", ")
        pairs |= {(m, p) for m in methods for p in re.findall(r"`(/[^`?]*)`", cells[1])}
    return pairs


def test_the_docs_table_names_exactly_the_routes_of_the_app(tmp_path: Path) -> None:
    routes = {(r.method, r.path) for r in _table(tmp_path)}
    documented = _documented()
    assert ("POST", "/v1/rollouts/{name}/{action}") in documented
    assert routes - documented == set(), f"routes missing from docs/control-plane.md: {sorted(routes - documented)}"
    assert documented - routes == set(), f"docs/control-plane.md names routes that do not exist: " \
                                         f"{sorted(documented - routes)}"


def test_every_get_route_declares_its_answer_in_the_openapi_document(tmp_path: Path) -> None:
    """Each GET route's 200 answer has a schema: a response model for JSON (a named component, or a list of
    one), a text media type for the Prometheus metrics and a replica's log."""
    settings = Settings(cache_dir=tmp_path / "cache")
    document = create_app(ControlService(settings, http_port=None), TokenStore(settings), ()).openapi()
    components = document["components"]["schemas"]
    texts = {"/metrics", "/v1/replicas/{replica_id}/log"}
    gets = {path: item["get"] for path, item in document["paths"].items() if "get" in item}
    assert texts < set(gets) and {"/v1/models", "/v1/replicas", "/healthz", "/v1/rollouts/{name}"} < set(gets)
    for path, operation in gets.items():
        content = operation["responses"]["200"]["content"]
        if path in texts:
            assert list(content) == ["text/plain"], path
            continue
        schema = content["application/json"]["schema"]
        refs = [schema.get("$ref"), schema.get("items", {}).get("$ref")] + [s.get("$ref") for s in schema.get("anyOf", ())]
        named = [r.rsplit("/", 1)[1] for r in refs if r]
        assert named and all(components[n].get("properties") for n in named), (path, schema)
    # the open-ended parts stay open; the rest is declared key by key
    replica = components["ReplicaRow"]
    assert set(replica["required"]) >= {"replica_id", "node", "state", "reason", "cooldowns"}
    assert components["Health"]["required"] == ["status", "role", "state_caught_up"]  # what anyone may see
