"""Batched inference that tells poison rows from outages: the scorer's and backfill's one implementation.

``Inference.run(rows)`` returns one output per row, in order; a row the model cannot score comes back as
``InferenceFailed`` (its dead letter carries the backend's message).  Poison rows are isolated by
bisection, so a batch with one bad row costs about 2*log2(n) extra calls and a healthy batch costs one.

An outage is not poison: before any row is judged poison, a known-good row (the last row that scored,
else the spec's ``exampleInput``) must score; if it fails too the backend is down and
``BackendUnavailable`` (a ``RetryLater``) sends the whole batch back for later, never into dead letters.
This holds when the backend goes down in the middle of bisecting a batch with one poison row: the
healthy rows that failed meanwhile are not judged.  Rows that failed while others scored first get a
second, individual try (a blip that ended mid-bisection).  Cost: one extra call per batch that has a
failing row; none for a healthy batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sie.streams.scorer.errors import BackendUnavailable, VersionLost


def canary_row(example: Any, validator: Callable[[dict], dict]) -> dict | None:
    """The spec's ``exampleInput`` as a validated row (the first known-good row), or None if it has none
    or it does not validate."""
    if not example:
        return None
    try:
        return validator(dict(example))
    except Exception:  # an example that does not validate is no canary
        return None


class InferenceFailed:
    """Marker for a row the backend could not score (with the backend's message)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _checked(backend: Any, rows: list[dict]) -> list[Any]:
    out = backend.infer(rows)
    if type(out) is not list or len(out) != len(rows):
        raise ValueError(f"backend returned {type(out).__name__} of {len(out) if hasattr(out, '__len__') else '?'} "
                         f"outputs for {len(rows)} inputs")
    return out


def failure_text(exc: BaseException) -> str:
    """``<Type>: <message>`` of a failed call, the type named once: an error relayed from another process (a
    rollout's companion version, ``sie.workers.versions``) arrives as an ``InferenceError`` whose message already
    reads ``InferenceError: ...``; prefixing it again made dead letters read ``InferenceError: InferenceError: ...``."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(f"{name}: ") else f"{name}: {text}"


def infer_isolating(backend: Any, rows: list[dict]) -> list[Any]:
    """One output per row; rows that fail are isolated by bisection and returned as ``InferenceFailed``."""
    try:
        return _checked(backend, rows)
    except VersionLost:  # the version's process is gone: no row of it is poison, nothing to bisect
        raise
    except Exception as exc:  # InferenceError, or anything a model raises: isolate before judging
        if len(rows) == 1:
            return [InferenceFailed(failure_text(exc))]
        mid = len(rows) // 2
        return infer_isolating(backend, rows[:mid]) + infer_isolating(backend, rows[mid:])


class Inference:
    """One backend plus the known-good row that tells an outage from an all-poison batch."""

    def __init__(self, backend: Any, canary: dict | None = None) -> None:
        self.backend = backend
        self._canary = canary

    def run(self, rows: list[dict]) -> list[Any]:
        """Outputs for ``rows`` (``InferenceFailed`` for poison rows); ``BackendUnavailable`` on an outage."""
        backend = self.backend
        outputs = infer_isolating(backend, rows)
        failed = [i for i, o in enumerate(outputs) if type(o) is InferenceFailed]
        if not failed:
            self._canary = rows[0]
            return outputs
        if len(failed) < len(rows):
            # Some rows scored, so the backend worked a moment ago: give each failed row a second,
            # individual try (the failure may have been a blip that ended mid-bisection).
            for i in failed:
                outputs[i] = infer_isolating(backend, [rows[i]])[0]
            failed = [i for i in failed if type(outputs[i]) is InferenceFailed]
            if not failed:
                return outputs
        # Rows still fail. Poison, or did the backend go down (maybe in the middle of bisecting)? Before a
        # single row is judged, a row known to be good must score now; if it does not, nothing is judged.
        if self._canary is not None:
            try:
                _checked(backend, [self._canary])
            except VersionLost:
                raise
            except Exception as exc:
                raise BackendUnavailable(
                    f"backend fails on a known-good row too ({failure_text(exc)}): outage, not poison") from exc
            for i in failed:  # the backend answers now: the verdict on each failed row is final
                outputs[i] = infer_isolating(backend, [rows[i]])[0]
        return outputs
