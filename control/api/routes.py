"""HTTP API of the control plane: FastAPI on uvicorn, in a thread of ``sie control``.

``create_app`` builds one instance's app: its handles on ``app.state`` (read by the dependencies of ``deps``), one
``APIRouter`` per resource (``routers``: cluster, models, rollouts, nodes, replicas, artifacts, connectors; the
status page), the one error shape (``errors``) and the request guard.  The routes, each with its method and the role
it needs, are ``route_table(app)``; the OpenAPI document is ``GET /openapi.json``; docs/control-plane.md's table
and docs/security.md's role table are checked against them.

Every request needs ``Authorization: Bearer <token>`` (``sie.control.api.auth``): none or an
unknown token -> 401, a viewer token on a write -> 403; ``/healthz`` and ``/metrics`` answer without one when
listed in ``SIE_API_PUBLIC_PATHS`` (an anonymous /healthz says only status, role and whether the state caught up),
the status page's static files always do.  Every write by an authenticated caller (applied, refused, forbidden) is
an audit event (kind ``audit``: who, what, outcome, when) on the events topic.  Errors are
``{"error": ..., "errors": [{"field", "reason"}]}`` and never carry internals: a 500 says only a reference that the
control plane's log has next to the traceback.

WHY FastAPI/Starlette on uvicorn: routing, the OpenAPI document, bearer-auth dependencies and
TLS come from well-kept libraries instead of a hand-written ``http.server``; uvicorn's asyncio server
bounds concurrency (``limit_concurrency``: 503 beyond), header size and keep-alive (``server``), and the guards
(``guard``) add what it lacks: a deadline for a request's headers (slowloris) and for its body, and the
body size cap enforced while reading (not only from Content-Length).

Any instance answers, standby included: reads come from its warm state, writes go to Kafka (the
specs topic), which the leader then reconciles.  An unschedulable spec is still accepted (202): its
reason shows in the model's status, because capacity may appear later (a node joins).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from sie.control.api.audit import AuditLog
from sie.control.api.guard import RequestGuard
from sie.control.api.listing import ListCache
from sie.control.api.routers.models import ARTIFACT_PATH

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
#: seconds a client has to send a request's body once its headers arrived
BODY_TIMEOUT_S = 10.0


def create_app(service: Any, tokens: Any, public_paths: tuple[str, ...] = (), audit: AuditLog | None = None) -> Any:
    """The FastAPI application of one control-plane instance."""
    from fastapi import FastAPI

    from sie.control.api import status_page
    from sie.control.api.errors import install_error_handlers
    from sie.control.api.routers import artifacts, cluster, connectors, models, nodes, replicas, rollouts

    # openapi_url=None: FastAPI would serve the document to anyone; ``routers.cluster`` serves it behind a token
    app = FastAPI(title="SIE control plane", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  description="Model specs, nodes and replicas of one SIE cluster. Bearer token required "
                              "(viewer: GET; operator: POST/DELETE).")
    app.state.service = service
    app.state.tokens = tokens
    app.state.public_paths = public_paths
    app.state.audit = audit or AuditLog(service.settings)
    app.state.lists = ListCache()
    install_error_handlers(app)
    for module in (cluster, models, rollouts, nodes, replicas, artifacts, connectors, status_page):
        app.include_router(module.router)
    # the body cap: 1 MiB, artifact uploads up to SIE_MAX_ARTIFACT_BYTES with the body deadline as an idle limit
    # (a large upload may rightly take minutes)
    app.add_middleware(RequestGuard, max_body=MAX_BODY, body_timeout_s=BODY_TIMEOUT_S,
                       large_bodies=(ARTIFACT_PATH, service.settings.max_artifact_bytes))
    return app


class Route(NamedTuple):
    """One route of the API as ``route_table`` lists it."""

    method: str
    path: str
    role: str  # viewer, operator, or "none" (the status page's static files)
    summary: str


def route_table(app: Any) -> list[Route]:
    """Every route of ``app`` with the role it needs, read from the routes themselves (their dependencies), sorted
    by path then method: the one route table, which docs and tests check against."""
    from fastapi.dependencies.models import Dependant
    from fastapi.routing import APIRoute, iter_route_contexts

    from sie.control.api.deps import Require
    from sie.kernel.settings import API_ROLES

    def roles(dependant: Dependant) -> list[str]:
        return [r for dep in dependant.dependencies
                for r in ([dep.call.role] if isinstance(dep.call, Require) else []) + roles(dep)]

    table = []
    for context in iter_route_contexts(app.routes):  # the included routers' routes, with their prefixes
        route = context.original_route
        if isinstance(route, APIRoute) and context.path is not None:
            role = max(roles(route.dependant), key=API_ROLES.index, default="none")
            table += [Route(method, context.path, role, route.summary or "") for method in sorted(context.methods or ())]
    return sorted(table, key=lambda r: (r.path, r.method))
