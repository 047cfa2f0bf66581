"""Step 3 of a pass, counts: each model's replica count, layer by layer (``counts`` has the one rule).

One pass (``Controller``'s ``autoscale``, ``director`` and ``rebalance`` steps)::

    counts, decisions, events = autoscale(snap, decisions, signals, ...)   # the leader decides; a standby follows
    look   = direct_replicas(snap, published, tracks, floors, counts, ...)  # leader: one replica more, cooler node
    counts = with_director_floors(snap, counts, look.floors)
    outcome, events = rebalance(rebalancer, snap, counts, inventory, ...)   # leader: back toward the spread
    counts = with_rebalance_floors(snap, counts, outcome.floors)            # a move's replacement while it warms
    ... after placement: floors = drop_unplaced_floors(plan, floors)        # a floor nobody can place is lifted

=================================  =====================================================================
a model ...                        count this pass
=================================  =====================================================================
no signal source                   ``desired_count(spec)`` (its ``sla.min_replicas``)
fixed size (``can_scale`` False)   the low end of its range; no decision kept
on a standby                       the leader's last published decision (``takeover.seed_decisions``)
on the leader                      ``autoscaler.decide``; a changed count (or a block) is an event
=================================  =====================================================================

Pure functions over the snapshot, the counts and ``now``; what persists between passes (decisions, the
director's tracks and floors, the ``Rebalancer``) is the ``Controller``'s, passed in and returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sie.control.placement.engine import PlacementPlan, node_eligible
from sie.control.placement.inventory import ClusterInventory
from sie.control.reconcile.autoscaler import AutoscalePolicy, ModelInputs, ModelSignals, ScaleDecision, decide
from sie.control.reconcile.counts import can_scale, ceiling, desired_count, scale_range
from sie.control.reconcile.director import DirectorPolicy, Extra, Signal, Track, direct, replica_lever
from sie.control.reconcile.narration import EVENT_OF_ACTION, event
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.rebalance import RebalanceOutcome, Rebalancer
from sie.control.reconcile.records import AssignmentInfo, StateSnapshot
from sie.schemas.replica_state import ReplicaState

log = logging.getLogger(__name__)

#: why a rollout holds a model (None: none in progress): ``RolloutView.in_progress``
InProgress = Callable[[str], "str | None"]


@dataclass(frozen=True)
class ModelIndex:
    """One pass's per-model view of the heartbeats and a plan, built in one sweep.

    WHY: asked per model, "its READY replicas" and "its placed replicas" each scan every heartbeat and every
    placement: models x replicas per pass (bench/bench_scale.py, docs/control-plane.md).  Grouped once, each
    model's answer is a lookup.
    """

    #: model -> (READY replicas on online nodes, their highest p99, their inference rates)
    ready: Mapping[str, tuple[int, float | None, list[float]]]
    #: model -> its placed replica ids / its unplaced replicas (by replica id), of ``plan``
    placed: Mapping[str, list[str]]
    unplaced: Mapping[str, list[Any]]

    @classmethod
    def of(cls, snap: StateSnapshot, now: float, timeout_s: float, plan: PlacementPlan | None) -> ModelIndex:
        ready: dict[str, tuple[int, float | None, list[float]]] = {}
        for node, hb in snap.heartbeats.items():
            if not snap.node_online(node, now, timeout_s):
                continue
            for r in hb.replicas:
                if r.state != ReplicaState.READY:
                    continue
                count, p99, rates = ready.get(r.model, (0, None, []))
                if r.p99_ms is not None:
                    p99 = r.p99_ms if p99 is None else max(p99, r.p99_ms)
                if r.inference_rps:
                    rates.append(r.inference_rps)
                ready[r.model] = (count + 1, p99, rates)
        placed: dict[str, list[str]] = {}
        unplaced: dict[str, list[Any]] = {}
        if plan is not None:
            for rid, p in plan.placements.items():
                placed.setdefault(p.model, []).append(rid)
            for rid in sorted(plan.unplaced):
                u = plan.unplaced[rid]
                unplaced.setdefault(u.model, []).append(u)
        return cls(ready, placed, unplaced)


def autoscale_inputs(name: str, spec: Any, index: ModelIndex, rollout: str | None) -> ModelInputs:
    """What ``autoscaler.decide`` reads of one model (``rollout``: why a rollout holds it, or None)."""
    ready, p99, rates = index.ready.get(name, (0, None, []))
    placed = len(index.placed.get(name, ()))
    mine = index.unplaced.get(name, [])
    sla = spec.sla
    return ModelInputs(name, str(spec.priority_level), int(sla.min_replicas), int(sla.max_replicas),
                       sla.max_queue_time_ms, sla.p99_latency_ms, ready, placed, len(mine),
                       mine[0].reason if mine else None, p99,
                       sum(rates) / len(rates) if rates else None, rollout)


def autoscale(snap: StateSnapshot, decisions: Mapping[str, ScaleDecision], signals: Mapping[str, ModelSignals],
              leader: bool, last_plan: PlacementPlan | None, in_progress: InProgress, now: float, timeout_s: float,
              policy: AutoscalePolicy, names: Collection[str] | None = None,
              ) -> tuple[dict[str, int], dict[str, ScaleDecision], list[OutRecord]]:
    """(count per model, the decisions now, their events) (module docstring's table).  The leader decides from
    ``signals`` and the last pass's plan; a standby follows ``decisions`` (the ones on the topic).  ``names``:
    only these models (the counts of the others are the caller's, ``incremental``)."""
    decisions = dict(decisions)
    out: list[OutRecord] = []
    counts: dict[str, int] = {}
    index: ModelIndex | None = None  # built once, for the first model that can scale
    for name in sorted(snap.specs if names is None else names):
        spec = snap.specs.get(name)
        if spec is None:
            continue
        previous = decisions.get(name)
        if not can_scale(spec):
            decisions.pop(name, None)  # a fixed-size model has nothing to decide
            counts[name] = desired_count(spec, scale_range(spec)[0])
            continue
        if not leader:
            counts[name] = desired_count(spec, previous.desired if previous is not None else None)
            continue
        if index is None:
            index = ModelIndex.of(snap, now, timeout_s, last_plan)
        decision = decide(autoscale_inputs(name, spec, index, in_progress(name)), signals.get(name), previous, now,
                          policy)
        decisions[name] = decision
        counts[name] = desired_count(spec, decision.desired)
        if decision.scaled and (previous is None or decision.desired != previous.desired or decision.action == "blocked"):
            log.info("autoscale %s: %s", name, decision.reason)
            out.append(event(now, EVENT_OF_ACTION[decision.action], name, None, None, decision.reason))
    for gone in set(decisions) - set(snap.specs):
        del decisions[gone]
    return counts, decisions, out


@dataclass
class DirectorPass:
    """What one look of the traffic director leaves: its tracks and floors now, the decisions it took (each an
    event), and why it released a model's replica (what that replica's ``removed`` event says)."""

    tracks: dict[str, dict[str, Track]]
    floors: dict[str, Extra]
    decisions: list[Any] = field(default_factory=list)
    released: dict[str, str] = field(default_factory=dict)
    events: list[OutRecord] = field(default_factory=list)


def director_signals(snap: StateSnapshot, published: Mapping[str, AssignmentInfo], now: float,
                     timeout_s: float, names: Collection[str] | None = None,
                     models_on: Mapping[str, set[str]] | None = None, hot_queue: float | None = None,
                     keep: Collection[str] = ()) -> dict[str, list[Signal]]:
    """model -> a ``Signal`` per READY replica on an online node (the GPU utilisation of the replica's GPUs as
    published, its scorer's lag as the queue, its p99).  ``names``: only these models, read from the nodes
    ``models_on`` places them on (node -> models) and the nodes that report them.  ``hot_queue``: only the
    models with a replica whose queue is above it (none of the others can be hot), and the ``keep`` ones."""
    beats = snap.heartbeats
    if names is not None:
        wanted = set(names)
        nodes = {n for n, models in (models_on or {}).items() if models & wanted}
        beats = {n: beats[n] for n in nodes if n in beats}
        published = {n: published[n] for n in nodes if n in published}
    if hot_queue is not None:  # only models with a replica whose queue could make it hot, and the ``keep`` ones
        queued = {r.model for hb in beats.values() for r in hb.replicas if r.lag is not None and r.lag > hot_queue}
        wanted = (queued | set(keep or ())) & (set(names) if names is not None else queued | set(keep or ()))
        names = wanted
        if not wanted:
            return {}
    where = {a.replica_id: (node, a.gpu_indices) for node, info in published.items() for a in info.replicas}
    by_model: dict[str, list[Signal]] = {}
    for node, hb in sorted(beats.items()):
        if not snap.node_online(node, now, timeout_s):
            continue
        util = {g.index: g.utilization_pct for g in hb.gpus}
        for r in hb.replicas:
            if r.state != ReplicaState.READY or r.model not in snap.specs or (names is not None and r.model not in wanted):
                continue
            gpus = where.get(r.replica_id, (node, ()))[1]
            used = [util[i] for i in gpus if i in util]
            by_model.setdefault(r.model, []).append(
                Signal(r.replica_id, max(used) if used else None, None if r.lag is None else float(r.lag),
                       r.p99_ms, node))
    return by_model


def direct_replicas(snap: StateSnapshot, published: Mapping[str, AssignmentInfo], tracks: Mapping[str, dict[str, Track]],
                    floors: Mapping[str, Extra], counts: Mapping[str, int], in_progress: InProgress, now: float,
                    timeout_s: float, policy: DirectorPolicy, names: Collection[str] | None = None,
                    models_on: Mapping[str, set[str]] | None = None) -> DirectorPass:
    """The traffic director over each model's READY replicas.  In-process scorers share a model's partitions
    by Kafka's group assignment, so the director's lever is a replica on a cooler node: ``replica_lever``
    holds one more replica as a floor under the autoscaler's count (``counts``), bounded by the spec's
    maximum, never while a rollout of the model is in progress, released by the director's hysteresis.
    Each decision is a ``director`` event with the numbers behind it (``sie describe model`` lists it).
    ``names``: look only at these models (the others' tracks and floors are kept, ``incremental``)."""
    # a model none of whose replicas could be hot and that holds no floor decides nothing: not looked at
    by_model = director_signals(snap, published, now, timeout_s, names, models_on, policy.hot_queue, set(floors))
    result = DirectorPass(dict(tracks), dict(floors))
    looked = set(by_model) | set(floors) if names is None else (set(by_model) | set(floors)) & set(names)
    for model in sorted(looked):
        signals = by_model.get(model, [])
        decisions: list[Any] = []
        if len(signals) >= 2:  # one replica: nothing is cooler than it (the autoscaler adds replicas on backlog)
            result.tracks[model], decisions = direct(signals, result.tracks.get(model, {}), now, policy, lever="replicas")
        spec = snap.specs.get(model)
        if spec is None:
            result.floors.pop(model, None)
            continue
        base, hi = desired_count(spec, counts.get(model)), ceiling(spec)
        extra, decisions = replica_lever(result.floors.get(model), decisions, signals, base, hi, now, policy,
                                         held=in_progress(model))
        if extra is None:
            if result.floors.pop(model, None) is not None:
                result.released[model] = "released by the traffic director (every replica cool)"
        else:
            result.floors[model] = extra
        for d in decisions:
            result.decisions.append(d)
            log.info("traffic director %s: %s", model, d.reason)
            result.events.append(event(now, "director", model, d.name, d.node, f"{d.action}: {d.reason}"))
    for gone in set(result.tracks) - set(by_model):
        if names is None or gone in names:
            del result.tracks[gone]
    return result


def drop_unplaced_floors(plan: PlacementPlan, floors: Mapping[str, Extra], now: float) -> tuple[dict[str, Extra], list[OutRecord]]:
    """A replica the director added that no node has room for is given up at once (its ``unschedulable``
    event says why): a floor nobody can place would only hold an unschedulable replica until the release."""
    kept = dict(floors)
    out: list[OutRecord] = []
    for model, extra in sorted(floors.items()):
        mine = [u for u in plan.unplaced.values() if u.model == model]
        if mine:
            del kept[model]
            out.append(event(now, "director", model, extra.replica, extra.node,
                             f"release_replica: the added replica could not be placed ({mine[0].reason}); "
                             f"floor {extra.floor} lifted"))
    return kept, out


def with_director_floors(snap: StateSnapshot, counts: Mapping[str, int], floors: Mapping[str, Extra]) -> Mapping[str, int]:
    """Each model's count with the director's floor under it (``director`` docstring: max of the two); ``counts``
    itself when there is none (it is never changed in place)."""
    if not floors:
        return counts
    out = dict(counts)
    for model, extra in floors.items():
        spec = snap.specs.get(model)
        if spec is not None:
            out[model] = desired_count(spec, out.get(model), director_floor=extra.floor)
    return out


def with_rebalance_floors(snap: StateSnapshot, counts: Mapping[str, int], floors: Mapping[str, int]) -> Mapping[str, int]:
    """Each model's count with a move's replacement replica under it (``rebalance`` docstring)."""
    if not floors:
        return counts  # never changed in place
    return {**counts, **{m: desired_count(snap.specs[m], counts.get(m, 0), rebalance_floor=f)
                         for m, f in floors.items() if m in snap.specs}}


def placed_by_model(published: Mapping[str, AssignmentInfo]) -> dict[str, dict[str, str]]:
    """model -> {replica id: node} of the ``published`` assignments."""
    out: dict[str, dict[str, str]] = {}
    for node, info in published.items():
        for a in info.replicas:
            out.setdefault(a.model, {})[a.replica_id] = node
    return out


def rebalance(rebalancer: Rebalancer, snap: StateSnapshot, counts: Mapping[str, int], inventory: ClusterInventory,
              statuses: Mapping[str, Any], in_progress: InProgress, floors: Mapping[str, Extra],
              demands_of: Callable[[str], list[Any]], now: float, names: Collection[str] | None = None,
              ) -> tuple[RebalanceOutcome, list[OutRecord]]:
    """The move back toward the spread (``rebalance`` module): floors, exclusions and preferred nodes for this
    pass's placement, and a ``rebalance`` event per step.  Never moved: a model in a rollout or with a director
    ``floors`` replica; ``demands_of(model)``: its replica demands (for a node's static eligibility)."""
    busy = {name for name in (snap.specs if names is None else set(names) | rebalancer.waiting)
            if name in snap.specs and in_progress(name) is not None} | set(floors)
    online = [n.name for n in inventory.nodes if n.online]

    def eligible(model: str, node: str) -> bool:
        state, demands = inventory.get(node), demands_of(model)
        return state is not None and bool(demands) and node_eligible(demands[0], state)

    outcome = rebalancer.step(now, snap.specs, counts, statuses, online, busy, eligible, names)
    out = []
    for model, rid, detail in outcome.events:
        log.info("rebalance %s: %s", model, detail)
        out.append(event(now, "rebalance", model, rid, None, detail))
    return outcome, out
