"""Step 4a of a pass, demands: the replicas that should run, from the specs, the counts and the rollouts.

One pass (before placement)::

    demands  = model_demands(spec, count) for every model + connector_demands    # ids <model>-<index>
    for each model in a rollout's planned phases:
        trial    = its canary's next replica (surge 1), placed with everything else to see whether it fits
        plan     = plan_capacity(phase, versions, count, what is assigned/READY, fits or why not)
        demands  = the other models' + one replica per ``plan.versions`` entry (stable or canary spec)
    templates: (model, version) -> replica template, for the Assignments of both versions

================================  ============================================================
a model ...                       its replicas this pass
================================  ============================================================
no rollout, or rolling back       its applied spec's, ``count`` of them
rollout in a planned phase        ``plan_capacity``'s versions (a surge or replaced canary, then
                                  the one-at-a-time drain); mode ``unmanaged``: as without one
================================  ============================================================

Pure functions over the snapshot, the counts and a rollout's phase; ``SpecCache`` (owned by the ``Controller``)
keeps what is derived from one spec object (its demands, its replica template, a rollout document's decoded
``ModelService``), so a spec record costs its work once, not once per pass.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sie.control.placement.demand import ReplicaDemand, demands_from_spec
from sie.control.placement.engine import place
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory
from sie.control.placement.rollout_capacity import PLANNED_PHASES, CapacityInputs, CapacityPlan, plan_capacity
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.connectors import connector_demands
from sie.control.reconcile.cooldowns import Exclusions
from sie.control.reconcile.counts import desired_count
from sie.control.reconcile.ports import RolloutReplicas, RolloutView
from sie.control.reconcile.records import AssignmentInfo, StateSnapshot
from sie.schemas.replica_state import ReplicaState
from sie.schemas.replica_template import ReplicaTemplate, template_of

if TYPE_CHECKING:
    from sie.schemas.spec import ModelService

#: replica id -> (node, GPU indices) of the last published assignments
Current = Mapping[str, tuple[str, tuple[int, ...]]]


@dataclass
class SpecCache:
    """What is derived from one spec object, made once per object (the state holds one immutable object per
    spec record read; a rollout entry one document per version), not once per pass: at 1,000 models, demands
    made afresh cost ~50 ms a pass and templates ~25 ms."""

    #: model -> (its spec object, the count, its replica demands)
    demands: dict[str, tuple[Any, int | None, list[ReplicaDemand]]] = field(default_factory=dict)
    #: model -> (its spec object, the spec's replica template)
    templates: dict[str, tuple[Any, ReplicaTemplate]] = field(default_factory=dict)
    #: (model, version) -> (a rollout's spec document, it decoded, its replica template)
    rollout: dict[tuple[str, str], tuple[Mapping[str, Any], ModelService, ReplicaTemplate]] = field(default_factory=dict)
    #: node tiers whose models pack rather than spread (``control.rebalance.pack_tiers``; docs: "Pack or spread")
    pack_tiers: tuple[str, ...] = ()

    def model_demands(self, name: str, spec: Any, count: int | None) -> list[ReplicaDemand]:
        """``demands_from_spec`` once per (spec object, count).  ``count`` None: ``desired_count`` without layers."""
        count = desired_count(spec) if count is None else count
        cached = self.demands.get(name)
        if cached is None or cached[0] is not spec or cached[1] != count:
            cached = (spec, count, demands_from_spec(spec, count, self.pack_tiers))
            self.demands[name] = cached
        return cached[2]

    def template(self, name: str, spec: Any) -> ReplicaTemplate:
        """The replica template an Assignment carries for ``spec`` (``sie.schemas.replica_template``)."""
        cached = self.templates.get(name)
        if cached is None or cached[0] is not spec:
            cached = (spec, template_of(spec.to_document()))
            self.templates[name] = cached
        return cached[1]

    def rollout_spec(self, model: str, version: str, doc: Mapping[str, Any]) -> tuple[ModelService, ReplicaTemplate]:
        """A rollout version's spec document decoded, and its replica template: once per document object (the
        rollout entry keeps its two documents from ``sie rollout start`` to its end)."""
        cached = self.rollout.get((model, version))
        if cached is None or cached[0] is not doc:
            from sie.schemas.spec import ModelService

            cached = (doc, ModelService.from_document(dict(doc)), template_of(doc))
            self.rollout[(model, version)] = cached
        return cached[1], cached[2]

    def keep(self, models: Collection[str]) -> None:
        """Forget the spec objects of models no longer applied."""
        for cache in (self.templates, self.demands):
            for gone in set(cache) - set(models):
                del cache[gone]

    def trim(self, models: Collection[str]) -> None:
        """``keep`` once a cache holds more models than are applied (then some are no longer applied): neither
        holds more entries than there are models, and a pass pays for the sweep only after deletes."""
        if len(self.templates) > len(models) or len(self.demands) > len(models):
            self.keep(models)


def demands(snap: StateSnapshot, counts: Mapping[str, int] | None, cache: SpecCache) -> list[ReplicaDemand]:
    """Every model's replicas at its count (None: ``desired_count`` without layers), then the CDC connectors'
    (they run as CPU replicas)."""
    counts = counts or {}
    models = [d for name in sorted(snap.specs) for d in cache.model_demands(name, snap.specs[name], counts.get(name))]
    return models + connector_demands(snap.connectors, snap.specs)


@dataclass(frozen=True)
class RolloutDemands:
    """``rollout_demands``' answer: the demands to place, each rolling model's replica plan (``rollout_capacity``;
    the driver's readiness gate) and the template of each version its replicas run."""

    demands: list[ReplicaDemand]
    plans: dict[str, CapacityPlan]
    templates: dict[tuple[str, str], ReplicaTemplate]


def rollout_demands(snap: StateSnapshot, demands: list[ReplicaDemand], inventory: ClusterInventory, current: Current,
                    counts: Mapping[str, int], rollouts: RolloutView, cache: SpecCache, exclusions: Exclusions,
                    excluded: Mapping[str, frozenset[str]], published: Mapping[str, AssignmentInfo],
                    decisions: Mapping[str, ScaleDecision], overheads: HostOverheads) -> RolloutDemands:
    """Each model in a rollout gets the replicas ``rollout_capacity.plan_capacity`` gives it (a surge or
    replaced new-version replica, then the one-at-a-time drain); every other demand is unchanged.
    ``excluded``: what placement keeps replicas off (``cooldowns.excluded``)."""
    plans: dict[str, CapacityPlan] = {}
    templates: dict[tuple[str, str], ReplicaTemplate] = {}
    used: set[tuple[str, str]] = set()
    for name in sorted(snap.specs):
        ro = rollouts.replicas_of(name) if hasattr(rollouts, "replicas_of") else None
        if ro is None or ro.phase not in PLANNED_PHASES:
            continue  # no rollout, or rolling back: the applied (stable) spec is placed as ever
        specs: dict[str, ModelService] = {}
        for version, doc in ((ro.stable_version, ro.stable_spec), (ro.canary_version, ro.canary_spec)):
            specs[version], templates[(name, version)] = cache.rollout_spec(name, version, doc)
            used.add((name, version))
        others = [d for d in demands if d.model != name]
        count = desired_count(snap.specs[name], counts.get(name))
        trial = demands_from_spec(specs[ro.canary_version],
                                  desired_count(snap.specs[name], counts.get(name), surge=1), cache.pack_tiers)[-1]
        tried = place([*demands, trial], inventory, current, excluded=dict(excluded), overheads=overheads)
        blocked = ""
        if trial.replica_id not in tried.placements:
            failed = [f"it FAILED on {node}: {cd.reason}" for (rid, node), cd in sorted(exclusions.items())
                      if rid == trial.replica_id]
            blocked = "; ".join(failed) or tried.unplaced[trial.replica_id].reason
        plan = plan_capacity(capacity_inputs(snap, name, ro, count, not blocked, blocked, published, decisions))
        plans[name] = plan
        mine = [demands_from_spec(specs[version], idx + 1, cache.pack_tiers)[idx]
                for idx, version in enumerate(plan.versions)]
        demands = others + mine if plan.mode != "unmanaged" else demands
    for gone in set(cache.rollout) - used:
        del cache.rollout[gone]
    return RolloutDemands(demands, plans, templates)


def capacity_inputs(snap: StateSnapshot, name: str, ro: RolloutReplicas, count: int, fits: bool, blocked: str,
                    published: Mapping[str, AssignmentInfo], decisions: Mapping[str, ScaleDecision]) -> CapacityInputs:
    """What ``plan_capacity`` reads of a rolling model: the version each replica index is assigned, which are
    READY at it (and what each reports of its companion version), and the canary replicas' problems."""
    prefix = f"{name}-"
    assigned: dict[int, str] = {}
    for info in published.values():
        for a in info.replicas:
            if a.model == name and a.replica_id.startswith(prefix) and a.replica_id[len(prefix):].isdigit():
                assigned[int(a.replica_id[len(prefix):])] = a.version
    ready, problems, companions = set(), {}, {}
    for hb in snap.heartbeats.values():
        for r in hb.replicas:
            idx = r.replica_id[len(prefix):]
            if not (r.model == name and r.replica_id.startswith(prefix) and idx.isdigit()):
                continue
            if r.state == ReplicaState.READY and assigned.get(int(idx)) == r.version:
                ready.add(int(idx))
                other = ro.canary_version if r.version == ro.stable_version else ro.stable_version
                reported = r.version_state(other)
                if reported is not None:
                    companions[int(idx)] = reported
            elif r.state != ReplicaState.READY and r.version == ro.canary_version:
                problems[int(idx)] = f"{r.state.value}" + (f": {r.reason}" if r.reason else "")
    decision = decisions.get(name)
    needed = desired_count(snap.specs[name], decision.needed if decision is not None else None)
    return CapacityInputs(ro.phase, ro.stable_version, ro.canary_version, count, min(needed, count),
                          assigned, frozenset(ready), fits, problems, blocked, companions)


def companions(templates: Mapping[tuple[str, str], ReplicaTemplate], model: str, version: str) -> tuple[str, ...]:
    """The other version's document a replica of ``model`` at ``version`` serves during its rollout (from a
    process of its own, prepared by its agent); () outside a rollout's planned phases."""
    return tuple(t.json for (m, v), t in sorted(templates.items()) if m == model and v != version)
