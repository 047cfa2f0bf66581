"""Test model and spec builders for the scorer tests.

``echo`` is a tiny python-backend model (``y = 2 * x``) so the scorer tests
exercise exactly the production code path (spec -> create_backend -> infer)
without torch's start-up cost.  ``x == -1`` makes it raise: a poison *row*
(valid by schema, fatal for the model), for inference_error isolation.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

POISON_X = -1.0


def echo(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """y = 2x for a batch; raises on the poison value."""
    out = []
    for row in rows:
        if row["x"] == POISON_X:
            raise ValueError(f"model cannot score x={POISON_X}")
        out.append({"y": row["x"] * 2.0})
    return out


def echo_spec_doc(name: str | None = None, max_queue_time_ms: float | None = None) -> dict[str, Any]:
    """A Kubernetes-style ModelService for ``echo``; a unique name gives unique topics and group."""
    name = name or f"echo-{uuid.uuid4().hex[:10]}"
    sla: dict[str, Any] = {"p99_latency_ms": 100}
    if max_queue_time_ms is not None:
        sla["max_queue_time_ms"] = max_queue_time_ms
    return {
        "apiVersion": "sie.lmsys.org/v1",
        "kind": "ModelService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},
            "priorityLevel": "P1",
            "serviceType": "scoring",
            "backend": {"type": "python", "callable": "tests.scorer_fixtures:echo"},
            "resources": {"gpuMemoryMb": 0, "cpu": 0.5},
            "inputSchema": {"type": "json", "fields": [{"name": "x", "type": "float"}]},
            "outputSchema": {"type": "json", "fields": [{"name": "y", "type": "float"}]},
            "sla": sla,
            "exampleInput": {"x": 1.0},
        },
    }


def echo_spec(name: str | None = None, max_queue_time_ms: float | None = None):
    from schemas.spec import parse_spec

    return parse_spec(echo_spec_doc(name, max_queue_time_ms))


def write_echo_spec(directory: Path, name: str | None = None, max_queue_time_ms: float | None = None) -> Path:
    doc = echo_spec_doc(name, max_queue_time_ms)
    path = directory / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def load_echo_backend(spec):
    """The backend_factory for ``run_scorer``: the real python backend, loaded."""
    from workers.backends import backend_config_from_spec, create_backend

    backend = create_backend(backend_config_from_spec(spec))
    backend.load()
    return backend
