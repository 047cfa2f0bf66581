"""HTTP API of the control plane: FastAPI on uvicorn, in a thread of ``sie control``.

Routes (JSON; the OpenAPI document is ``GET /openapi.json``):
  GET    /v1/models            desired vs actual per model (ModelStatus)                      viewer
  GET    /v1/models/{name}     one model: status, spec summary, recent events                 viewer
  POST   /v1/models            YAML or JSON ModelService -> specs topic (202); 422 invalid     operator
                               (field paths, spec policy); 409 a P1/P2 model asking for tier-0
                               nodes or a schema-breaking version
  DELETE /v1/models/{name}     delete (202), 404 unknown                                       operator
  POST   /v1/models/{name}/scale  JSON {"replicas": N} or {"min_replicas", "max_replicas"}: the     operator
                               applied spec re-published with that count (202, recorded like an
                               apply); 404 unknown, 422 invalid, 409 during a rollout
  GET    /v1/artifacts/sha256:<hex>   an uploaded artifact's manifest; 404 when absent         viewer
  PUT    /v1/artifacts/sha256:<hex>?name=FILE   upload (streamed, chunked onto the artifacts      operator
                               topics, checked against the digest: 422 when the bytes differ); 200 if
                               the cluster has it already, 201 created
  GET    /v1/connectors        CDC connectors with their phase                                 viewer
  GET    /v1/connectors/{name} one connector: status, replica, source offsets and lag          viewer
  POST   /v1/connectors        YAML or JSON CdcConnector -> connectors topic (202)             operator
  POST   /v1/connectors/{name}/pause|resume   stop / restart its replica (offsets kept)        operator
  DELETE /v1/connectors/{name} delete (202), 404 unknown                                       operator
  GET    /v1/nodes             nodes with liveness, tier, GPUs                                 viewer
  POST   /v1/nodes/{name}/forget  forget an offline node (202: the leader tombstones it on its     operator
                               next pass); 404 unknown, 409 online
  GET    /v1/replicas/{replica_id}/log  the replica's worker log, proxied from its node's agent (?lines=N,     viewer
                               follow, previous; the caller's token is forwarded: the agent checks it)
  GET    /v1/replicas          every desired replica with node, GPU, state, reason             viewer
  GET    /v1/events            the latest events, cluster-wide (?limit=, at most 500)          viewer
  GET    /v1/prometheus/targets  Prometheus http_sd: every agent's and worker's /metrics        viewer
  GET    /v1/rollouts          every model's rollout: phase, step, weight, epoch, timeline      viewer
  GET    /v1/rollouts/{name}   one model's rollout, 404 none                                  viewer
  POST   /v1/rollouts/{name}/{pause|resume|promote|abort}  steer it (200), 409 not allowed   operator
                               in its phase, 503 on a standby (the leader drives rollouts)
  GET    /healthz              role (leader/standby), epoch, whether the state has caught up   viewer*
  GET    /metrics              Prometheus text format                                          viewer*
  GET    /status               the status page (static HTML + JS; it calls the routes above    none
                               with a viewer token the user types in: ``status_page``)
(* served without a token when listed in ``SIE_API_PUBLIC_PATHS``; an anonymous /healthz then says
only status, role and whether the state caught up, not the error texts.)

Every request needs ``Authorization: Bearer <token>`` (``sie.streams.control.api.auth``): none or an
unknown token -> 401, a viewer token on a write -> 403.  Every write by an authenticated caller
(applied, refused, forbidden) is an audit event (kind ``audit``: who, what, outcome, when) on the
events topic.  Errors are ``{"error": ..., "errors": [{"field", "reason"}]}`` and never carry
internals: a 500 says only a reference that the control plane's log has next to the traceback.

WHY FastAPI/Starlette on uvicorn: routing, the OpenAPI document, bearer-auth dependencies and
TLS come from well-kept libraries instead of a hand-written ``http.server``; uvicorn's asyncio server
bounds concurrency (``limit_concurrency``: 503 beyond), header size and keep-alive (``server``), and the guards
(``guard``) add what it lacks: a deadline for a request's headers (slowloris) and for its body, and the
body size cap enforced while reading (not only from Content-Length).

Any instance answers, standby included: reads come from its warm state, writes go to Kafka (the
specs topic), which the leader then reconciles.  An unschedulable spec is still accepted (202): its
reason shows in the model's status, because capacity may appear later (a node joins).
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route functions' annotations
# (Request, Depends, Principal) as objects, and they are imported inside ``create_app``.
import logging
from collections.abc import Mapping
from typing import Any

from sie.streams.control.api.audit import AuditLog, escape_text
from sie.streams.control.api.guard import RequestGuard

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
#: seconds a client has to send a request's body once its headers arrived
BODY_TIMEOUT_S = 10.0
#: seconds a write waits for Kafka's acknowledgement of the spec record
PUBLISH_TIMEOUT_S = 15.0
#: artifact uploads: their body may be up to SIE_MAX_ARTIFACT_BYTES; the body deadline becomes an idle
#: limit (no bytes for BODY_TIMEOUT_S), since a large upload may rightly take minutes
ARTIFACT_PATH = "/v1/artifacts/"
#: seconds an artifact upload waits for Kafka's acknowledgements (of all its chunks, then its manifest)
UPLOAD_TIMEOUT_S = 120.0


def _problem_to_error(problem: str) -> dict[str, str]:
    """``spec.resources.gpuMemoryMb: must be >= 0 (got -5)`` -> field + reason."""
    field, sep, reason = problem.partition(": ")
    return {"field": field, "reason": reason} if sep else {"field": "", "reason": problem}


class ApiError(Exception):
    def __init__(self, status: int, error: str, errors: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.errors, self.headers = status, error, errors or [], headers


def model_json(service: Any, name: str, numbers: dict[str, dict[str, Any]] | None = None,
               snap: Any = None, events: Mapping[str | None, list[Any]] | None = None) -> dict[str, Any] | None:
    """One model as the API shows it; ``numbers``: ``observability.model_numbers``, ``snap`` the state snapshot and
    ``events`` the snapshot's events by model when already computed (``GET /v1/models`` computes each once for
    every model: a snapshot and an events scan per model made that route quadratic, 1,000 models took seconds)."""
    from sie.streams.control.reconcile.observability import event_rows, model_numbers

    status = service.controller.statuses.get(name)
    snap = snap if snap is not None else service.state.snapshot()
    spec = snap.specs.get(name)
    if status is None and spec is None and name not in snap.spec_errors:
        return None
    out: dict[str, Any]
    if status is not None:
        out = status.to_record()
    elif name in snap.spec_errors:
        out = {"name": name, "phase": "Invalid", "reason": snap.spec_errors[name]}
    else:
        out = {"name": name, "phase": "Pending", "reason": "not reconciled yet"}
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
            "p99_latency_ms": spec.sla.p99_latency_ms,
            "topics": spec.topics.model_dump(mode="json"),
            "digest": spec.digest(),
            "owner": spec.owner,
        }
    if numbers is None:
        numbers = model_numbers(snap, service.clock(), service.config.node_timeout_s)
    # from the workers, through their agents' heartbeats: lag (sum), recent p99 (worst replica)
    out["live"] = numbers.get(name, {"lag": None, "p99_ms": None, "reporting": 0})
    mine = events.get(name, []) if events is not None else [e for e in snap.events if e.model == name]
    out["events"] = event_rows(mine, 20)
    return out


# --------------------------------------------------------------------------------------- app


def create_app(service: Any, tokens: Any, public_paths: tuple[str, ...] = (), audit: AuditLog | None = None) -> Any:
    """The FastAPI application of one control-plane instance."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from sie.streams.control.api.auth import Principal

    # openapi_url=None: FastAPI would serve the document to anyone; it is served below, behind a token
    app = FastAPI(title="SIE control plane", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  description="Model specs, nodes and replicas of one SIE cluster. Bearer token required "
                              "(viewer: GET; operator: POST/DELETE).")
    bearer = HTTPBearer(auto_error=False, description="An API token (sie token create; SIE_API_TOKEN).")
    audit = audit or AuditLog(service.settings)

    def _client(request: Request) -> str:
        return f"{request.client.host}:{request.client.port}" if request.client else "unknown"

    def authenticate(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal | None:
        principal = tokens.authenticate(creds.credentials if creds is not None else None)
        if principal is None and creds is not None:
            log.warning("rejected an unknown token for %s %s from %s", request.method, escape_text(request.url.path),
                        _client(request))
        return principal

    def require(role: str, public: str | None = None) -> Any:
        def dependency(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal | None:
            principal = authenticate(request, creds)
            if principal is None:
                if public is not None and public in public_paths:
                    return None
                raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>' (a token from "
                                    "`sie token create`, or the operator token file; SIE_API_TOKEN for the CLI)",
                               headers={"WWW-Authenticate": "Bearer"})
            if not principal.may(role):
                if request.method in ("POST", "PUT", "DELETE"):
                    name = request.path_params.get("name")
                    audit.record(principal, f"{request.method} {request.url.path}", name, "forbidden", _client(request))
                raise ApiError(403, f"token {principal.name!r} has role {principal.role}; "
                                    f"{request.method} {request.url.path} needs role {role}")
            request.state.principal = principal
            return principal
        return dependency

    viewer = require("viewer")
    operator = require("operator")

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_: Principal = Depends(viewer)) -> dict[str, Any]:
        """The OpenAPI document: what routes exist is for holders of a token, like everything else."""
        return app.openapi()

    # -- errors: one shape, no internals ------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "errors": exc.errors}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        text = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse({"error": text, "errors": []}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": ".".join(map(str, e.get("loc", ()))), "reason": str(e.get("msg", ""))} for e in exc.errors()]
        return JSONResponse({"error": "invalid request", "errors": errors}, status_code=422)

    # -- reads ----------------------------------------------------------------------------------------
    @app.get("/healthz", summary="Role, epoch and whether this instance's state caught up")
    def healthz(principal: Principal | None = Depends(require("viewer", public="/healthz"))) -> dict[str, Any]:
        health = service.health()
        if principal is None:  # anonymous (public path): no error texts, which may name hosts
            return {k: health[k] for k in ("status", "role", "state_caught_up")}
        return health

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics(_: Principal | None = Depends(require("viewer", public="/metrics"))) -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    # The list routes answer plain JSON data as it is (JSONResponse): FastAPI's generic encoder walks every value
    # of an answer again, 80 ms of CPU for 3,000 replicas in the leader's process (bench/bench_scale.py).
    @app.get("/v1/nodes", summary="Registered nodes with liveness, tier and GPUs", response_class=JSONResponse)
    def nodes(_: Principal = Depends(viewer)) -> Any:
        snap = service.state.snapshot()
        views = snap.node_views(service.clock(), service.config.node_timeout_s)
        return JSONResponse({"nodes": [v.to_json() for v in views]})

    @app.get("/v1/replicas", summary="Every desired replica: node, GPUs, state, reason", response_class=JSONResponse)
    def replicas(_: Principal = Depends(viewer)) -> Any:
        items = [r.to_record() for s in service.controller.statuses.values() for r in s.replicas]
        return JSONResponse({"replicas": sorted(items, key=lambda r: r["replica_id"])})

    @app.get("/v1/replicas/{replica_id}/log", summary="A replica's worker log, from its node's agent (like kubectl logs)",
             response_class=StreamingResponse)
    async def replica_log(replica_id: str, request: Request, lines: int = 100, follow: bool = False,
                          previous: bool = False, _: Principal = Depends(viewer)) -> Any:
        return await _proxy_log(service, replica_id, request.headers.get("authorization") or "",
                                {"lines": str(lines), "follow": "1" if follow else "0",
                                 "previous": "1" if previous else "0"}, follow)

    @app.get("/v1/models", summary="Desired vs actual per applied model", response_class=JSONResponse)
    def models(_: Principal = Depends(viewer)) -> Any:
        from sie.streams.control.reconcile.observability import model_numbers

        snap = service.state.snapshot()
        names = sorted(set(service.controller.statuses) | set(snap.specs) | set(snap.spec_errors))
        numbers = model_numbers(snap, service.clock(), service.config.node_timeout_s)
        events: dict[str | None, list[Any]] = {}
        for e in snap.events:
            events.setdefault(e.model, []).append(e)
        return JSONResponse({"models": [m for m in (model_json(service, n, numbers, snap, events) for n in names)
                                        if m is not None]})

    @app.get("/v1/events", summary="The latest events of the cluster (placements, failures, audit)")
    def events(limit: int = 50, _: Principal = Depends(viewer)) -> dict[str, Any]:
        from sie.streams.control.reconcile.observability import event_rows

        if not 1 <= limit <= 500:
            raise ApiError(422, f"limit: must be between 1 and 500 (got {limit})",
                           [{"field": "limit", "reason": "must be between 1 and 500"}])
        return {"events": event_rows(service.state.snapshot().events, limit)}

    @app.get("/v1/prometheus/targets", summary="Prometheus http_sd: the /metrics endpoints of agents and workers")
    def prometheus_targets(_: Principal = Depends(viewer)) -> list[dict[str, Any]]:
        from sie.streams.control.reconcile.observability import prometheus_targets

        return prometheus_targets(service.state.snapshot(), service.clock(), service.config.node_timeout_s)

    from sie.streams.control.api.status_page import add_status_page

    add_status_page(app)

    @app.get("/v1/models/{name}", summary="One model: status, spec summary, recent events")
    def model(name: str, _: Principal = Depends(viewer)) -> dict[str, Any]:
        found = model_json(service, name)
        if found is None:
            raise ApiError(404, f"model {name!r} is not applied")
        return found

    # -- writes ---------------------------------------------------------------------------------------
    body_doc = {"requestBody": {"required": True, "content": {
        "application/yaml": {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}},
        "description": f"One ModelService document (YAML or JSON, at most {MAX_BODY} bytes)."}}

    async def _apply(request: Request, principal: Principal) -> JSONResponse:
        raw = await request.body()
        client = _client(request)
        adopt = request.query_params.get("adopt") in ("1", "true")
        try:
            status, body = await run_in_threadpool(_post_model, service, raw, adopt)
        except ApiError as exc:
            audit.record(principal, "apply", None, f"refused {exc.status}: {exc.error}", client)
            raise
        audit.record(principal, "apply", body["name"], f"accepted version {body['version']}", client)
        return JSONResponse(body, status_code=status)

    @app.post("/v1/models", status_code=202, summary="Apply a ModelService (publish it on the specs topic)",
              openapi_extra=body_doc)
    async def post_model(request: Request, principal: Principal = Depends(operator)) -> JSONResponse:
        return await _apply(request, principal)

    @app.put("/v1/models", status_code=202, summary="Same as POST", openapi_extra=body_doc)
    async def put_model(request: Request, principal: Principal = Depends(operator)) -> JSONResponse:
        return await _apply(request, principal)

    @app.delete("/v1/models/{name}", status_code=202, summary="Delete an applied model")
    async def delete_model(name: str, request: Request, principal: Principal = Depends(operator)) -> JSONResponse:
        try:
            body = await run_in_threadpool(_delete_model, service, name, request.query_params.get("owner"))
        except ApiError as exc:
            audit.record(principal, "delete", name, f"refused {exc.status}: {exc.error}", _client(request))
            raise
        audit.record(principal, "delete", name, "accepted", _client(request))
        return JSONResponse(body, status_code=202)

    @app.post("/v1/models/{name}/scale", status_code=202, summary="Set a model's replica count (or its bounds)")
    async def scale_model(name: str, request: Request, principal: Principal = Depends(operator)) -> JSONResponse:
        raw = await request.body()
        try:
            body = await run_in_threadpool(_scale_model, service, name, raw)
        except ApiError as exc:
            audit.record(principal, "scale", name, f"refused {exc.status}: {exc.error}", _client(request))
            raise
        audit.record(principal, "scale", name, f"accepted: {body['change']}", _client(request))
        return JSONResponse(body, status_code=202)

    @app.post("/v1/nodes/{name}/forget", status_code=202, summary="Forget an offline node (inventory, status, alerts)")
    async def forget_node(name: str, request: Request, principal: Principal = Depends(operator)) -> JSONResponse:
        who = f"{principal.name} via the API"
        try:
            body = await run_in_threadpool(_forget_node, service, name, who)
        except ApiError as exc:
            audit.record(principal, "forget node", name, f"refused {exc.status}: {exc.error}", _client(request))
            raise
        audit.record(principal, "forget node", name, "accepted", _client(request))
        return JSONResponse(body, status_code=202)

    @app.get("/v1/rollouts", summary="Every model's rollout: phase, step, canary weight, epoch, timeline")
    def rollouts(_: Principal = Depends(viewer)) -> dict[str, Any]:
        return {"rollouts": service.rollouts.list()}

    @app.get("/v1/rollouts/{name}", summary="One model's rollout")
    def rollout(name: str, _: Principal = Depends(viewer)) -> dict[str, Any]:
        found = [r for r in service.rollouts.list() if r["model"] == name]
        if not found:
            raise ApiError(404, f"model {name!r} has no rollout")
        return found[0]

    @app.post("/v1/rollouts/{name}/{action}", summary="pause, resume, promote or abort a model's rollout")
    async def rollout_action(name: str, action: str, request: Request,
                             principal: Principal = Depends(operator)) -> dict[str, Any]:
        try:
            body = await run_in_threadpool(_rollout_action, service, name, action, principal.name)
        except ApiError as exc:
            audit.record(principal, f"rollout {action}", name, f"refused {exc.status}: {exc.error}", _client(request))
            raise
        audit.record(principal, f"rollout {action}", name, f"accepted: {body['label']}", _client(request))
        return body

    _artifact_routes(app, service, operator, viewer, audit, _client)
    _connector_routes(app, service, operator, viewer, audit, _client)
    app.add_middleware(RequestGuard, max_body=MAX_BODY, body_timeout_s=BODY_TIMEOUT_S,
                       large_bodies=(ARTIFACT_PATH, service.settings.max_artifact_bytes))
    return app


