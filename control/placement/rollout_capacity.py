"""Capacity during a rollout: which version each replica of the model runs, one pure decision per pass.

WHY a pure function: "never below demand" is a rule about counts (replicas READY, replicas traffic
needs, room on the GPUs), and the controller re-derives it every reconcile pass from what it sees, so a
test drives a whole rollout's replica plan with plain values and a new leader reaches the same plan.

What a replica of a model in a rollout is: every scorer replica runs BOTH versions in-process and splits
each batch by key (``sie.streams.scorer.rollout``), so the traffic split never depends on which replica
runs which version; the replica's own version decides which backend it loads first and proves with its
readiness inference before the agent reports it READY (``sie.workers.readiness``), and what it serves once
the rollout ends.  The plan (``plan_capacity``):

* **Both versions on every replica**: each READY replica also serves the rollout's other version from a
  process of its own, prepared by its agent (``ReplicaAssignment.companions``, ``sie.workers.versions``) and
  reported in heartbeats; the plan says whether all of them are ready (``companions_ready``: Surging ends only
  then, so the canary's first share is answered by the canary on every replica) and names one that FAILED
  (``companion_failed``: the rollout fails or rolls back, docs/rollouts.md).
* **Before the stable version's weight is 0** (Surging, Canary, Paused, Promoting): one new-version
  replica is started, as a *surge* (an extra replica, index ``count``) when the GPUs have room for it
  without evicting anything, else by *replacing* the highest-index stable replica, and that only while
  the replicas left READY still cover the demand (``ready - 1 >= demand``); otherwise the step waits, and
  says why.  A new-version replica once started is kept (the plan is sticky: a later pass never flips it
  back).  The rollout leaves Surging only when it is READY (``CapacityPlan.new_ready``): a real inference
  of the new version on a fresh worker, not an open port.
* **Draining** (the stable weight is 0; the specs topic already names the new version): the remaining
  stable replicas are replaced one at a time, each only when every replica is READY and one fewer still
  covers the demand; their workers stop on SIGTERM after committing their in-flight batch.  The surge
  replica goes last, once every other replica runs the new version READY; then ``drained`` is True.
* A model none of whose replicas is assigned to an agent (scorers started by hand or by a test) has no
  plan (``unmanaged``): the controller cannot see those scorers, which load the new version in-process at
  weight 0 (and prove it with a readiness inference when an agent's worker runs them).
* A rollout that ends by rolling back needs no plan: the controller places the stable spec again, which
  stops the new-version replicas (at canary weight 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict

#: phases in which the stable version still has traffic (a new-version replica may be added, never stable ones removed)
SURGE_PHASES = frozenset({"Pending", "Surging", "Canary", "Paused", "Promoting"})
DRAIN_PHASE = "Draining"
#: the phases with a plan (RollingBack and the terminal ones place the applied spec as ever)
PLANNED_PHASES = SURGE_PHASES | {DRAIN_PHASE}


@dataclass(frozen=True)
class CapacityInputs:
    """One model in a rollout, as the controller sees it this pass."""

    phase: str
    stable_version: str
    canary_version: str
    #: replicas the model should have (the autoscaler's count, held during a rollout, or sla.min_replicas)
    count: int
    #: replicas current traffic needs (the autoscaler's measured ``needed``, else sla.min_replicas)
    demand: int
    #: replica index -> the version it is assigned now (published assignments; absent: not assigned)
    assigned: Mapping[int, str]
    #: replica indices whose agent reports them READY with their assigned version
    ready: frozenset[int]
    #: a new-version replica fits in free room (GPU, CPU, memory) without evicting anything (a trial placement)
    surge_fits: bool
    #: new-version replica index -> what its agent reports while it is not READY (``CRASHED: ...``)
    problems: Mapping[int, str] = field(default_factory=dict)
    #: why a surge replica does not fit now, when it does not (the placement's reason, or its cool-down after
    #: it FAILED on the node)
    surge_blocked: str = ""
    #: replica index -> (state, detail) of the OTHER version the replica serves from a process of its own
    #: (``ReplicaReport.versions``: waiting | loading | ready | failed), for replicas READY on their own version
    companions: Mapping[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class CapacityPlan:
    """Which version each replica index runs this pass, and where the rollout's capacity stands."""

    versions: tuple[str, ...]  # index -> version; len = count, or count + 1 while a surge replica runs
    mode: str  # surge | replace | wait | drain | drained | unmanaged
    reason: str
    new_ready: int = 0  # new-version replicas READY
    drained: bool = False  # Draining: every replica runs the new version READY, no surge replica left
    #: what the new-version replicas' agents report while none is READY (shown while waiting; not part of
    #: ``reason``, whose changes are events: a crash-looping replica's counters would make one a pass)
    detail: str = ""
    #: every READY replica serves the other version too (its companion process is ready): the canary may get
    #: traffic without any replica answering its share with the stable version instead
    companions_ready: bool = True
    #: what keeps ``companions_ready`` False (the first replica not ready and why)
    companions_waiting: str = ""
    #: a replica's other version FAILED (could not be prepared or loaded, or was lost too often): the rollout
    #: cannot go on with it; the replica and why
    companion_failed: str = ""
    #: READY replicas that serve both versions now (their companion is ready): only these hold partitions in a
    #: canary step (``sie.streams.scorer.rollout``); none for a whole step rolls the rollout back
    serving_both_replicas: int = 0

    @property
    def serving_both(self) -> bool:
        """The rollout's versions can both answer on every READY replica now (Surging may end)."""
        return self.new_ready >= 1 and self.companions_ready

    @property
    def waiting(self) -> str:
        return f"{self.mode}: {self.reason}" + (f"; {self.detail}" if self.detail else "")


