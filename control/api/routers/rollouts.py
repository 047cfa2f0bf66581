"""``/v1/rollouts``: every model's rollout, one model's, and steering one (pause, resume, promote, abort).

Any instance reads; only the leader steers (the rollouts driver runs there): a standby answers 503 naming it.
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
from typing import Any

from fastapi import APIRouter

from sie.control.api.deps import Service, Viewer, Writer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.views import RolloutList, RolloutView

router = APIRouter(prefix="/v1/rollouts", responses=error_responses(401))


@router.get("", summary="Every model's rollout: phase, step, canary weight, epoch, timeline",
            response_model=RolloutList)
def rollouts(service: Service, _: Viewer) -> dict[str, Any]:
    return {"rollouts": service.rollouts.list()}


@router.get("/{name}", summary="One model's rollout", response_model=RolloutView, responses=error_responses(404))
def rollout(name: str, service: Service, _: Viewer) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in service.rollouts.list() if r["model"] == name]
    if not found:
        raise ApiError(404, f"model {name!r} has no rollout")
    return found[0]


@router.post("/{name}/{action}", summary="pause, resume, promote or abort a model's rollout",
             response_model=RolloutView, responses=error_responses(403, 404, 409, 422, 503))
async def rollout_action(name: str, action: str, service: Service, write: Writer) -> dict[str, Any]:
    return await write.run(f"rollout {action}", name, lambda: _rollout_action(service, name, action, write.principal.name),
                           outcome=lambda b: f"accepted: {b['label']}")


def _rollout_action(service: Any, name: str, action: str, who: str) -> dict[str, Any]:
    from sie.control.rollout.machine import RolloutError
    from sie.control.rollout.service import NotLeader, describe

    try:
        return describe(service.rollouts.act(name, action, who))
    except NotLeader as exc:
        raise ApiError(503, f"{exc}; send it to the leader ({service.state.leader_instance or 'unknown'})") from None
    except RolloutError as exc:
        status = 404 if "no rollout" in str(exc) else 422 if "must be pause" in str(exc) else 409
        raise ApiError(status, str(exc)) from None
