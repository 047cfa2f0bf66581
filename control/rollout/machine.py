"""The rollout state machine: one model moving from a stable version to a new one, step by step.

WHY a pure module: every decision of a rollout (advance a step, roll back, pause) is a function of the
current ``Rollout`` value, the time and the canary/stable numbers of one window.  Nothing here reads a
clock, Kafka or a socket, so a test drives a whole rollout with a fake clock in microseconds, and the
leader that runs it (``sie.control.rollout.driver``) only stores the value on the compacted
rollouts topic and publishes the weights it names; a new leader resumes from the stored value.

Phases (``Phase``) and the only ways between them (``TRANSITIONS``, enforced by ``_move``)::

    Pending -> Surging -> Canary(step 0..n-1) -> Promoting -> Draining -> Complete
                  |             |      ^
                  |             v      |  (manual pause / resume; promote skips the remaining steps)
                  |           Paused --+
                  |             |
                  +--> Failed   +--> RollingBack -> RolledBack     (a failing gate, or a manual abort)

Each transition is an ``Event`` with its reason, kept in ``Rollout.events`` (the timeline).

The canary's share of traffic is ``Rollout.weight_bp`` (basis points, 1/10,000) and ``Rollout.epoch``
counts its changes: scorers apply a weight set only as a whole ``(epoch, weight_bp)``, at a
transaction boundary (``sie.streams.scorer.rollout``).  Weights only rise through the steps; rollback
puts them to 0 at once.

SLO gates (``Gates``, judged by ``sie.control.rollout.gates.judge``) compare the canary with the stable
version over the same window, each as a sequential test with a stated confidence: p99 against an absolute
limit and (inference time) relative to stable, error (inference error + dead letter) rate and expiry rate
against stable's plus an allowance, and they judge only once the canary answered ``min_samples``
requests.  A failing gate rolls back at the tick that sees it (so within one interval); a step advances
when its interval has elapsed and every gate passed; a step still without a verdict after
``inconclusive_intervals`` more intervals is decided by the truncated tests (``GateResult.at_deadline``:
on, if no gate leans worse; else back), so an inconclusive canary never holds its share forever.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sie.control.rollout.gates import Answer, GateResult, Verdict, VersionWindow, judge
from sie.kernel.errors import SieError
from sie.schemas.rollout_policy import DEFAULT_INTERVAL_S, DEFAULT_STEPS, Gates, Policy

__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_STEPS", "FULL_BP", "TRANSITIONS", "Answer", "Event", "Gates", "GateResult",
           "Phase",
           "Policy", "Rollout", "RolloutError", "RolloutTransitionError", "Verdict", "VersionWindow", "judge",
           "new_rollout", "weights_of"]

FULL_BP = 10_000


class Phase(enum.StrEnum):
    PENDING = "Pending"
    SURGING = "Surging"
    CANARY = "Canary"
    PROMOTING = "Promoting"
    DRAINING = "Draining"
    COMPLETE = "Complete"
    PAUSED = "Paused"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


#: phase -> phases it may move to; anything else is a bug in a handler (``RolloutTransitionError``)
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.SURGING, Phase.PAUSED, Phase.ROLLING_BACK, Phase.FAILED}),
    Phase.SURGING: frozenset({Phase.CANARY, Phase.PAUSED, Phase.ROLLING_BACK, Phase.FAILED}),
    # CANARY -> CANARY: the next step
    Phase.CANARY: frozenset({Phase.CANARY, Phase.PROMOTING, Phase.PAUSED, Phase.ROLLING_BACK}),
    Phase.PROMOTING: frozenset({Phase.DRAINING, Phase.FAILED}),
    Phase.DRAINING: frozenset({Phase.COMPLETE, Phase.FAILED}),
    Phase.PAUSED: frozenset({Phase.PENDING, Phase.SURGING, Phase.CANARY, Phase.PROMOTING, Phase.ROLLING_BACK}),
    Phase.ROLLING_BACK: frozenset({Phase.ROLLED_BACK, Phase.FAILED}),
    Phase.COMPLETE: frozenset(),
    Phase.ROLLED_BACK: frozenset(),
    Phase.FAILED: frozenset(),
}
TERMINAL = frozenset({Phase.COMPLETE, Phase.ROLLED_BACK, Phase.FAILED})


class RolloutError(SieError):
    """An operator action the rollout's phase does not allow (the message names the phase and the fix)."""


