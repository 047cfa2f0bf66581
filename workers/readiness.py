"""Readiness = a real inference of the spec's example input whose outputs match the output schema.

Why not an open port: a process can listen and still be unable to score (wrong
artifact, wrong output arity, a CUDA error on first use).  The worker runs the
example through the very backend object the scorer will use and checks every
declared output field (present, right type, inside its range) before it tells
the agent it is READY.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import SieError


class ReadinessError(SieError):
    """The readiness inference failed or returned outputs that do not match spec.outputSchema."""


@dataclass(frozen=True)
class ReadinessResult:
    outputs: dict[str, Any]
    latency_ms: float


def _type_ok(value: Any, type_name: str) -> bool:
    if type_name == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    if type_name == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "bool":
        return isinstance(value, bool)
    if type_name == "string":
        return isinstance(value, str)
    return True


def check_outputs(output_schema: Any, outputs: Any, model_id: str = "<model>") -> None:
    """Raise ReadinessError naming the first output field that is missing, mistyped or out of range."""
    if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict):
        raise ReadinessError(
            f"{model_id}: readiness inference returned {type(outputs).__name__} "
            f"(expected a list with one output dict for the one example input)"
        )
    row = outputs[0]
    for field in getattr(output_schema, "fields", ()) or ():
        name, required = field.name, getattr(field, "required", True)
        if name not in row:
            if required:
                raise ReadinessError(
                    f"{model_id}: readiness: output field {name!r} missing (got {sorted(row)}); "
                    f"fix the model or spec.outputSchema.fields"
                )
            continue
        value = row[name]
        if value is None:
            if not getattr(field, "nullable", False):
                raise ReadinessError(f"{model_id}: readiness: output field {name!r} is null (not nullable)")
            continue
        if not _type_ok(value, field.type):
            raise ReadinessError(
                f"{model_id}: readiness: output field {name!r} must be {field.type} (got {value!r})"
            )
        bounds = getattr(field, "range", None)
        if bounds is not None and field.type in ("int", "float"):
            low, high = bounds
            if not low <= float(value) <= high:
                raise ReadinessError(
                    f"{model_id}: readiness: output field {name!r} = {value!r} outside range [{low}, {high}]"
                )


def readiness_inference(backend: Any, spec: Any) -> ReadinessResult:
    """Run the example input through ``backend`` and check the outputs against ``spec.output_schema``."""
    example = getattr(spec, "example_input", None)
    model_id = getattr(spec, "model_id", "<model>")
    if example is None:
        raise ReadinessError(
            f"{model_id}: spec.exampleInput is required for readiness (a real inference, not an open port); "
            f"add one example request's inputs to the spec"
        )
    start = time.perf_counter()
    try:
        outputs = backend.infer([dict(example)])
    except Exception as exc:
        raise ReadinessError(f"{model_id}: readiness inference raised {type(exc).__name__}: {exc}") from exc
    latency_ms = (time.perf_counter() - start) * 1000.0
    check_outputs(spec.output_schema, outputs, model_id)
    return ReadinessResult(outputs=dict(outputs[0]), latency_ms=latency_ms)
