"""Routes about the cluster and this instance: health, metrics, the OpenAPI document, events, Prometheus targets."""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from sie.control.api.auth import Principal
from sie.control.api.deps import Require, Service, Viewer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.views import EventList, Health, TargetGroup

router = APIRouter(responses=error_responses(401))


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, _: Viewer) -> dict[str, Any]:
    """The OpenAPI document: what routes exist is for holders of a token, like everything else."""
    document: dict[str, Any] = request.app.openapi()
    return document


@router.get("/healthz", summary="Role, epoch and whether this instance's state caught up", response_model=Health)
def healthz(service: Service,
            principal: Annotated[Principal | None, Depends(Require("viewer", public="/healthz"))]) -> dict[str, Any]:
    health: dict[str, Any] = service.health()
    if principal is None:  # anonymous (public path): no error texts, which may name hosts
        return {k: health[k] for k in ("status", "role", "state_caught_up")}
    return health


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "The Prometheus text exposition format"}})
def metrics(service: Service,
            _: Annotated[Principal | None, Depends(Require("viewer", public="/metrics"))]) -> Response:
    return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/events", summary="The latest events of the cluster (placements, failures, audit)",
            response_model=EventList, responses=error_responses(422))
def events(service: Service, _: Viewer, limit: int = 50) -> dict[str, Any]:
    from sie.control.reconcile.observability import event_rows

    if not 1 <= limit <= 500:
        raise ApiError(422, f"limit: must be between 1 and 500 (got {limit})",
                       [{"field": "limit", "reason": "must be between 1 and 500"}])
    return {"events": event_rows(service.state.snapshot().events, limit)}


@router.get("/v1/prometheus/targets", summary="Prometheus http_sd: the /metrics endpoints of agents and workers",
            response_model=list[TargetGroup])
def prometheus_targets(service: Service, _: Viewer) -> list[dict[str, Any]]:
    from sie.control.reconcile.observability import prometheus_targets

    return prometheus_targets(service.state.snapshot(), service.clock(), service.config.node_timeout_s)
