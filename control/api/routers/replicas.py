"""``/v1/replicas``: the desired replicas (filtered and paged: ``listing``), and a replica's worker log proxied from
its node's agent.

  log: replica -> its node (``controller.statuses``) -> the agent's HTTP address (its heartbeat) ->
       ``GET http://<agent>/v1/replicas/<id>/log`` with the caller's token (the agent checks it) -> streamed through

| failure                                  | answer |
|------------------------------------------|--------|
| a replica the control plane does not know, or one on no node | 404 |
| an agent serving no HTTP port            | 503 (start it with ``--metrics-port``) |
| the agent does not answer                | 502 naming node and address |
| the agent answers 400/401/404            | the same status, its text prefixed with the node |
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter

from sie.control.api.deps import After, Limit, Lists, ModelFilter, NodeFilter, Service, Viewer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.listing import check_query, page
from sie.control.api.views import ReplicaList, ReplicaRow
from sie.schemas.replica_state import ReplicaState

router = APIRouter(prefix="/v1/replicas", responses=error_responses(401))
_ROWS = TypeAdapter(list[ReplicaRow])


def _check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model's replica records as the response model validates them (an invalid one: a 500, as before)."""
    checked: list[dict[str, Any]] = _ROWS.validate_python(rows)  # type: ignore[assignment]
    return checked


@router.get("", summary="The desired replicas: node, GPUs, state, reason (filter: model, node, state; paged)",
            response_model=ReplicaList, responses=error_responses(422))
def replicas(service: Service, lists: Lists, _: Viewer, model: ModelFilter = None, node: NodeFilter = None,
             state: Annotated[ReplicaState | None, Query(description="Only the replicas in this state")] = None,
             limit: Limit = None, after: After = None) -> Any:
    model, node = check_query("model", model, "model"), check_query("node", node, "node")
    after = check_query("after", after, "replica")
    statuses = service.controller.statuses
    keys: list[str] | None = None
    if model is not None:  # that model's status only: no record of any other model is built
        status = statuses.get(model)
        rows = sorted((r.to_record() for r in status.replicas), key=lambda r: r["replica_id"]) if status else []
        if node is not None:
            rows = [r for r in rows if r["node"] == node]
    else:
        index = lists.replicas(statuses, _check)
        if node is None and state is None and limit is None and after is None:
            return Response(lists.replicas_json(index), media_type="application/json")  # dumped once
        rows, keys = (index.by_node.get(node, []), None) if node is not None else (index.rows, index.ids)
    if state is not None:
        rows, keys = [r for r in rows if r["state"] == state.value], None
    found = page(rows, lambda r: str(r["replica_id"]), limit, after, keys)
    return {"replicas": found.pop("items"), **found}


@router.get("/{replica_id}/log", summary="A replica's worker log, from its node's agent (like kubectl logs)",
            response_class=StreamingResponse, responses={**error_responses(404, 503), 200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "description": "The worker's log lines, streamed while ``follow``"}})
async def replica_log(replica_id: str, request: Request, service: Service, _: Viewer, lines: int = 100,
                      follow: bool = False, previous: bool = False) -> Any:
    return await _proxy_log(service, replica_id, request.headers.get("authorization") or "",
                            {"lines": str(lines), "follow": "1" if follow else "0",
                             "previous": "1" if previous else "0"}, follow)


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
