"""HTTP API of the control plane (stdlib ``ThreadingHTTPServer``; no web framework).

Routes (JSON):
  GET    /v1/models            desired vs actual per model (ModelStatus)
  GET    /v1/models/{name}     one model: status, spec summary, recent events
  POST   /v1/models            YAML or JSON ModelService -> specs topic (202); 422 invalid (field paths);
                               409 a P1/P2 model asking for tier-0 nodes or a schema-breaking version
  DELETE /v1/models/{name}     delete (202), 404 unknown
  GET    /v1/nodes             nodes with liveness, tier, GPUs
  GET    /v1/replicas          every desired replica with node, GPU, state, reason
  GET    /healthz              role (leader/standby), epoch, whether the state has caught up
  GET    /metrics              Prometheus text format

Any instance answers, standby included: reads come from its warm state, writes go to Kafka (the
specs topic), which the leader then reconciles.  An unschedulable spec is still accepted (202): its
reason shows in the model's status, because capacity may appear later (a node joins).
"""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20


def _problem_to_error(problem: str) -> dict[str, str]:
    """``spec.resources.gpuMemoryMb: must be >= 0 (got -5)`` -> field + reason."""
    field, sep, reason = problem.partition(": ")
    return {"field": field, "reason": reason} if sep else {"field": "", "reason": problem}


class ApiError(Exception):
    def __init__(self, status: int, error: str, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.errors = status, error, errors or []


def model_json(service: Any, name: str) -> dict[str, Any] | None:
    status = service.controller.statuses.get(name)
    snap = service.state.snapshot()
    spec = snap.specs.get(name)
    if status is None and spec is None and name not in snap.spec_errors:
        return None
    out: dict[str, Any] = status.to_record() if status is not None else {"name": name, "phase": "Pending", "reason": "not reconciled yet"}
    if spec is not None:
        out["spec"] = {
            "version": spec.version,
            "priority_level": spec.priority_level,
            "service_type": spec.service_type,
            "backend": spec.backend.type,
            "resources": spec.resources.model_dump(mode="json"),
            "scheduling": spec.scheduling.model_dump(mode="json"),
            "min_replicas": spec.sla.min_replicas,
            "max_replicas": spec.sla.max_replicas,
            "topics": spec.topics.model_dump(mode="json"),
        }
    out["events"] = [
        {"ts_ms": int(e.at * 1000), "kind": e.kind, "replica_id": e.replica_id, "node": e.node, "detail": e.detail}
        for e in snap.events
        if e.model == name
    ][-20:]
    return out


class _Handler(BaseHTTPRequestHandler):
    server_version = "sie-control/1"
    service: Any = None  # set by make_server

    def log_message(self, fmt: str, *args: Any) -> None:  # route access logs to logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    # -- plumbing ----------------------------------------------------------------------------------

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (json.dumps(body, indent=2) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        path = urlparse(self.path).path.rstrip("/") or "/"
        try:
            status, body, ctype = self._route(method, path)
            self._send(status, body, ctype)
        except ApiError as exc:
            self._send(exc.status, {"error": exc.error, "errors": exc.errors})
        except Exception as exc:  # the API must answer, never hang up
            log.exception("%s %s failed", method, path)
            self._send(500, {"error": f"{type(exc).__name__}: {exc}", "errors": []})

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # -- routes ------------------------------------------------------------------------------------

    def _route(self, method: str, path: str) -> tuple[int, Any, str]:
        svc = self.service
        if method == "GET" and path == "/healthz":
            return 200, svc.health(), "application/json"
        if method == "GET" and path == "/metrics":
            return 200, svc.metrics.render(), "text/plain; version=0.0.4"
        if method == "GET" and path == "/v1/nodes":
            snap = svc.state.snapshot()
            views = snap.node_views(svc.clock(), svc.config.node_timeout_s)
            return 200, {"nodes": [v.to_json() for v in views]}, "application/json"
        if method == "GET" and path == "/v1/replicas":
            replicas = [r.to_record() for s in svc.controller.statuses.values() for r in s.replicas]
            return 200, {"replicas": sorted(replicas, key=lambda r: r["replica_id"])}, "application/json"
        if path == "/v1/models":
            if method == "GET":
                names = sorted(set(svc.controller.statuses) | set(svc.state.snapshot().specs))
                return 200, {"models": [m for m in (model_json(svc, n) for n in names) if m is not None]}, "application/json"
            if method == "POST":
                return self._post_model()
        if path.startswith("/v1/models/"):
            name = unquote(path[len("/v1/models/"):])
            if method == "GET":
                found = model_json(svc, name)
                if found is None:
                    raise ApiError(404, f"model {name!r} is not applied")
                return 200, found, "application/json"
            if method == "DELETE":
                return self._delete_model(name)
        raise ApiError(404 if method == "GET" else 405, f"no route {method} {path}")

    def _read_body(self) -> str:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0:
            raise ApiError(400, "empty body: send a ModelService as YAML or JSON")
        if length > MAX_BODY:
            raise ApiError(413, f"body of {length} bytes exceeds {MAX_BODY}")
        try:
            return self.rfile.read(length).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "body is not UTF-8 text") from None

    def _post_model(self) -> tuple[int, Any, str]:
        from sie.schemas.spec import InvalidSpec, parse_spec, read_yaml_documents
        from sie.streams.control.placement import validate_tier_request

        svc = self.service
        text = self._read_body()
        try:
            docs = read_yaml_documents(text, "request body")
            if len(docs) != 1 or not isinstance(docs[0], dict):
                raise InvalidSpec("request body", [f"document: expected one ModelService mapping, found {len(docs)} document(s)"])
            spec = parse_spec(docs[0], source="request body", topic_prefix=svc.settings.topic_prefix)
        except InvalidSpec as exc:
            raise ApiError(422, str(exc).splitlines()[0], [_problem_to_error(p) for p in exc.problems]) from None
        snap = svc.state.snapshot()
        conflict = validate_tier_request(spec, snap.inventory(svc.clock(), svc.config.node_timeout_s))
        if conflict:
            raise ApiError(409, conflict, [{"field": "spec.scheduling", "reason": conflict}])
        current = snap.specs.get(spec.name)
        if current is not None and current.version != spec.version:
            from sie.schemas.compat import check_spec_compatibility

            breaks = check_spec_compatibility(current, spec)
            if breaks:
                raise ApiError(409, f"{spec.name} {spec.version}: schema_incompatible with applied {current.version}",
                               [{"field": b.field, "reason": b.detail} for b in breaks])
        from sie.schemas.spec_store import publish_spec

        publish_spec(svc.settings, spec, timeout=15.0, ensure_topic=False)
        return 202, {
            "name": spec.name, "version": spec.version, "accepted": True,
            "status": f"/v1/models/{spec.name}", "warnings": list(spec.warnings),
        }, "application/json"

    def _delete_model(self, name: str) -> tuple[int, Any, str]:
        from sie.schemas.spec_store import delete_spec

        svc = self.service
        spec = svc.state.snapshot().specs.get(name)
        if spec is None:
            raise ApiError(404, f"model {name!r} is not applied")
        delete_spec(svc.settings, spec, timeout=15.0)
        return 202, {"name": name, "deleted": True}, "application/json"


def make_server(service: Any, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("ControlHandler", (_Handler,), {"service": service})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
