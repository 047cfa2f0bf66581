"""``/v1/connectors``: apply a CdcConnector, read its status and source offsets, pause, resume, delete it.

  apply: body -> ``parse_connector_spec`` -> names under the cluster's topic prefix -> ``publish_connector``
         (paused if it was: operator state survives a re-apply) -> 202
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sie.control.api.answers import ConnectorApplied, ConnectorState, Deleted
from sie.control.api.deps import Service, Viewer, Writer
from sie.control.api.errors import ApiError, error_responses, problem_to_error
from sie.control.api.routers.models import PUBLISH_TIMEOUT_S
from sie.control.api.views import ConnectorList, ConnectorView, InvalidConnector

router = APIRouter(prefix="/v1/connectors", responses=error_responses(401))
WRITE_ERRORS = error_responses(403, 404)


def _status_of(service: Any, name: str) -> dict[str, Any] | None:
    from sie.control.reconcile.connectors import connector_status

    report = service.controller.last_report
    found: dict[str, Any] | None = connector_status(name, service.state.snapshot(), report.plan if report else None,
                                                    service.clock(), service.config.node_timeout_s)
    return found


def _current(service: Any, name: str) -> Any:
    info = service.state.snapshot().connectors.get(name)
    if info is None:
        raise ApiError(404, f"connector {name!r} is not applied")
    return info


@router.get("", summary="CDC connectors applied through the control plane, with their phase",
            response_model=ConnectorList)
def connectors(service: Service, _: Viewer) -> dict[str, Any]:
    snap = service.state.snapshot()
    names = sorted(set(snap.connectors) | set(snap.connector_errors))
    return {"connectors": [c for c in (_status_of(service, n) for n in names) if c is not None]}


@router.get("/{name}", summary="One connector: status, replica, source offsets and lag",
            response_model=ConnectorView | InvalidConnector, responses=error_responses(404))
def connector(name: str, service: Service, _: Viewer) -> dict[str, Any]:
    from sie.control.reconcile.connectors import connector_offsets

    found = _status_of(service, name)
    if found is None:
        raise ApiError(404, f"connector {name!r} is not applied")
    info = service.state.snapshot().connectors.get(name)
    if info is not None:
        found["offsets"] = connector_offsets(service.settings, info.spec, service.clients)
    return found


@router.post("", status_code=202, summary="Apply a CdcConnector (publish it on the connectors topic)",
             response_model=ConnectorApplied, responses=error_responses(400, 403, 422))
async def post_connector(request: Request, service: Service, write: Writer) -> JSONResponse:
    raw = await request.body()
    body = await write.run("apply connector", None, lambda: _apply(service, raw),
                           subject=lambda b: b.get("name"))
    return JSONResponse(body, status_code=202)


@router.post("/{name}/pause", status_code=202, summary="Pause: its replica drains, offsets stay committed",
             response_model=ConnectorState, responses=WRITE_ERRORS)
async def pause(name: str, service: Service, write: Writer) -> JSONResponse:
    body = await write.run("pause connector", name, lambda: _set_paused(service, name, True))
    return JSONResponse(body, status_code=202)


@router.post("/{name}/resume", status_code=202, summary="Resume from the committed offsets",
             response_model=ConnectorState, responses=WRITE_ERRORS)
async def resume(name: str, service: Service, write: Writer) -> JSONResponse:
    body = await write.run("resume connector", name, lambda: _set_paused(service, name, False))
    return JSONResponse(body, status_code=202)


@router.delete("/{name}", status_code=202, summary="Delete a connector (its replica drains)", response_model=Deleted,
               responses=WRITE_ERRORS)
async def delete(name: str, service: Service, write: Writer) -> JSONResponse:
    def remove() -> dict[str, Any]:
        from sie.schemas.connector_store import delete_connector

        delete_connector(service.settings, _current(service, name).spec, timeout=PUBLISH_TIMEOUT_S)
        return Deleted(name=name).model_dump()

    body = await write.run("delete connector", name, remove)
    return JSONResponse(body, status_code=202)


def _apply(service: Any, raw: bytes) -> dict[str, Any]:
    from sie.schemas.connector_spec import ConnectorSpecError, connector_name_problems, parse_connector_spec
    from sie.schemas.connector_store import publish_connector

    doc = _read_document(raw, "CdcConnector")
    try:
        spec = parse_connector_spec(doc, source="request body")
    except ConnectorSpecError as exc:
        text = str(exc).removeprefix("request body: ")
        raise ApiError(422, f"invalid CdcConnector: {text}", [problem_to_error(p) for p in text.split("; ")]) from None
    problems = connector_name_problems(spec, service.settings.topic_prefix)
    if problems:
        raise ApiError(422, f"invalid CdcConnector: {'; '.join(problems)}", [problem_to_error(p) for p in problems])
    existing = service.state.snapshot().connectors.get(spec.name)
    paused = existing.paused if existing is not None else False  # operator state survives a re-apply
    publish_connector(service.settings, spec, paused, timeout=PUBLISH_TIMEOUT_S)
    return ConnectorApplied(name=spec.name, paused=paused, status=f"/v1/connectors/{quote(spec.name, safe='')}").model_dump()


def _set_paused(service: Any, name: str, paused: bool) -> dict[str, Any]:
    from sie.schemas.connector_store import publish_connector

    info = _current(service, name)
    if info.paused != paused:
        publish_connector(service.settings, info.spec, paused, timeout=PUBLISH_TIMEOUT_S)
    return ConnectorState(name=name, paused=paused).model_dump()


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
        raise ApiError(422, str(exc).splitlines()[0], [problem_to_error(p) for p in exc.problems]) from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ApiError(422, f"document: expected one {what} mapping, found {len(docs)} document(s)")
    return docs[0]
