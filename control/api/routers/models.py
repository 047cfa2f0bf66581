"""``/v1/models``: apply a ModelService, read what the cluster does with it, scale it, delete it.

  list (GET)         names (statuses, specs, spec errors) sorted -> ?model= ?phase= (the phase without building an
                     answer) -> a page (``listing.page``) -> ``model_json`` of the page's models only

  apply (POST/PUT)   body -> ``read_yaml_documents`` -> ``load`` + spec policy -> tier check ->
                     ownership mark -> schema compatibility -> artifacts uploaded? -> a rollout (new version whose
                     spec asks for one) or ``publish_spec`` -> 202
  scale              ``ScaleRequest`` -> applied spec ``scaled`` -> ``publish_spec`` -> 202
  delete             ownership mark (``?owner=``) -> ``delete_spec`` -> 202

| refusal                                                             | answer |
|---------------------------------------------------------------------|--------|
| empty body, not UTF-8                                               | 400    |
| not one ModelService, invalid fields, refused by the spec policy      | 422 naming the fields |
| P1/P2 asking for tier-0 nodes; another owner's mark; a schema break; a rollout in progress | 409 |
| an artifact not on the cluster's artifacts topic                     | 422 naming it |
| a rollout asked for on a standby                                    | 503 naming the leader |
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from sie.control.api.answers import Applied, Deleted, RolloutStarted, Scaled
from sie.control.api.deps import After, Limit, ModelFilter, Service, Viewer, Writer
from sie.control.api.errors import ApiError, error_responses, problem_to_error
from sie.control.api.listing import ModelPhase, check_query, page
from sie.control.api.views import ModelList, ModelView

router = APIRouter(prefix="/v1/models", responses=error_responses(401))
WRITE_ERRORS = error_responses(403, 404, 409, 422)

#: seconds a write waits for Kafka's acknowledgement of the spec record
PUBLISH_TIMEOUT_S = 15.0
#: where artifacts are uploaded (named in the refusal of a spec whose artifact is missing)
ARTIFACT_PATH = "/v1/artifacts/"

_BODY_DOC = {"requestBody": {"required": True, "content": {
    "application/yaml": {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}},
    "description": "One ModelService document (YAML or JSON, at most 1 MiB)."}}


@router.get("", summary="Desired vs actual per applied model (filter: model, phase; paged)", response_model=ModelList,
            responses=error_responses(422))
def models(service: Service, _: Viewer, model: ModelFilter = None,
           phase: Annotated[ModelPhase | None, Query(description="Only the models in this phase")] = None,
           limit: Limit = None, after: After = None) -> dict[str, Any]:
    from sie.control.reconcile.observability import model_numbers

    model, after = check_query("model", model, "model"), check_query("after", after, "model")
    statuses = service.controller.statuses
    snap = service.state.snapshot()
    if model is not None:
        names = [model] if model in statuses or model in snap.specs or model in snap.spec_errors else []
    else:
        names = sorted(set(statuses) | set(snap.specs) | set(snap.spec_errors))
    if phase is not None:
        names = [n for n in names if _phase(statuses.get(n), n, snap) == phase.value]
    found = page(names, str, limit, after, names)
    numbers = model_numbers(snap, service.clock(), service.config.node_timeout_s)
    events: dict[str | None, list[Any]] = {}
    for e in snap.events:
        events.setdefault(e.model, []).append(e)
    chosen = (model_json(service, n, numbers, snap, events) for n in found.pop("items"))
    return {"models": [m for m in chosen if m is not None], **found}


def _phase(status: Any, name: str, snap: Any) -> str:
    """The phase ``model_json`` shows for ``name``, without building its answer."""
    return str(status.phase) if status is not None else "Invalid" if name in snap.spec_errors else "Pending"


@router.get("/{name}", summary="One model: status, spec summary, recent events", response_model=ModelView,
            responses=error_responses(404))
def model(name: str, service: Service, _: Viewer) -> dict[str, Any]:
    found = model_json(service, name)
    if found is None:
        raise ApiError(404, f"model {name!r} is not applied")
    return found


async def _apply(request: Request, service: Service, write: Writer) -> JSONResponse:
    raw = await request.body()
    adopt = request.query_params.get("adopt") in ("1", "true")
    body = await write.run("apply", None, lambda: _post_model(service, raw, adopt),
                           outcome=lambda b: f"accepted version {b['version']}", subject=lambda b: b["name"])
    return JSONResponse(body, status_code=202)


@router.post("", status_code=202, summary="Apply a ModelService (publish it on the specs topic)",
             openapi_extra=_BODY_DOC, response_model=Applied | RolloutStarted,
             responses=error_responses(400, 503) | WRITE_ERRORS)
async def post_model(request: Request, service: Service, write: Writer) -> JSONResponse:
    return await _apply(request, service, write)


@router.put("", status_code=202, summary="Same as POST", openapi_extra=_BODY_DOC,
            response_model=Applied | RolloutStarted, responses=error_responses(400, 503) | WRITE_ERRORS)
async def put_model(request: Request, service: Service, write: Writer) -> JSONResponse:
    return await _apply(request, service, write)


@router.delete("/{name}", status_code=202, summary="Delete an applied model", response_model=Deleted,
               responses=WRITE_ERRORS)
async def delete_model(name: str, request: Request, service: Service, write: Writer) -> JSONResponse:
    owner = request.query_params.get("owner")
    body = await write.run("delete", name, lambda: _delete_model(service, name, owner))
    return JSONResponse(body, status_code=202)


@router.post("/{name}/scale", status_code=202, summary="Set a model's replica count (or its bounds)",
             response_model=Scaled, responses=WRITE_ERRORS)
async def scale_model(name: str, request: Request, service: Service, write: Writer) -> JSONResponse:
    raw = await request.body()
    body = await write.run("scale", name, lambda: _scale_model(service, name, raw),
                           outcome=lambda b: f"accepted: {b['change']}")
    return JSONResponse(body, status_code=202)


def model_json(service: Any, name: str, numbers: dict[str, dict[str, Any]] | None = None,
               snap: Any = None, events: Mapping[str | None, list[Any]] | None = None) -> dict[str, Any] | None:
    """One model as the API shows it; ``numbers``: ``observability.model_numbers``, ``snap`` the state snapshot and
    ``events`` the snapshot's events by model when already computed (``GET /v1/models`` computes each once for
    every model, not once per model)."""
    from sie.control.reconcile.observability import event_rows, model_numbers

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
        out["spec"] = spec_summary(spec)
    if numbers is None:
        numbers = model_numbers(snap, service.clock(), service.config.node_timeout_s)
    # from the workers, through their agents' heartbeats: lag (sum), recent p99 (worst replica)
    out["live"] = numbers.get(name, {"lag": None, "p99_ms": None, "reporting": 0})
    mine = events.get(name, []) if events is not None else [e for e in snap.events if e.model == name]
    out["events"] = event_rows(mine, 20)
    return out


#: spec object id -> (the spec, its summary): a spec's digest and dumps are computed once per applied spec object,
#: not once per read (``GET /v1/models`` at 10,000 models); the spec is held, so its id names no other object
_SUMMARIES: dict[int, tuple[Any, dict[str, Any]]] = {}
#: summaries kept at most (then the cache starts over: specs replaced by newer ones are not kept forever)
_SUMMARIES_MAX = 50_000


def spec_summary(spec: Any) -> dict[str, Any]:
    """What a model's answer shows of its applied spec (a fresh dict: the caller may add to its answer)."""
    kept = _SUMMARIES.get(id(spec))
    if kept is not None and kept[0] is spec:
        return dict(kept[1])
    summary = {
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
    if len(_SUMMARIES) >= _SUMMARIES_MAX:
        _SUMMARIES.clear()
    _SUMMARIES[id(spec)] = (spec, summary)
    return dict(summary)


def ownership_problem(current: Any, owner: str | None, adopt: bool = False) -> str | None:
    """Why a write marked ``owner`` may not replace or delete ``current`` (the applied spec), or None.  A write
    without a mark (``sie apply``, a person through the API) may; a marked one (the Kubernetes operator) only
    over its own mark, over no applied model, or adopting an unmarked model (``adopt``: a model the operator
    applied before marks existed, which it proves from the ModelService's status)."""
    if current is None or owner is None or current.owner == owner or (adopt and current.owner is None):
        return None
    by = current.owner or "sie apply or the API (no owner mark)"
    return (f"model {current.name!r} is managed by {by}, not by {owner}: delete it there first (or "
            f"sie delete model {current.name}), or give this one another name")


def _post_model(service: Any, raw: bytes, adopt: bool = False) -> dict[str, Any]:
    from sie.control.placement.engine import validate_tier_request
    from sie.schemas.spec import InvalidSpec, load, read_yaml_documents

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
        raise ApiError(422, str(exc).splitlines()[0], [problem_to_error(p) for p in exc.problems]) from None
    snap = service.state.snapshot()
    from sie.control.placement.inventory import ClusterInventory

    # only a P1/P2 nodeSelector is checked against the nodes: no inventory built for every other apply
    nodes = (snap.inventory(service.clock(), service.config.node_timeout_s)
             if spec.scheduling.node_selector and spec.priority_level != "P0" else ClusterInventory())
    conflict = validate_tier_request(spec, nodes)
    if conflict:
        raise ApiError(409, conflict, [{"field": "spec.scheduling", "reason": conflict}])
    current = snap.specs.get(spec.name)
    owned = ownership_problem(current, spec.owner, adopt)
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
    return Applied(name=spec.name, version=spec.version, status=f"/v1/models/{spec.name}",
                   warnings=list(spec.warnings)).model_dump()


def _start_rollout(service: Any, current: Any, spec: Any) -> dict[str, Any]:
    from sie.control.rollout.driver import RolloutRefused
    from sie.control.rollout.service import NotLeader

    try:
        entry = service.rollouts.begin(current, spec)
    except NotLeader as exc:
        raise ApiError(503, f"{exc}; send it to the leader ({service.state.leader_instance or 'unknown'})") from None
    except RolloutRefused as exc:
        raise ApiError(409, str(exc), [{"field": "spec.version", "reason": exc.kind}]) from None
    return RolloutStarted(name=spec.name, version=spec.version, rollout=entry.rollout.label,
                          status=f"/v1/rollouts/{spec.name}", warnings=list(spec.warnings)).model_dump()


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
    return Scaled(name=name, version=new.version, change=describe_change(spec, new), min_replicas=new.sla.min_replicas,
                  max_replicas=new.sla.max_replicas, status=f"/v1/models/{name}").model_dump()


def _delete_model(service: Any, name: str, owner: str | None = None) -> dict[str, Any]:
    """``owner``: delete only if the applied spec carries this mark (the operator's ``?owner=``), else 409."""
    from sie.schemas.spec_store import delete_spec

    spec = service.state.snapshot().specs.get(name)
    if spec is None:
        raise ApiError(404, f"model {name!r} is not applied")
    if owner is not None and spec.owner != owner:
        raise ApiError(409, ownership_problem(spec, owner) or f"model {name!r} is not managed by {owner}")
    delete_spec(service.settings, spec, timeout=PUBLISH_TIMEOUT_S, writer=service.spec_writer)
    return Deleted(name=name).model_dump()