def _ready_new(i: CapacityInputs, versions: tuple[str, ...]) -> int:
    return sum(1 for idx, v in enumerate(versions) if v == i.canary_version and idx in i.ready
               and i.assigned.get(idx) == v)


def plan_capacity(i: CapacityInputs) -> CapacityPlan:
    """The replica plan of a model in a rollout (module docstring)."""
    plan = _plan(i)
    troubles = [f"replica {idx} ({i.canary_version}): {why}" for idx, why in sorted(i.problems.items())]
    if troubles and not plan.new_ready:
        plan = replace(plan, detail="; ".join(troubles))
    return replace(plan, **_companions(i))


class _Companions(TypedDict):
    companions_ready: bool
    companions_waiting: str
    companion_failed: str
    serving_both_replicas: int


def _companions(i: CapacityInputs) -> _Companions:
    """Whether every READY replica also serves the other version (its companion), and which one failed."""
    waiting, failed, both = [], [], 0
    for idx in sorted(i.ready):
        own = i.assigned.get(idx)
        if own is None:
            continue
        other = i.canary_version if own == i.stable_version else i.stable_version
        state, why = i.companions.get(idx, ("waiting", "not reported yet"))
        if state == "ready":
            both += 1
        elif state == "failed":
            failed.append(f"version {other} FAILED on replica {idx}: {why}")
        elif state != "ready":
            waiting.append(f"replica {idx} {state} {other}" + (f" ({why})" if why else ""))
    return {"companions_ready": not waiting and not failed, "companions_waiting": "; ".join(waiting[:3]),
            "companion_failed": "; ".join(failed[:3]), "serving_both_replicas": both}


def _plan(i: CapacityInputs) -> CapacityPlan:
    count = max(0, i.count)
    current = tuple(i.assigned.get(idx, i.stable_version) for idx in range(count))
    surge_running = i.assigned.get(count) == i.canary_version
    ready_now = sum(1 for idx in range(count + 1) if idx in i.ready and idx in i.assigned)
    if not i.assigned:
        return CapacityPlan((), "unmanaged", "no replica of the model is assigned to an agent: scorers run outside "
                                             "agents and load the new version in-process", drained=True)
    if i.phase == DRAIN_PHASE:
        return _drain(i, current, surge_running, ready_now)
    if i.phase not in SURGE_PHASES:
        raise ValueError(f"plan_capacity: no plan for phase {i.phase!r}")
    if surge_running or (i.canary_version not in current and i.surge_fits):
        versions = (*current, i.canary_version)
        return CapacityPlan(versions, "surge", f"surge replica {count} ({i.canary_version}): room for one more "
                                               f"replica next to {count}", _ready_new(i, versions))
    if i.canary_version in current:
        return CapacityPlan(current, "replace", f"no room for a surge replica: replica "
                                                f"{current.index(i.canary_version)} replaced by {i.canary_version}",
                            _ready_new(i, current))
    if count == 0:
        return CapacityPlan(current, "wait", "no replica to replace and no room for a new one")
    no_room = "no room for a surge replica" + (f" ({i.surge_blocked})" if i.surge_blocked else "")
    if ready_now - 1 >= i.demand:
        versions = (*current[:-1], i.canary_version)
        return CapacityPlan(versions, "replace", f"{no_room}: replica {count - 1} replaced by {i.canary_version}",
                            _ready_new(i, versions))
    return CapacityPlan(current, "wait", f"{no_room}, and replacing one of {ready_now} READY replicas would leave "
                                         f"{ready_now - 1} < demand {i.demand}")


def _drain(i: CapacityInputs, current: tuple[str, ...], surge_running: bool, ready_now: int) -> CapacityPlan:
    count = len(current)
    base = (*current, i.canary_version) if surge_running else current
    old = [idx for idx, v in enumerate(current) if v != i.canary_version]
    settling = [idx for idx in range(len(base)) if idx not in i.ready or i.assigned.get(idx) != base[idx]]
    if settling:
        return CapacityPlan(base, "drain", f"waiting for replica {settling[0]} to be READY on "
                                           f"{base[settling[0]]} (one replacement at a time)", _ready_new(i, base))
    if old:
        if ready_now - 1 < i.demand:
            return CapacityPlan(base, "wait", f"replacing replica {old[-1]} would leave {ready_now - 1} READY < "
                                              f"demand {i.demand}; waiting for capacity", _ready_new(i, base))
        nxt = old[-1]
        versions = tuple(i.canary_version if idx == nxt else v for idx, v in enumerate(base))
        return CapacityPlan(versions, "drain", f"replica {nxt} ({i.stable_version}, weight 0) replaced by "
                                               f"{i.canary_version}; {len(old) - 1} left", _ready_new(i, base))
    # every regular replica runs the new version READY: the surge replica (if any) stops now
    return CapacityPlan(current, "drained", f"all {count} replicas run {i.canary_version} READY (a surge replica "
                                            f"stops)", _ready_new(i, current), drained=True)