def _log_source(service: Any, replica_id: str) -> tuple[str, str]:
    """(node, agent address) of the replica whose log is asked for; ``ApiError`` saying why there is none."""
    node = next((r.node for s in service.controller.statuses.values() for r in s.replicas if r.replica_id == replica_id),
                "")
    if node == "":
        raise ApiError(404, f"replica {replica_id!r} is not a replica the control plane knows (sie get replicas)")
    if node is None:
        raise ApiError(404, f"replica {replica_id} is on no node now (see its reason: sie get replicas)")
    hb = service.state.snapshot().heartbeats.get(node)
    address = hb.metrics_address if hb is not None else None
    if not address:
        raise ApiError(503, f"node {node}'s agent serves no HTTP port for logs: start it with --metrics-port "
                            "(the chart does), or read the log on that machine (sie logs REPLICA there)")
    return node, address


async def _proxy_log(service: Any, replica_id: str, authorization: str, params: dict[str, str], follow: bool) -> Any:
    """Stream the agent's answer through (``sie.workers.agent.http``); the caller's token goes with it."""
    from urllib.parse import quote

    import httpx
    from fastapi.responses import StreamingResponse

    node, address = _log_source(service, replica_id)
    client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None if follow else 30.0), follow_redirects=False)
    request = client.build_request("GET", f"http://{address}/v1/replicas/{quote(replica_id, safe='')}/log",
                                   params=params, headers={"Authorization": authorization})
    try:
        upstream = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise ApiError(502, f"the agent of node {node} ({address}) did not answer ({type(exc).__name__}); is it "
                            "running and reachable from the control plane?") from None
    if upstream.status_code != 200:
        text = (await upstream.aread()).decode("utf-8", "replace").strip()[:300]
        await upstream.aclose()
        await client.aclose()
        raise ApiError(upstream.status_code if upstream.status_code in (400, 401, 404) else 502, f"node {node}: {text}")

    async def relay() -> Any:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            await client.aclose()

    return StreamingResponse(relay(), media_type="text/plain; charset=utf-8", headers={"X-Sie-Node": node})