class RolloutTransitionError(RolloutError):
    """A transition missing from ``TRANSITIONS``: a handler bug, never published."""


@dataclass(frozen=True)
class Event:
    """One transition: when, from where to where, at which step and weight, and why."""

    at_ms: int
    source: Phase
    target: Phase
    step: int
    weight_bp: int
    reason: str

    def to_document(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "from": str(self.source), "to": str(self.target), "step": self.step,
                "weight_bp": self.weight_bp, "reason": self.reason}

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Event:
        return cls(int(doc["at_ms"]), Phase(doc["from"]), Phase(doc["to"]), int(doc["step"]),
                   int(doc["weight_bp"]), str(doc["reason"]))


@dataclass(frozen=True)
class Rollout:
    """One rollout's whole state (what the compacted rollouts topic stores under the model's key)."""

    model: str
    stable_version: str
    canary_version: str
    policy: Policy
    phase: Phase = Phase.PENDING
    step: int = -1  # index into policy.steps while in (or paused from) Canary; -1 before the first step
    weight_bp: int = 0  # the canary's share, basis points
    epoch: int = 0  # bumped on every weight change: scorers apply (epoch, weight) as one value
    started_ms: int = 0
    phase_since_ms: int = 0  # when the phase (or the current canary step) began
    paused_from: Phase | None = None
    reason: str = ""
    events: tuple[Event, ...] = ()

    # --- views --------------------------------------------------------------------
    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def label(self) -> str:
        """``Canary(step 2, 50%)`` and the like: what ``sie get rollouts`` shows."""
        if self.phase is Phase.CANARY or (self.phase is Phase.PAUSED and self.paused_from is Phase.CANARY):
            step = f"Canary(step {self.step + 1}/{len(self.policy.steps)}, {self.weight_bp / 100:g}%)"
            return f"Paused[{step}]" if self.phase is Phase.PAUSED else step
        if self.phase is Phase.PAUSED and self.paused_from is not None:
            return f"Paused[{self.paused_from}]"
        return str(self.phase)

    # --- the one way to change phase ------------------------------------------------
    def _move(self, target: Phase, now_ms: int, reason: str, **changes: Any) -> Rollout:
        if target not in TRANSITIONS[self.phase]:
            raise RolloutTransitionError(f"rollout {self.model}: {self.phase} -> {target} is not a transition "
                                         f"(allowed: {sorted(str(p) for p in TRANSITIONS[self.phase]) or 'none'})")
        weight = changes.get("weight_bp", self.weight_bp)
        if weight != self.weight_bp:
            changes["epoch"] = self.epoch + 1
        step = changes.get("step", self.step)
        event = Event(now_ms, self.phase, target, step, weight, reason)
        return replace(self, phase=target, phase_since_ms=now_ms, reason=reason, events=(*self.events, event),
                       **changes)

    # --- handlers: the leader's ---------------------------------------------------------
    def start(self, now_ms: int) -> Rollout:
        """Pending -> Surging: the new version's replicas are being started (and health-checked)."""
        self._expect(Phase.PENDING, "start")
        return self._move(Phase.SURGING, now_ms, f"starting {self.canary_version} next to {self.stable_version}",
                          started_ms=now_ms)

    def surge_ready(self, now_ms: int, detail: str = "new version ready") -> Rollout:
        """Surging -> Canary(step 0): the new version answered a real inference."""
        self._expect(Phase.SURGING, "surge_ready")
        return self._step_to(0, now_ms, detail)

    def surge_failed(self, now_ms: int, detail: str) -> Rollout:
        """Surging -> Failed: the new version never became ready; stable kept all traffic throughout."""
        self._expect(Phase.SURGING, "surge_failed")
        return self._move(Phase.FAILED, now_ms, f"new version not ready: {detail}", weight_bp=0)

    def tick(self, now_ms: int, canary: VersionWindow | None = None, stable: VersionWindow | None = None,
             waiting: str = "", failure: str = "", unserved: str = "") -> Rollout:
        """Time passes: judge the current canary step (roll back on a failing gate, advance when its interval
        has elapsed and the gates pass); fail a surge that takes too long (``waiting``: what it waited for,
        named in the failure).  ``failure``: a version cannot be served on some replica (it could not be
        prepared or loaded there, or its process was lost too often): a surge fails, a canary step rolls back
        at once.  A canary that answered nothing for a whole interval while stable answered ``minSamples``
        rolls back too (no other version answers its share: the replicas that cannot serve it hold no partitions),
        and so does one that answered nothing for a whole interval while no replica can serve it (``unserved``:
        why; every replica then holds no partitions and stable answers nothing either).  Other phases: unchanged
        (Paused holds)."""
        elapsed_s = (now_ms - self.phase_since_ms) / 1000.0
        if self.phase is Phase.SURGING and failure:
            return self.surge_failed(now_ms, failure)
        if self.phase is Phase.SURGING and elapsed_s >= self.policy.surge_timeout_s:
            return self.surge_failed(now_ms, f"not ready within surgeTimeoutSeconds {self.policy.surge_timeout_s:g}"
                                     + (f" ({waiting})" if waiting else ""))
        if self.phase is not Phase.CANARY:
            return self
        at = f"{self.weight_bp / 100:g}%"
        if failure:
            return self._move(Phase.ROLLING_BACK, now_ms, f"canary failed at {at}: {failure}", weight_bp=0)
        canary, stable = canary or VersionWindow(), stable or VersionWindow()
        if (canary.requests == 0 and stable.requests >= self.policy.gates.min_samples
                and elapsed_s >= self.policy.interval_s):
            return self._move(Phase.ROLLING_BACK, now_ms,
                              f"canary {self.canary_version} answered no request in {elapsed_s:.0f}s at {at} while "
                              f"{self.stable_version} "
                              f"answered {stable.requests}: its share never reached it (see the replicas' "
                              f"versions in sie describe model)", weight_bp=0)
        if canary.requests == 0 and unserved and elapsed_s >= self.policy.interval_s:
            return self._move(Phase.ROLLING_BACK, now_ms,
                              f"no replica could serve canary {self.canary_version} for {elapsed_s:.0f}s at {at}: "
                              f"{unserved}", weight_bp=0)
        result = judge(self.policy.gates, canary, stable, steps=len(self.policy.steps))
        if result.verdict is Verdict.FAIL:
            return self._move(Phase.ROLLING_BACK, now_ms, f"gate failed at {self.weight_bp / 100:g}%: {result.line()}",
                              weight_bp=0)
        if elapsed_s < self.policy.interval_s:
            return self
        passed = f"gates passed at {self.weight_bp / 100:g}%: {result.line()}"
        if result.verdict is Verdict.INCONCLUSIVE:
            # the step waits for a verdict, but not forever: at its deadline the truncated tests decide
            deadline_s = self.policy.interval_s * (1 + self.policy.gates.inconclusive_intervals)
            if elapsed_s < deadline_s:
                return self
            if result.at_deadline() is Verdict.FAIL:
                return self._move(Phase.ROLLING_BACK, now_ms,
                                  f"no verdict at {self.weight_bp / 100:g}% within {deadline_s:g} s (intervalSeconds x "
                                  f"(1 + inconclusiveIntervals {self.policy.gates.inconclusive_intervals})), leaning "
                                  f"worse or too few answers: {result.line()}; for a model with little traffic raise "
                                  f"intervalSeconds or lower gates.minSamples", weight_bp=0)
            passed = (f"gates passed at {self.weight_bp / 100:g}% at the step's deadline ({deadline_s:g} s), no gate "
                      f"leaning worse: {result.line()}")
        if self.step + 1 < len(self.policy.steps):
            return self._step_to(self.step + 1, now_ms, passed)
        return self._move(Phase.PROMOTING, now_ms, passed, weight_bp=FULL_BP)

    def promoted(self, now_ms: int) -> Rollout:
        """Promoting -> Draining: the new version is the model's stable version; old replicas drain."""
        self._expect(Phase.PROMOTING, "promoted")
        return self._move(Phase.DRAINING, now_ms, f"{self.canary_version} is stable; draining {self.stable_version}")

    def drained(self, now_ms: int, detail: str = "") -> Rollout:
        self._expect(Phase.DRAINING, "drained")
        return self._move(Phase.COMPLETE, now_ms, f"{self.stable_version} drained" + (f": {detail}" if detail else ""))

    def rolled_back(self, now_ms: int) -> Rollout:
        self._expect(Phase.ROLLING_BACK, "rolled_back")
        return self._move(Phase.ROLLED_BACK, now_ms, f"all traffic on {self.stable_version}; "
                                                     f"{self.canary_version} stopped")

    # --- handlers: the operator's -------------------------------------------------------
    def pause(self, now_ms: int, who: str = "operator") -> Rollout:
        if self.phase not in (Phase.PENDING, Phase.SURGING, Phase.CANARY):
            raise RolloutError(f"rollout {self.model}: cannot pause in {self.phase} (only Pending, Surging, Canary)")
        return self._move(Phase.PAUSED, now_ms, f"paused by {who} at {self.weight_bp / 100:g}%",
                          paused_from=self.phase)

    def resume(self, now_ms: int, who: str = "operator") -> Rollout:
        if self.phase is not Phase.PAUSED or self.paused_from is None:
            raise RolloutError(f"rollout {self.model}: not paused ({self.phase}); nothing to resume")
        # the step's interval starts again: the gates judge a full window of the resumed traffic
        return self._move(self.paused_from, now_ms, f"resumed by {who}", paused_from=None)

    def promote(self, now_ms: int, who: str = "operator") -> Rollout:
        """Skip the remaining steps: 100 % to the new version now (gates no longer judge)."""
        if self.phase not in (Phase.CANARY, Phase.PAUSED) or (self.phase is Phase.PAUSED
                                                              and self.paused_from is not Phase.CANARY):
            raise RolloutError(f"rollout {self.model}: can promote only during Canary (or paused in it), "
                               f"not {self.label}")
        return self._move(Phase.PROMOTING, now_ms, f"promoted by {who}", weight_bp=FULL_BP, paused_from=None)

    def abort(self, now_ms: int, who: str = "operator") -> Rollout:
        """All traffic back to the stable version now."""
        if self.phase not in (Phase.PENDING, Phase.SURGING, Phase.CANARY, Phase.PAUSED):
            raise RolloutError(f"rollout {self.model}: cannot abort in {self.phase}")
        return self._move(Phase.ROLLING_BACK, now_ms, f"aborted by {who}", weight_bp=0, paused_from=None)

    # --- helpers -------------------------------------------------------------------------
    def _expect(self, phase: Phase, handler: str) -> None:
        if self.phase is not phase:
            raise RolloutTransitionError(f"rollout {self.model}: {handler} needs {phase}, is {self.phase}")

    def _step_to(self, step: int, now_ms: int, reason: str) -> Rollout:
        weight = self.policy.steps[step] * 100
        return self._move(Phase.CANARY, now_ms, f"{reason}; canary {weight / 100:g}%", step=step, weight_bp=weight)

    # --- wire form ---------------------------------------------------------------------------
    def to_document(self) -> dict[str, Any]:
        return {"model": self.model, "stable_version": self.stable_version, "canary_version": self.canary_version,
                "policy": self.policy.to_document(), "phase": str(self.phase), "step": self.step,
                "weight_bp": self.weight_bp, "epoch": self.epoch, "started_ms": self.started_ms,
                "phase_since_ms": self.phase_since_ms,
                "paused_from": str(self.paused_from) if self.paused_from else None, "reason": self.reason,
                "events": [e.to_document() for e in self.events]}

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Rollout:
        policy_doc = doc.get("policy") or {}
        return cls(model=str(doc["model"]), stable_version=str(doc["stable_version"]),
                   canary_version=str(doc["canary_version"]), policy=Policy.from_document(policy_doc),
                   phase=Phase(doc["phase"]), step=int(doc["step"]), weight_bp=int(doc["weight_bp"]),
                   epoch=int(doc["epoch"]), started_ms=int(doc["started_ms"]),
                   phase_since_ms=int(doc["phase_since_ms"]),
                   paused_from=Phase(doc["paused_from"]) if doc.get("paused_from") else None,
                   reason=str(doc.get("reason") or ""),
                   events=tuple(Event.from_document(e) for e in doc.get("events") or ()))


def new_rollout(model: str, stable_version: str, canary_version: str, policy: Policy, now_ms: int) -> Rollout:
    """A Pending rollout (the leader starts it at its next tick)."""
    if stable_version == canary_version:
        raise RolloutError(f"rollout {model}: {canary_version} is already the stable version")
    return Rollout(model, stable_version, canary_version, policy, started_ms=now_ms, phase_since_ms=now_ms,
                   reason=f"{stable_version} -> {canary_version} requested")


def weights_of(rollout: Rollout) -> Sequence[tuple[str, int]]:
    """(version, basis points) pairs in a fixed order, stable first: the order keeps stickiness monotone."""
    return ((rollout.stable_version, FULL_BP - rollout.weight_bp), (rollout.canary_version, rollout.weight_bp))
