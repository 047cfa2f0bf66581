"""Rollouts inside the control service: the leader drives them, the API starts and steers them.

WHY one lock and leader-only writes: the reconcile loop ticks the driver while API threads start rollouts
and apply operator actions; both change the same ``RolloutDriver`` and publish through the leader's fenced
producer, so each change is one locked (publish, commit) pair.  A standby neither drives nor writes (the API
answers 503 naming the leader); when this instance becomes leader it first reads the rollouts topic to its
end and resumes every unfinished rollout from what is committed there (``load``: once per leader epoch,
BEFORE the controller's first pass of the term plans any replica, ``service.Takeover``: a pass planned
without the rollouts would remove the surge replica).  Reads (``sie get rollouts``) are
served from the driver's view on the leader and, on a standby, from the topic as read at most 5 s ago.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sie.control.rollout.driver import Entry, KafkaVersionWindows, RolloutDriver, read_rollouts
from sie.control.rollout.machine import VersionWindow

log = logging.getLogger(__name__)

STANDBY_REFRESH_S = 5.0


class NotLeader(Exception):
    """A rollout write reached a standby control plane."""


class ModelWindows:
    """One ``KafkaVersionWindows`` per model with an unfinished rollout (opened lazily, closed at the end)."""

    def __init__(self, settings: Any, specs: Callable[[str], Any]) -> None:
        self._settings = settings
        self._specs = specs
        self._open: dict[str, KafkaVersionWindows] = {}

    def window(self, model: str, version: str, since_ms: int) -> VersionWindow:
        windows = self._open.get(model)
        if windows is None:
            windows = self._open[model] = KafkaVersionWindows(self._settings, self._specs(model))
        return windows.window(model, version, since_ms)

    def close(self, model: str | None = None) -> None:
        for name in [model] if model is not None else list(self._open):
            w = self._open.pop(name, None) if name is not None else None
            if w is not None:
                w.close()


class Rollouts:
    """The control service's rollouts (``service.rollouts``)."""

    def __init__(self, settings: Any, leadership: Any, publisher: Any, clock: Callable[[], float] = time.time,
                 windows: Any = None, reader: Callable[[Any], list[dict[str, Any]]] = read_rollouts,
                 registry: Any = None) -> None:
        self._settings = settings
        self._leadership = leadership
        self._publisher = publisher
        self._reader = reader
        self._lock = threading.RLock()
        self._windows = windows or ModelWindows(settings, lambda model: self.driver.entries[model].stable)
        self.driver = RolloutDriver(self._windows, clock=clock)
        #: the leader epoch whose rollouts the driver holds (None: none loaded, or a standby)
        self._loaded_epoch: int | None = None
        self.last_error: str | None = None
        #: a standby's view of the rollouts topic (refreshed by ``tick`` at most every STANDBY_REFRESH_S)
        self._standby: list[Entry] = []
        self._standby_at = float("-inf")
        self._mono = time.monotonic
        self._metrics = RolloutMetrics(registry) if registry is not None else None

    @property
    def _loaded(self) -> bool:
        """The driver holds this leader term's rollouts (loaded after this term's election)."""
        return self._leadership.is_leader and self._loaded_epoch == self._leadership.epoch

    # --- the leader's loop ---------------------------------------------------------------------
    def load(self, epoch: int) -> str | None:
        """A new leader's rollouts, once per term: the rollouts topic read to its end (after the election fenced
        the old leader, so it holds every rollout record that leader committed).  None once loaded; else why not
        (not leading, or the read failed: retried on the next call, and the controller does not act meanwhile)."""
        with self._lock:
            if not self._leadership.is_leader or self._leadership.epoch != epoch:
                return f"epoch {epoch} is not this instance's term"
            if self._loaded_epoch == epoch:
                return None
            try:
                self.driver.load(self._reader(self._settings))
            except Exception as exc:
                self.last_error = f"reading the rollouts topic: {type(exc).__name__}: {exc}"
                log.warning("rollouts: %s (retrying)", self.last_error)
                return self.last_error
            self._loaded_epoch = epoch
            return None

    def tick(self) -> int:
        """Called by the reconcile loop: resume (once per leadership), then advance every rollout."""
        with self._lock:
            if not self._leadership.is_leader:
                if self._loaded_epoch is not None:
                    self._windows.close()
                self._loaded_epoch = None
                self._refresh_standby_view()
                return 0
            try:
                if not self._loaded:
                    self.driver.load(self._reader(self._settings))
                    self._loaded_epoch = self._leadership.epoch
                changed = self.driver.run_once(self._publisher)
                for model, entry in self.driver.entries.items():
                    if entry.rollout.terminal and hasattr(self._windows, "close"):
                        self._windows.close(model)
                self.last_error = None
                if self._metrics is not None:
                    self._metrics.export(self.driver.entries.values())
                return changed
            except Exception as exc:  # a failed pass is retried next tick; the reconcile loop goes on
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("rollouts: tick failed (%s); retrying next pass", self.last_error)
                return 0

    # --- the API's ----------------------------------------------------------------------------
    def begin(self, stable_spec: Any, canary_spec: Any) -> Entry:
        with self._lock:
            self._require_leader()
            entry, records = self.driver.begin(stable_spec, canary_spec)
            self._publisher.publish(records)
            self.driver.commit(entry)
            return entry

    def act(self, model: str, action: str, who: str) -> Entry:
        with self._lock:
            self._require_leader()
            entry, records = self.driver.act(model, action, who)
            self._publisher.publish(records)
            self.driver.commit(entry)
            return entry

    def active(self, model: str) -> bool:
        """Whether a rollout of ``model`` is unfinished (the leader's view)."""
        with self._lock:
            entry = self.driver.get(model)
            return entry is not None and not entry.rollout.terminal

    def unfinished(self) -> set[str]:
        """The models with an unfinished rollout (the controller plans them every pass)."""
        with self._lock:
            return {model for model, e in self.driver.entries.items() if not e.rollout.terminal}

    def in_progress(self, model: str) -> str | None:
        """Why a rollout holds ``model``'s autoscaling (the controller's ``RolloutView``; None: no unfinished
        rollout): scaling while a canary's gates compare versions would change what they compare."""
        with self._lock:
            entry = self.driver.get(model)
            if entry is None or entry.rollout.terminal:
                return None
            return f"rollout to {entry.rollout.canary_version}: {entry.rollout.label}"

    def replicas_of(self, model: str) -> Any:
        """The controller's ``RolloutView.replicas_of``: phase and both spec documents of an unfinished rollout
        (None: none, or this instance does not lead: a standby plans nothing)."""
        from sie.control.reconcile.ports import RolloutReplicas

        with self._lock:
            entry = self.driver.get(model) if self._leadership.is_leader and self._loaded else None
            if entry is None or entry.rollout.terminal:
                return None
            r = entry.rollout
            phase = str(r.paused_from) if r.paused_from is not None else str(r.phase)
            return RolloutReplicas(phase, r.stable_version, r.canary_version, entry.stable_spec, entry.canary_spec)

    def list(self) -> list[dict[str, Any]]:
        """Every model's rollout (JSON-able): the leader's view, or the topic's on a standby."""
        with self._lock:
            entries = list(self.driver.entries.values()) if self._leadership.is_leader and self._loaded \
                else list(self._standby)
        return [describe(e) for e in sorted(entries, key=lambda e: e.rollout.model)]

    def _refresh_standby_view(self) -> None:
        if self._mono() - self._standby_at < STANDBY_REFRESH_S:
            return
        self._standby_at = self._mono()
        try:
            self._standby = [Entry.from_record(r) for r in self._reader(self._settings)]
            self.last_error = None
            if self._metrics is not None:
                self._metrics.export(self._standby)
        except Exception as exc:  # the view stays as it was; /healthz shows why
            self.last_error = f"reading the rollouts topic: {type(exc).__name__}: {exc}"

    def _require_leader(self) -> None:
        if not self._leadership.is_leader or not self._loaded:
            raise NotLeader("this control plane is not the leader (or has not resumed the rollouts yet)")