def _read_document(raw: bytes, what: str) -> Any:
    """The single YAML/JSON document of a body (the bounded, alias-free spec reader)."""
    from sie.schemas.spec import InvalidSpec, read_yaml_documents

    if not raw:
        raise ApiError(400, f"empty body: send a {what} as YAML or JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "body is not UTF-8 text") from None
    try:
        docs = read_yaml_documents(text, "request body")
    except InvalidSpec as exc:
        raise ApiError(422, str(exc).splitlines()[0], [_problem_to_error(p) for p in exc.problems]) from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ApiError(422, f"document: expected one {what} mapping, found {len(docs)} document(s)")
    return docs[0]


# ------------------------------------------------------------------------------------ artifacts


def _parse_artifact_ref(ref: str) -> str:
    import re

    match = re.fullmatch(r"sha256:([0-9a-f]{64})", ref)
    if match is None:
        raise ApiError(422, "the artifact is named 'sha256:<64 lowercase hex digits>' (sha256sum FILE)",
                       [{"field": "path", "reason": f"not sha256:<hex> (got {ref[:80]!r})"}])
    return match.group(1)


def _artifact_routes(app: Any, service: Any, operator: Any, viewer: Any, audit: Any, client_of: Any) -> None:
    from fastapi import Depends, Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from sie.schemas.artifact_cache import ArtifactRefused, ArtifactUnavailable

    @app.get("/v1/artifacts/{ref}", summary="An uploaded artifact's manifest (size, chunks)")
    def get_artifact(ref: str, _: Any = Depends(viewer)) -> dict[str, Any]:
        sha = _parse_artifact_ref(ref)
        manifest = service.artifacts.known(sha)
        if manifest is None:
            raise ApiError(404, f"artifact sha256:{sha} is not on the cluster; upload it (PUT {ARTIFACT_PATH}"
                                f"sha256:{sha[:12]}..., or sie apply)")
        return dict(manifest.to_json())

    @app.put("/v1/artifacts/{ref}", summary="Upload an artifact (raw bytes; checked against the sha256 in the path)",
             openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}})
    async def put_artifact(ref: str, request: Request, name: str = "artifact",
                           principal: Any = Depends(operator)) -> JSONResponse:
        from pydantic import ValidationError

        from sie.schemas.spec_models import ArtifactRef

        client = client_of(request)
        sha = _parse_artifact_ref(ref)
        try:
            ArtifactRef(sha256=sha, name=name)
        except ValidationError:
            raise ApiError(422, "name: a file name of letters, digits, '.', '_', '+' or '-' (its suffix tells "
                                "the format)", [{"field": "query.name", "reason": f"got {name[:80]!r}"}]) from None
        action = f"upload artifact sha256:{sha[:12]}"
        existing = await run_in_threadpool(service.artifacts.known, sha)
        if existing is not None:
            audit.record(principal, action, None, "already on the cluster", client)
            return JSONResponse({**existing.to_json(), "created": False}, status_code=200)
        try:
            upload = await run_in_threadpool(service.artifacts.store.begin, sha, name, UPLOAD_TIMEOUT_S)
            pending = bytearray()
            async for piece in request.stream():
                pending.extend(piece)
                if len(pending) >= (1 << 20):
                    await run_in_threadpool(upload.add, bytes(pending))
                    pending.clear()
            if pending:
                await run_in_threadpool(upload.add, bytes(pending))
            manifest = await run_in_threadpool(upload.finish)
        except ArtifactRefused as exc:
            audit.record(principal, action, None, f"refused 422: {exc}", client)
            raise ApiError(422, str(exc), [{"field": "body", "reason": str(exc)}]) from None
        except ArtifactUnavailable as exc:
            audit.record(principal, action, None, f"failed 503: {exc}", client)
            raise ApiError(503, f"{exc}; try again") from None
        service.artifacts.remember(manifest)
        audit.record(principal, action, None, f"stored {manifest.size} bytes in {manifest.chunks} chunks", client)
        return JSONResponse({**manifest.to_json(), "created": True}, status_code=201)


