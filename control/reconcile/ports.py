"""What the controller is handed: the protocols of its side effects and views, and their null objects.

The reconcile pass (``controller.Controller``) never touches Kafka, a thread or another room itself; it
publishes through a ``Publisher``, asks ``Leadership`` whether it leads, a ``StateView`` whether its state
is fresh, a ``TakeoverView`` whether a new leader loaded what its predecessor published, a ``SignalSource``
for backlog signals and a ``RolloutView`` for rollouts in progress.  Production passes the leader
(``leader``), the state feeder (``feeder``), ``service.Takeover``, ``signals.BacklogSampler`` and
``rollout.service.Rollouts``; unit tests pass the null objects here (``StaticLeadership``, ``FreshView``,
``Loaded``, ``NoRollouts``) and a fake publisher.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sie.control.reconcile.autoscaler import ModelSignals


@dataclass(frozen=True)
class OutRecord:
    """One record to publish: ``topic`` is the system topic suffix (``assignments``, ``events`` ...);
    ``value`` None = tombstone."""

    topic: str
    key: str
    record: str
    value: Mapping[str, Any] | None


class Publisher(Protocol):
    """Publishes one pass's records atomically (one transaction); raises ``Fenced`` when a newer
    leader took over, any other exception when the publish failed and must be retried."""

    def publish(self, records: Sequence[OutRecord]) -> None: ...


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    def step_down(self, reason: str) -> None: ...


class StateView(Protocol):
    """How fresh the state is (the state feeder in production; ``FreshView`` in unit tests)."""

    @property
    def caught_up_at(self) -> float | None:
        """When the reader last caught up (controller clock); None while it is not caught up."""
        ...

    def stale_reason(self) -> str | None:
        """Why the state may be missing records right now (None: it is not)."""
        ...

    def lag_reason(self) -> str | None:
        """Why heartbeats are read late (None: they are not)."""
        ...


class TakeoverView(Protocol):
    """What a new leader must have loaded before its first pass (``service.Takeover`` in production)."""

    def not_loaded(self, epoch: int) -> str | None:
        """Why the leader of ``epoch`` cannot act yet (None: everything its predecessor published is loaded).
        Called once per pass while leading, before the state is read: the first call of a term starts the
        loading."""
        ...


class Loaded:
    """A takeover with nothing to load (unit tests feed ``ClusterState`` and the rollouts directly)."""

    def not_loaded(self, epoch: int) -> str | None:
        return None


class SignalSource(Protocol):
    """Each autoscaled model's latest backlog signal (``signals.BacklogSampler`` in production)."""

    def signals(self) -> Mapping[str, ModelSignals]: ...


class RolloutView(Protocol):
    """The rollout hook: why a rollout of ``model`` holds its autoscaling right now (None: no rollout in
    progress), so scaling never fights a rollout.  ``sie control`` passes its ``Rollouts``
    (``rollout.service.Rollouts.in_progress``)."""

    def in_progress(self, model: str) -> str | None: ...

    def replicas_of(self, model: str) -> RolloutReplicas | None:
        """The rollout's phase and versions while the controller plans its replicas (None: no rollout)."""
        ...

    # optional: ``unfinished() -> set[str]``, the models with an unfinished rollout (the incremental pass keeps
    # them in scope); a view without it makes every pass plan every model


class NoRollouts:
    def in_progress(self, model: str) -> str | None:
        return None

    def unfinished(self) -> set[str]:
        return set()

    def replicas_of(self, model: str) -> RolloutReplicas | None:
        return None


@dataclass(frozen=True)
class RolloutReplicas:
    """What the controller needs of an unfinished rollout to plan the model's replicas
    (``rollout_capacity``): its phase and both versions' spec documents."""

    phase: str
    stable_version: str
    canary_version: str
    stable_spec: Mapping[str, Any]
    canary_spec: Mapping[str, Any]


class FreshView:
    """A state that is always complete and current (unit tests feed ``ClusterState`` directly)."""

    caught_up_at: float | None = float("-inf")

    def stale_reason(self) -> str | None:
        return None

    def lag_reason(self) -> str | None:
        return None


@dataclass
class StaticLeadership:
    """Leadership decided by the caller (unit tests, single-instance runs without a group)."""

    leader: bool = True
    current_epoch: int = 1
    reasons: list[str] = field(default_factory=list)

    @property
    def is_leader(self) -> bool:
        return self.leader

    @property
    def epoch(self) -> int:
        return self.current_epoch

    def step_down(self, reason: str) -> None:
        self.leader = False
        self.reasons.append(reason)
