"""``/v1/replicas``: every desired replica, and a replica's worker log proxied from its node's agent.

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
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from sie.control.api.deps import Service, Viewer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.views import ReplicaList

router = APIRouter(prefix="/v1/replicas", responses=error_responses(401))


@router.get("", summary="Every desired replica: node, GPUs, state, reason", response_model=ReplicaList)
def replicas(service: Service, _: Viewer) -> dict[str, Any]:
    items = [r.to_record() for s in service.controller.statuses.values() for r in s.replicas]
    return {"replicas": sorted(items, key=lambda r: r["replica_id"])}


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