# ----------------------------------------------------------------------------------- connectors


def _connector_routes(app: Any, service: Any, operator: Any, viewer: Any, audit: Any, client_of: Any) -> None:
    from urllib.parse import quote

    from fastapi import Depends, Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from sie.schemas.connector_spec import ConnectorSpecError, connector_name_problems, parse_connector_spec
    from sie.schemas.connector_store import delete_connector, publish_connector
    from sie.streams.control.reconcile.connectors import connector_offsets, connector_status

    def status_of(name: str) -> dict[str, Any] | None:
        report = service.controller.last_report
        return connector_status(name, service.state.snapshot(), report.plan if report else None, service.clock(),
                                service.config.node_timeout_s)

    def current(name: str) -> Any:
        info = service.state.snapshot().connectors.get(name)
        if info is None:
            raise ApiError(404, f"connector {name!r} is not applied")
        return info

    @app.get("/v1/connectors", summary="CDC connectors applied through the control plane, with their phase")
    def connectors(_: Any = Depends(viewer)) -> dict[str, Any]:
        snap = service.state.snapshot()
        names = sorted(set(snap.connectors) | set(snap.connector_errors))
        return {"connectors": [c for c in (status_of(n) for n in names) if c is not None]}

    @app.get("/v1/connectors/{name}", summary="One connector: status, replica, source offsets and lag")
    def connector(name: str, _: Any = Depends(viewer)) -> dict[str, Any]:
        found = status_of(name)
        if found is None:
            raise ApiError(404, f"connector {name!r} is not applied")
        info = service.state.snapshot().connectors.get(name)
        if info is not None:
            found["offsets"] = connector_offsets(service.settings, info.spec, service.clients)
        return found

    async def _guarded(request: Request, principal: Any, action: str, name: str | None, fn: Any) -> JSONResponse:
        try:
            body = await run_in_threadpool(fn)
        except ApiError as exc:
            audit.record(principal, action, name, f"refused {exc.status}: {exc.error}", client_of(request))
            raise
        audit.record(principal, action, body.get("name", name), "accepted", client_of(request))
        return JSONResponse(body, status_code=202)

    @app.post("/v1/connectors", status_code=202, summary="Apply a CdcConnector (publish it on the connectors topic)")
    async def post_connector(request: Request, principal: Any = Depends(operator)) -> JSONResponse:
        raw = await request.body()

        def apply() -> dict[str, Any]:
            doc = _read_document(raw, "CdcConnector")
            try:
                spec = parse_connector_spec(doc, source="request body")
            except ConnectorSpecError as exc:
                text = str(exc).removeprefix("request body: ")
                raise ApiError(422, f"invalid CdcConnector: {text}",
                               [_problem_to_error(p) for p in text.split("; ")]) from None
            problems = connector_name_problems(spec, service.settings.topic_prefix)
            if problems:
                raise ApiError(422, f"invalid CdcConnector: {'; '.join(problems)}",
                               [_problem_to_error(p) for p in problems])
            existing = service.state.snapshot().connectors.get(spec.name)
            paused = existing.paused if existing is not None else False  # operator state survives a re-apply
            publish_connector(service.settings, spec, paused, timeout=PUBLISH_TIMEOUT_S)
            return {"name": spec.name, "paused": paused, "accepted": True,
                    "status": f"/v1/connectors/{quote(spec.name, safe='')}"}

        return await _guarded(request, principal, "apply connector", None, apply)

    def _set_paused(name: str, paused: bool) -> dict[str, Any]:
        info = current(name)
        if info.paused != paused:
            publish_connector(service.settings, info.spec, paused, timeout=PUBLISH_TIMEOUT_S)
        return {"name": name, "paused": paused, "accepted": True}

    @app.post("/v1/connectors/{name}/pause", status_code=202, summary="Pause: its replica drains, offsets stay committed")
    async def pause(name: str, request: Request, principal: Any = Depends(operator)) -> JSONResponse:
        return await _guarded(request, principal, "pause connector", name, lambda: _set_paused(name, True))

    @app.post("/v1/connectors/{name}/resume", status_code=202, summary="Resume from the committed offsets")
    async def resume(name: str, request: Request, principal: Any = Depends(operator)) -> JSONResponse:
        return await _guarded(request, principal, "resume connector", name, lambda: _set_paused(name, False))

    @app.delete("/v1/connectors/{name}", status_code=202, summary="Delete a connector (its replica drains)")
    async def delete(name: str, request: Request, principal: Any = Depends(operator)) -> JSONResponse:
        def remove() -> dict[str, Any]:
            delete_connector(service.settings, current(name).spec, timeout=PUBLISH_TIMEOUT_S)
            return {"name": name, "deleted": True}

        return await _guarded(request, principal, "delete connector", name, remove)


