"""``/v1/nodes``: the registered nodes (filtered by status and paged: ``listing``), and forgetting an offline one
(the leader does it on its next pass)."""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from sie.control.api.answers import Accepted
from sie.control.api.deps import After, Limit, Service, Viewer, Writer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.listing import NodeStatus, check_query, page
from sie.control.api.routers.models import PUBLISH_TIMEOUT_S
from sie.control.api.views import NodeList

router = APIRouter(prefix="/v1/nodes", responses=error_responses(401))


@router.get("", summary="Registered nodes with liveness, tier and GPUs (filter: status; paged)",
            response_model=NodeList, responses=error_responses(422))
def nodes(service: Service, _: Viewer,
          status: Annotated[NodeStatus | None, Query(description="Only the online or the offline nodes")] = None,
          limit: Limit = None, after: After = None) -> dict[str, Any]:
    after = check_query("after", after, "node")
    snap = service.state.snapshot()
    views = snap.node_views(service.clock(), service.config.node_timeout_s)  # sorted by name
    if status is not None:
        views = [v for v in views if v.online == (status is NodeStatus.ONLINE)]
    found = page(views, lambda v: str(v.name), limit, after)
    return {"nodes": [v.to_json() for v in found.pop("items")], **found}


@router.post("/{name}/forget", status_code=202, summary="Forget an offline node (inventory, status, alerts)",
             response_model=Accepted, responses=error_responses(403, 404, 409))
async def forget_node(name: str, service: Service, write: Writer) -> JSONResponse:
    who = f"{write.principal.name} via the API"
    body = await write.run("forget node", name, lambda: _forget_node(service, name, who))
    return JSONResponse(body, status_code=202)


def _forget_node(service: Any, name: str, who: str) -> dict[str, Any]:
    """``POST /v1/nodes/{name}/forget``: a ``node_forget_requested`` event; the leader forgets the node on its next
    pass if it is still offline (``Controller._forget_nodes``)."""
    from sie.control.reconcile.records import NODE_FORGET_KIND
    from sie.schemas.avro_codec import encode
    from sie.schemas.spec_store import produce_acknowledged

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
    return Accepted(name=name, status="/v1/nodes").model_dump()
