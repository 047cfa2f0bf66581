"""`sie scale`: a model's replica count changed without editing its YAML.

One rule for the CLI (``sie scale``, over Kafka) and the control API (``POST /v1/models/{name}/scale``):

    request  = ScaleRequest(replicas=N)            -> min_replicas = max_replicas = N (a fixed count)
             | ScaleRequest(min_replicas=A, max_replicas=B)  -> the autoscaler's bounds (either may be left out:
                                                               it keeps the applied one)
    new spec = the applied spec with ``sla.min_replicas``/``sla.max_replicas`` replaced, validated as an apply's
    publish it on the specs topic like an apply (a new ``applied_at_ms``: it is recorded like one)

A scale changes no replica it keeps: the replica count is not part of a worker's target (the replica template
leaves it out: ``sie.schemas.replica_template``, ``sie.workers.replica.DesiredReplica.target_hash``), so only
the replicas added or removed start or drain.

=====================================  ==========================================================
failure                                what the caller gets
=====================================  ==========================================================
neither --replicas nor --min/--max     ``ScaleError`` naming the options
--replicas together with --min/--max   ``ScaleError``: one or the other
min > max after the change             ``ScaleError`` with both numbers and the applied ones
replicas < 1, min < 0, max < 1         ``ScaleError`` (the spec's own bounds: min >= 0, max >= 1)
=====================================  ==========================================================
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sie.kernel.errors import SpecError
from sie.schemas.spec_models import ModelService, Sla


class ScaleError(SpecError):
    """A scale request that cannot be applied; the message says which numbers and the fix."""


class ScaleRequest(BaseModel):
    """What a caller asks for: a fixed count, or bounds (the API's JSON body has this shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int | None = Field(None, ge=1, description="A fixed count: min_replicas = max_replicas = replicas "
                                                         "(for none: --min 0 lets the autoscaler scale to zero, "
                                                         "`sie delete model` stops serving).")
    min_replicas: int | None = Field(None, ge=0, description="The autoscaler's lower bound (0 allows scale to zero).")
    max_replicas: int | None = Field(None, ge=1, description="The autoscaler's upper bound.")

    @model_validator(mode="after")
    def _one_form(self) -> ScaleRequest:
        if self.replicas is None and self.min_replicas is None and self.max_replicas is None:
            raise ValueError("say how many: replicas (a fixed count) or min_replicas/max_replicas (bounds)")
        if self.replicas is not None and (self.min_replicas is not None or self.max_replicas is not None):
            raise ValueError("replicas (a fixed count) or min_replicas/max_replicas (bounds), not both")
        return self

    def describe(self) -> str:
        if self.replicas is not None:
            return f"replicas={self.replicas}"
        return ", ".join(f"{k}={v}" for k, v in (("min", self.min_replicas), ("max", self.max_replicas)) if v is not None)


def scale_request(replicas: int | None, min_replicas: int | None, max_replicas: int | None) -> ScaleRequest:
    """The request of the CLI's options; ``ScaleError`` with the reason."""
    try:
        return ScaleRequest(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas)
    except ValidationError as exc:
        raise ScaleError("sie scale: " + "; ".join(_reasons(exc))) from None


def _reasons(exc: ValidationError) -> list[str]:
    out = []
    for e in exc.errors():
        where = ".".join(map(str, e.get("loc", ())))
        out.append(f"{where}: {e['msg']}" if where else str(e["msg"]).removeprefix("Value error, "))
    return out


def scaled(spec: ModelService, request: ScaleRequest) -> ModelService:
    """``spec`` with the replica count of ``request``, validated as an apply would be."""
    if request.replicas is not None:
        lo = hi = request.replicas
    else:
        lo = spec.sla.min_replicas if request.min_replicas is None else request.min_replicas
        hi = spec.sla.max_replicas if request.max_replicas is None else request.max_replicas
    try:
        sla = Sla.model_validate({**spec.sla.model_dump(), "min_replicas": lo, "max_replicas": hi})
    except ValidationError as exc:
        raise ScaleError(f"{spec.name}: cannot scale to min {lo}, max {hi} (applied: min {spec.sla.min_replicas}, "
                         f"max {spec.sla.max_replicas}): {'; '.join(_reasons(exc))}") from None
    return ModelService.model_validate({**spec.model_dump(), "sla": sla.model_dump()})


def describe_change(before: ModelService, after: ModelService) -> str:
    """``replicas 2 -> 3`` (a fixed count) or ``min 1 -> 0, max 3 -> 5``."""
    b, a = before.sla, after.sla
    if b.min_replicas == b.max_replicas and a.min_replicas == a.max_replicas:
        return f"replicas {b.min_replicas} -> {a.min_replicas}"
    return f"min {b.min_replicas} -> {a.min_replicas}, max {b.max_replicas} -> {a.max_replicas}"
