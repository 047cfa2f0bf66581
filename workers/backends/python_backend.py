"""Python backend: a plain function ``package.module:function(list[dict]) -> list[dict]``.

For transparent rules, feature lookups or models that are not tensors. The function gets the whole validated
batch at once (so it can vectorise) and must return one output dict per input, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sie.workers.backends.base import BackendConfig, BackendError, InferenceError, import_object


class PythonBackend:
    """Calls ``spec.backend.callable`` on each batch; always on the CPU."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.device = "cpu"
        self._fn: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None

    def load(self) -> None:
        cfg = self.config
        if not cfg.callable:
            raise BackendError(
                f"{cfg.model_id}: spec.backend.callable is required for a python backend "
                f"(e.g. 'models.fraud.rules:score')"
            )
        fn = import_object(cfg.callable, cfg.search_paths, what="spec.backend.callable",
                           allowed_modules=cfg.allowed_modules, bundle=cfg.modules_path)
        if isinstance(fn, type) or not callable(fn):
            # a class would be constructed on every batch (its __init__ run with the batch): not a scoring function
            raise BackendError(f"{cfg.model_id}: spec.backend.callable {cfg.callable} is a "
                               f"{'class' if isinstance(fn, type) else type(fn).__name__}, not a function; name a "
                               "function of your model package that takes the batch (e.g. 'models.fraud.rules:score')")
        self._fn = fn
        try:
            outputs = self.infer([cfg.warmup_input()])
        except InferenceError as exc:
            raise BackendError(f"{cfg.model_id}: warm-up call failed: {exc}") from exc
        expected = [f.name for f in cfg.output_fields]
        missing = [name for name in expected if name not in outputs[0]]
        if missing:
            raise BackendError(
                f"{cfg.model_id}: {cfg.callable} returned no {missing} for the example input "
                f"(got keys {sorted(outputs[0])}); fix the function or spec.outputSchema.fields"
            )

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._fn is None:
            raise InferenceError(f"{self.config.model_id}: backend is not loaded (call load() first)")
        if not inputs:
            return []
        name = self.config.callable
        try:
            outputs = self._fn(inputs)
        except Exception as exc:
            raise InferenceError(f"{name} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(outputs, list):
            try:
                outputs = list(outputs)
            except TypeError as exc:
                raise InferenceError(f"{name} returned {type(outputs).__name__}; expected a list of dicts") from exc
        if len(outputs) != len(inputs):
            raise InferenceError(
                f"{name} returned {len(outputs)} outputs for {len(inputs)} inputs; it must return one dict per input, in order"
            )
        for i, out in enumerate(outputs):
            if not isinstance(out, dict):
                raise InferenceError(f"{name} returned {type(out).__name__} at position {i}; expected a dict")
        return outputs

    def close(self) -> None:
        self._fn = None
