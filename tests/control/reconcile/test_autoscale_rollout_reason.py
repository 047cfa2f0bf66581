"""The Autoscale reason follows a rollout's steps (issue 38, item 7): the autoscaler holds a model while a rollout
runs and says which step (``rollout to 1.1.0: Canary 50%``), but the status was re-published only for a new
decision, so `sie describe` kept the reason of the step the hold began in (``Surging``) through the whole rollout.
Moving numbers in other reasons still publish nothing (test_elasticity_unit)."""

from __future__ import annotations

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    gpu,
    heartbeat,
    register,
)
from tests.control.reconcile.test_elasticity_unit import POLICY, FakeSignals, scalable, tick


class Rollouts:
    """The controller's ``RolloutView``: a rollout at the step the test sets (no replica plan of its own)."""

    def __init__(self) -> None:
        self.label: str | None = None

    def in_progress(self, model: str) -> str | None:
        return f"rollout to 1.1.0: {self.label}" if self.label else None

    def replicas_of(self, model: str) -> None:
        return None


def test_the_published_autoscale_reason_follows_the_rollout_step():
    clock, state, pub, signals, rollouts = FakeClock(), ClusterState(), FakePublisher(), FakeSignals(), Rollouts()
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(node_timeout_s=TIMEOUT, autoscale=POLICY),
                     signals=signals, rollouts=rollouts)
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    state.apply_spec("m", scalable("m"))
    signals.set("m", clock(), 0)
    ctl.reconcile(clock())
    seen = []
    for label in ("Surging", "Surging", "Canary 10%", "Canary 50%", "Canary 50%"):
        rollouts.label = label
        now = tick(clock, state, 1, {"node-a": ["m-0"]})
        signals.set("m", now, 3, arrivals=5, drained=5)
        rep = ctl.reconcile(now)
        seen += [r.value["autoscale"]["reason"] for r in rep.of("model-status") if r.value and r.value["autoscale"]]
    assert [s.split("(", 1)[1] for s in seen if "rollout in progress" in s] == [
        "rollout to 1.1.0: Surging)", "rollout to 1.1.0: Canary 10%)", "rollout to 1.1.0: Canary 50%)"]
    assert ctl.statuses["m"].autoscale["reason"] == "holding at 1: rollout in progress (rollout to 1.1.0: Canary 50%)"