def _rollout_action(service: Any, name: str, action: str, who: str) -> dict[str, Any]:
    from sie.streams.control.rollout.machine import RolloutError
    from sie.streams.control.rollout.service import NotLeader, describe

    try:
        return describe(service.rollouts.act(name, action, who))
    except NotLeader as exc:
        raise ApiError(503, f"{exc}; send it to the leader ({service.state.leader_instance or 'unknown'})") from None
    except RolloutError as exc:
        status = 404 if "no rollout" in str(exc) else 422 if "must be pause" in str(exc) else 409
        raise ApiError(status, str(exc)) from None


def _ownership_problem(current: Any, owner: str | None, adopt: bool = False) -> str | None:
    """Why a write marked ``owner`` may not replace or delete ``current`` (the applied spec), or None.  A write
    without a mark (``sie apply``, a person through the API) may; a marked one (the Kubernetes operator) only
    over its own mark, over no applied model, or adopting an unmarked model (``adopt``: a model the operator
    applied before marks existed, which it proves from the ModelService's status)."""
    if current is None or owner is None or current.owner == owner or (adopt and current.owner is None):
        return None
    by = current.owner or "sie apply or the API (no owner mark)"
    return (f"model {current.name!r} is managed by {by}, not by {owner}: delete it there first (or "
            f"sie delete model {current.name}), or give this one another name")


