"""What one reconcile pass decided (``ReconcileReport``), and the loop's health as ``/healthz`` shows it.

    step = StepLog(); step(name, fn)     # fn's answer, or None and its error; its duration either way
    report = ReconcileReport(now, leader, published, plan, statuses, errors, durations, skipped, guard, decisions)
    health = loop_health(latest report, latest report of a pass that acted)

========================================  ====================================================
the latest pass ...                       the loop's health
========================================  ====================================================
none yet                                  not ok: no reconcile pass yet
skipped (a stale view, a takeover)        not ok: not acting, and why
had a failing step                        not ok: each step's error
anything else                             ok: reconciling
========================================  ====================================================

With ``last_pass_ms``, where the time of the latest acting pass went (docs/control-plane.md, "Scale").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sie.control.placement.engine import PlacementPlan
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.status import ModelStatus

log = logging.getLogger("sie.control.reconcile.controller")


@dataclass(frozen=True)
class ReconcileReport:
    """What one pass decided (published or not) and how long each step took."""

    at: float
    leader: bool
    published: tuple[OutRecord, ...]
    plan: PlacementPlan | None
    statuses: Mapping[str, ModelStatus]
    errors: Mapping[str, str]
    durations: Mapping[str, float]
    skipped: str | None = None
    #: why the mass-offline guard holds nodes online this pass (None: it does not)
    guard: str | None = None
    #: the autoscaler's decision per autoscaled model this pass
    decisions: Mapping[str, ScaleDecision] = field(default_factory=dict)
    #: the models this pass planned (None: all of them, a full pass); whether it was the periodic check, and
    #: how many of the kept values it found differing from a pass from scratch (``incremental``)
    planned: frozenset[str] | None = None
    checked: bool = False
    mismatched: int = 0

    def of(self, topic: str) -> list[OutRecord]:
        return [r for r in self.published if r.topic == topic]


def loop_health(report: ReconcileReport | None, acted: ReconcileReport | None) -> dict[str, Any]:
    """The loop's health after ``report`` (table); ``acted``: the latest pass that was not skipped."""
    if report is None:
        loop: dict[str, Any] = {"ok": False, "detail": "no reconcile pass yet"}
    elif report.skipped:
        loop = {"ok": False, "detail": f"not acting: {report.skipped}"}
    elif report.errors:
        loop = {"ok": False, "detail": "; ".join(f"{k}: {v}" for k, v in sorted(report.errors.items()))}
    else:
        loop = {"ok": True, "detail": "reconciling"}
    if acted is not None:
        loop["last_pass_ms"] = {k: round(v * 1000, 1) for k, v in acted.durations.items()}
    return loop


@dataclass
class StepLog:
    """Runs the steps of one pass: a step that raises becomes its error (and None), never a crashed loop."""

    errors: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as exc:  # one failing subsystem must not stop the loop
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            log.exception("reconcile step %s failed", name)
            return None
        finally:
            self.durations[name] = time.perf_counter() - t0
