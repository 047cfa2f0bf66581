"""What the control API's routes receive as FastAPI dependencies instead of closure captures.

``create_app`` puts the instance's handles on ``app.state`` (``service``: the ``ControlService``; ``tokens``: the
``TokenStore``; ``audit``: the ``AuditLog``; ``public_paths``; ``lists``: the list routes' ``ListCache``); a route
names what it needs:

  ``Service``     the ControlService (state, controller, rollouts, artifacts, settings)
  ``Lists``       what the list routes keep between requests (``listing.ListCache``)
  ``Viewer``      the caller, any valid token (401 without one)
  ``Operator``    the caller, an operator token (403 for a viewer; a refused write is audited)
  ``Writer``      an operator's write: runs the work in a thread and audits what came of it
  ``Client``      the caller's address, as audit lines show it
  ``Limit``, ``After``, ``ModelFilter``, ``NodeFilter``  the list routes' query parameters (``listing``)

| failure                                   | answer                                                  |
|-------------------------------------------|---------------------------------------------------------|
| no token, or an unknown one               | 401 + ``WWW-Authenticate: Bearer`` (an unknown one logged, never the token) |
| a token whose role is below the route's   | 403 naming token, role and route; a write is audited ``forbidden`` |
| the work raises ``ApiError``              | audited ``refused <status>: <error>``, then answered    |
"""

# No ``from __future__ import annotations``: FastAPI reads these annotations (Request, Depends) as objects.
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from sie.control.api.audit import AuditLog, escape_text
from sie.control.api.auth import Principal
from sie.control.api.errors import ApiError
from sie.control.api.listing import MAX_LIMIT, ListCache

log = logging.getLogger(__name__)

bearer = HTTPBearer(auto_error=False, description="An API token (sie token create; SIE_API_TOKEN).")


def get_service(request: Request) -> Any:
    return request.app.state.service


def get_lists(request: Request) -> ListCache:
    lists: ListCache = request.app.state.lists
    return lists


def get_audit(request: Request) -> AuditLog:
    audit: AuditLog = request.app.state.audit
    return audit


def client_of(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "unknown"


class Require:
    """The dependency admitting callers whose token has ``role`` or above; ``public``: a path that answers without
    a token (the principal is then None) when listed in ``SIE_API_PUBLIC_PATHS``.  ``routes.route_table`` reads
    ``role`` to say what each route needs."""

    def __init__(self, role: str, public: str | None = None) -> None:
        self.role, self.public = role, public

    def __call__(self, request: Request,
                 creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal | None:
        state = request.app.state
        principal: Principal | None = state.tokens.authenticate(creds.credentials if creds is not None else None)
        if principal is None and creds is not None:
            log.warning("rejected an unknown token for %s %s from %s", request.method, escape_text(request.url.path),
                        client_of(request))
        if principal is None:
            if self.public is not None and self.public in state.public_paths:
                return None
            raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>' (a token from "
                                "`sie token create`, or the operator token file; SIE_API_TOKEN for the CLI)",
                           headers={"WWW-Authenticate": "Bearer"})
        if not principal.may(self.role):
            if request.method in ("POST", "PUT", "DELETE"):
                name = request.path_params.get("name")
                state.audit.record(principal, f"{request.method} {request.url.path}", name, "forbidden",
                                   client_of(request))
            raise ApiError(403, f"token {principal.name!r} has role {principal.role}; "
                                f"{request.method} {request.url.path} needs role {self.role}")
        request.state.principal = principal
        return principal


viewer = Require("viewer")
operator = Require("operator")

Service = Annotated[Any, Depends(get_service)]
Lists = Annotated[ListCache, Depends(get_lists)]
Viewer = Annotated[Principal, Depends(viewer)]
Operator = Annotated[Principal, Depends(operator)]
Audit = Annotated[AuditLog, Depends(get_audit)]
Client = Annotated[str, Depends(client_of)]


@dataclass(frozen=True)
class Write:
    """An operator's write: who, from where, and the audit log its outcome goes to."""

    principal: Principal
    client: str
    audit: AuditLog

    async def run(self, action: str, name: str | None, work: Callable[[], dict[str, Any]],
                  outcome: Callable[[dict[str, Any]], str] = lambda _body: "accepted",
                  subject: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
        """``work()`` in a worker thread (it waits on Kafka); audited as refused (its ``ApiError``) or as
        ``outcome(body)`` about ``subject(body)`` (default: ``name``)."""
        try:
            body = await run_in_threadpool(work)
        except ApiError as exc:
            self.record(action, name, f"refused {exc.status}: {exc.error}")
            raise
        self.record(action, subject(body) if subject is not None else name, outcome(body))
        return body

    def record(self, action: str, name: str | None, outcome: str) -> None:
        self.audit.record(self.principal, action, name, outcome, self.client)


def writer(principal: Operator, audit: Audit, client: Client) -> Write:
    return Write(principal, client, audit)


Writer = Annotated[Write, Depends(writer)]


#: the query parameters the list routes share, declared once (FastAPI checks the limit: 422 naming it)
Limit = Annotated[int | None, Query(ge=1, le=MAX_LIMIT, description="At most this many items (a page); the answer "
                                    "then has `next` (pass it as `after` for the next page; null: no more) and `total`")]
After = Annotated[str | None, Query(description="Only the items after this name (exclusive): the `next` of the page "
                                                "before")]
ModelFilter = Annotated[str | None, Query(description="Only this model's")]
NodeFilter = Annotated[str | None, Query(description="Only the replicas on this node")]