def _post_model(service: Any, raw: bytes, adopt: bool = False) -> tuple[int, dict[str, Any]]:
    from sie.schemas.spec import InvalidSpec, load, read_yaml_documents
    from sie.streams.control.placement.engine import validate_tier_request

    if not raw:
        raise ApiError(400, "empty body: send a ModelService as YAML or JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "body is not UTF-8 text") from None
    try:
        docs = read_yaml_documents(text, "request body")
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise InvalidSpec("request body", [f"document: expected one ModelService mapping, found {len(docs)} document(s)"])
        spec = load(docs[0], origin="request body", topic_prefix=service.settings.topic_prefix)
        service.spec_policy.enforce(spec, "request body")
    except InvalidSpec as exc:
        raise ApiError(422, str(exc).splitlines()[0], [_problem_to_error(p) for p in exc.problems]) from None
    snap = service.state.snapshot()
    from sie.streams.control.placement.inventory import ClusterInventory

    # only a P1/P2 nodeSelector is checked against the nodes: no inventory built for every other apply
    nodes = (snap.inventory(service.clock(), service.config.node_timeout_s)
             if spec.scheduling.node_selector and spec.priority_level != "P0" else ClusterInventory())
    conflict = validate_tier_request(spec, nodes)
    if conflict:
        raise ApiError(409, conflict, [{"field": "spec.scheduling", "reason": conflict}])
    current = snap.specs.get(spec.name)
    owned = _ownership_problem(current, spec.owner, adopt)
    if owned:
        raise ApiError(409, owned, [{"field": "metadata.annotations.sie.lmsys.org/owner", "reason": owned}])
    if current is not None and current.version != spec.version:
        from sie.schemas.compat import check_spec_compatibility

        breaks = check_spec_compatibility(current, spec)
        if breaks:
            raise ApiError(409, f"{spec.name} {spec.version}: schema_incompatible with applied {current.version}",
                           [{"field": b.field, "reason": b.detail} for b in breaks])
    missing = [
        {"field": f"spec.backend.{field}", "reason": f"{ref.label} is not on the cluster's artifacts topic; upload "
                                                      f"it first (PUT {ARTIFACT_PATH}sha256:<hex>, or sie apply -f)"}
        for field, ref in (("artifact", spec.backend.artifact_ref), ("modules", spec.backend.modules))
        if ref is not None and ref.uri is None and service.artifacts.known(ref.sha256) is None]
    if missing:
        raise ApiError(422, missing[0]["reason"], missing)
    if current is not None and current.version != spec.version:
        if service.rollouts.active(spec.name):
            raise ApiError(409, f"{spec.name}: a rollout is in progress; promote or abort it first "
                                f"(sie rollout abort {spec.name})", [{"field": "spec.version", "reason": "in_progress"}])
        if spec.rollout is not None:  # the spec asks for a rollout: the leader moves traffic step by step
            return _start_rollout(service, current, spec)
    from sie.schemas.spec_store import publish_spec

    publish_spec(service.settings, spec, timeout=PUBLISH_TIMEOUT_S, ensure_topic=False, writer=service.spec_writer)
    return 202, {"name": spec.name, "version": spec.version, "accepted": True,
                 "status": f"/v1/models/{spec.name}", "warnings": list(spec.warnings)}


def _start_rollout(service: Any, current: Any, spec: Any) -> tuple[int, dict[str, Any]]:
    from sie.streams.control.rollout.driver import RolloutRefused
    from sie.streams.control.rollout.service import NotLeader

    try:
        entry = service.rollouts.begin(current, spec)
    except NotLeader as exc:
        raise ApiError(503, f"{exc}; send it to the leader ({service.state.leader_instance or 'unknown'})") from None
    except RolloutRefused as exc:
        raise ApiError(409, str(exc), [{"field": "spec.version", "reason": exc.kind}]) from None
    return 202, {"name": spec.name, "version": spec.version, "accepted": True, "rollout": entry.rollout.label,
                 "status": f"/v1/rollouts/{spec.name}", "warnings": list(spec.warnings)}


def _scale_model(service: Any, name: str, raw: bytes) -> dict[str, Any]:
    """``POST /v1/models/{name}/scale``: the applied spec with the asked-for count, published like an apply
    (``sie.schemas.spec_scale``)."""
    import json

    from pydantic import ValidationError

    from sie.schemas.spec_scale import ScaleError, ScaleRequest, describe_change, scaled
    from sie.schemas.spec_store import publish_spec

    try:
        ask = ScaleRequest.model_validate(json.loads(raw or b"null"))
    except (ValueError, ValidationError) as exc:
        errors = ([{"field": ".".join(map(str, e.get("loc", ()))), "reason": str(e["msg"])} for e in exc.errors()]
                  if isinstance(exc, ValidationError) else [{"field": "body", "reason": "not JSON"}])
        raise ApiError(422, 'send JSON {"replicas": N} or {"min_replicas": A, "max_replicas": B}', errors) from None
    spec = service.state.snapshot().specs.get(name)
    if spec is None:
        raise ApiError(404, f"model {name!r} is not applied")
    if service.rollouts.active(name):
        raise ApiError(409, f"{name}: a rollout is in progress; scale it once it is promoted or aborted "
                            f"(sie rollout status {name})", [{"field": "name", "reason": "rollout in progress"}])
    try:
        new = scaled(spec, ask)
    except ScaleError as exc:
        raise ApiError(422, str(exc), [{"field": "body", "reason": str(exc)}]) from None
    publish_spec(service.settings, new, timeout=PUBLISH_TIMEOUT_S, ensure_topic=False, writer=service.spec_writer)
    return {"name": name, "version": new.version, "accepted": True, "change": describe_change(spec, new),
            "min_replicas": new.sla.min_replicas, "max_replicas": new.sla.max_replicas,
            "status": f"/v1/models/{name}"}


def _forget_node(service: Any, name: str, who: str) -> dict[str, Any]:
    """``POST /v1/nodes/{name}/forget``: a ``node_forget_requested`` event; the leader forgets the node on its next
    pass if it is still offline (``Controller._forget_nodes``)."""
    from sie.schemas.avro_codec import encode
    from sie.schemas.spec_store import produce_acknowledged
    from sie.streams.control.reconcile.records import NODE_FORGET_KIND

    snap = service.state.snapshot()
    views = {v.name: v for v in snap.node_views(service.clock(), service.config.node_timeout_s)}
    view = views.get(name)
    if view is None:
        raise ApiError(404, f"node {name!r} is not registered (nodes: {', '.join(sorted(views)) or 'none'})")
    if view.online:
        raise ApiError(409, f"node {name!r} is online (a heartbeat within {service.config.node_timeout_s:g}s): stop "
                            "its agent first; only an offline node can be forgotten")
    record = {"ts_ms": int(service.clock() * 1000), "kind": NODE_FORGET_KIND, "model": None, "replica_id": None,
              "node": name, "detail": f"forget node {name} requested by {who}"}
    produce_acknowledged(service.settings, [(name, encode("ControlEvent", record))], PUBLISH_TIMEOUT_S,
                         topic=service.settings.names.system_topic("events"), writer=service.spec_writer)
    return {"name": name, "accepted": True, "status": "/v1/nodes"}


def _delete_model(service: Any, name: str, owner: str | None = None) -> dict[str, Any]:
    """``owner``: delete only if the applied spec carries this mark (the operator's ``?owner=``), else 409."""
    from sie.schemas.spec_store import delete_spec

    spec = service.state.snapshot().specs.get(name)
    if spec is None:
        raise ApiError(404, f"model {name!r} is not applied")
    if owner is not None and spec.owner != owner:
        raise ApiError(409, _ownership_problem(spec, owner) or f"model {name!r} is not managed by {owner}")
    delete_spec(service.settings, spec, timeout=PUBLISH_TIMEOUT_S, writer=service.spec_writer)
    return {"name": name, "deleted": True}
