"""A dead letter names the error's type once (issue 38, item 7): a rollout's companion version relays its model's
failure as ``InferenceError("InferenceError: ...")`` (``sie.workers.version_host`` formats it, ``sie.workers.versions``
raises it in the worker), and the scorer prefixed the type again: ``InferenceError: InferenceError: ...``."""

from __future__ import annotations

from sie.streams.scorer.inference import Inference, InferenceFailed, infer_isolating
from sie.workers.backends.base import InferenceError


class RelayedFailure:
    """A companion version's backend as the worker sees it: the other process's error text, raised again."""

    def infer(self, rows: list[dict]) -> list[dict]:
        if any(r.get("poison") for r in rows):
            try:
                raise InferenceError("churn:1.1.0: forward pass failed on input [1, 6] (RuntimeError: bad row)")
            except InferenceError as exc:  # version_host: {"error": f"{type(exc).__name__}: {exc}"}
                relayed = f"{type(exc).__name__}: {exc}"
            raise InferenceError(relayed)  # versions.py: InferenceError(str(answer["error"]))
        return [{"y": 1.0} for _ in rows]


class LocalFailure:
    def infer(self, rows: list[dict]) -> list[dict]:
        if any(r.get("poison") for r in rows):
            raise ValueError("x must be a number")
        return [{"y": 1.0} for _ in rows]


def test_a_relayed_inference_error_is_named_once():
    out = Inference(RelayedFailure(), canary={"x": 1}).run([{"x": 1}, {"poison": True}])
    assert out[0] == {"y": 1.0} and type(out[1]) is InferenceFailed
    assert out[1].detail == "InferenceError: churn:1.1.0: forward pass failed on input [1, 6] (RuntimeError: bad row)"


def test_a_local_error_still_names_its_type():
    (failed,) = infer_isolating(LocalFailure(), [{"poison": True}])
    assert failed.detail == "ValueError: x must be a number"