class RolloutMetrics:
    """Per model: the rollout's phase (1 for the current one, 0 for the others), canary weight and epoch."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Gauge

        from sie.control.rollout.machine import Phase

        self._phases = [str(p) for p in Phase]
        self.phase = Gauge("sie_rollout_phase", "1 for the rollout's current phase, 0 for the others",
                           ["model_id", "phase"], registry=registry)
        self.weight = Gauge("sie_rollout_canary_weight_ratio", "Share of requests on the new version (0..1)",
                            ["model_id"], registry=registry)
        self.epoch = Gauge("sie_rollout_weight_epoch", "Weight epoch the scorers apply", ["model_id"],
                           registry=registry)

    def export(self, entries: Any) -> None:
        for entry in entries:
            r = entry.rollout
            for phase in self._phases:
                self.phase.labels(r.model, phase).set(1 if phase == str(r.phase) else 0)
            self.weight.labels(r.model).set(r.weight_bp / 10_000)
            self.epoch.labels(r.model).set(r.epoch)


def describe(entry: Entry) -> dict[str, Any]:
    """What the API and ``sie rollout status`` show for one rollout."""
    r = entry.rollout
    return {"model": r.model, "stable_version": r.stable_version, "canary_version": r.canary_version,
            "phase": str(r.phase), "label": r.label, "step": r.step, "steps": list(r.policy.steps),
            "weight_percent": r.weight_bp / 100, "epoch": r.epoch, "started_ms": r.started_ms,
            "phase_since_ms": r.phase_since_ms, "reason": r.reason,
            "events": [e.to_document() for e in r.events]}
