"""The reconcile loop: desired (specs -> demands -> placement) vs published assignments, close the gap.

``Controller.reconcile(now)`` is level-triggered (Kubernetes style): its answer depends only on the
``ClusterState`` snapshot, so running it twice changes nothing, and a restarted control plane reaches the same
decision.  It plans only the models whose inputs changed and keeps the rest of what the last pass derived; a
periodic full pass checks the kept state against a pass from scratch (``incremental``).  One pass (docs/control-plane.md, "The reconcile loop"), each step a module
of pure functions over the snapshot; the ``Controller`` keeps what persists between passes and hands it in::

    step            module                   what
    1. failures     cooldowns                FAILED replica reports -> per-(replica, node) cool-downs
    2. nodes        nodes                    liveness, GPU health, the mass-offline guard -> inventory, events;
                                             nodes to forget -> tombstones
    3. counts       scaling (rule: counts)   the autoscaler (leader), the director's floor, the rebalance move
    4. placement    demands, assignments     demands (a rollout's replica plan) -> ``place(demands, inventory,
                                             current)``, current = the LAST PUBLISHED assignments
    5. assignments  assignments              a node's Assignment only when its replica set changed
    6. events       narration, publishing    what the plan did, with reasons; ModelStatus when it changed
    7. publish      publishing               everything of the pass in ONE transaction, only while leading

Each step runs in its own try/except: a failing step becomes a subsystem error in ``health`` and a metric,
never a crashed loop.  Side effects go through ``Publisher`` (a fake in unit tests).

No pass acts on a view it knows is stale (``takeover.stale_reason``); the pass is SKIPPED
(``ReconcileReport.skipped``) while the state reader is not caught up, died or stalled; after catching up,
until every node of the replayed heartbeats was heard LIVE (at most one ``node_timeout_s``); and for a NEW
LEADER until its takeover loaded what its predecessor published (``TakeoverView``).  A new leader's first
pass then changes no assignment its predecessor published (``takeover``: what a new term continues from).
When many nodes go offline at once while the silence is more likely ours, ``MassOfflineGuard``
(``liveness.py``) holds their replicas where they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from sie.control.placement.engine import PlacementPlan
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory
from sie.control.placement.rollout_capacity import CapacityPlan
from sie.control.reconcile import cooldowns, narration, nodes, ports, publishing, scaling, takeover
from sie.control.reconcile.assignments import (
    PlacementMemo,
    Templates,
    assignment_records,
    current_of,
    placement_view,
    preferred,
)
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.cooldowns import Cooldown
from sie.control.reconcile.counts import can_scale, desired_count
from sie.control.reconcile.demands import SpecCache, demands, rollout_demands
from sie.control.reconcile.director import Extra, Track
from sie.control.reconcile.incremental import Derived, PassScope
from sie.control.reconcile.liveness import GuardDecision, MassOfflineGuard
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.rebalance import RebalanceOutcome, Rebalancer
from sie.control.reconcile.records import AssignmentInfo, ClusterState, StateSnapshot
from sie.control.reconcile.report import ReconcileReport, StepLog, loop_health
from sie.control.reconcile.status import ModelStatus
from sie.control.reconcile.takeover import Term
from sie.schemas.replica_template import ReplicaTemplate
from sie.streams.eos.errors import Fenced

log = logging.getLogger(__name__)


class Controller:
    """Desired vs actual for the whole cluster; one ``reconcile(now)`` = one bounded pass."""

    def __init__(
        self,
        state: ClusterState,
        publisher: ports.Publisher,
        leadership: ports.Leadership,
        config: ControlConfig = ControlConfig(),
        metrics: Any | None = None,
        view: ports.StateView | None = None,
        signals: ports.SignalSource | None = None,
        rollouts: ports.RolloutView | None = None,
        overheads: HostOverheads | None = None,
        takeover: ports.TakeoverView | None = None,
    ) -> None:
        self.state, self.publisher, self.leadership, self.config, self.metrics = state, publisher, leadership, config, metrics
        #: what a new leader loads before its first pass (``takeover``)
        self.takeover: ports.TakeoverView = takeover if takeover is not None else ports.Loaded()
        #: host memory a replica's process costs beyond its spec's memoryMb (``host_memory``; default: the settings')
        self.overheads = overheads if overheads is not None else HostOverheads.defaults()
        self.view: ports.StateView = view if view is not None else ports.FreshView()
        self.signals = signals  # None: no autoscaling (every model gets sla.min_replicas)
        self.rollouts: ports.RolloutView = rollouts if rollouts is not None else ports.NoRollouts()
        #: the replica plan of each model in a rollout this pass (``rollout_capacity``; the driver's readiness gate)
        self.capacity: dict[str, CapacityPlan] = {}
        #: (model, version) -> replica template of a rollout version that replicas run next to the applied spec
        self._version_docs: dict[tuple[str, str], ReplicaTemplate] = {}
        self._specs = SpecCache(pack_tiers=config.rebalance.pack_tiers)  # demands and templates, once per spec object
        self._memo = PlacementMemo()  # a pass with the last placement's inputs reuses its plan
        self._capacity_reported: dict[str, str] = {}
        #: the traffic director's memory per model and replica, and its decisions (newest last)
        self._director_tracks: dict[str, dict[str, Track]] = {}
        self.director_decisions: list[Any] = []
        #: model -> the replica the director added (a floor under its count, ``director`` docstring); published
        #: with the model's status (``ModelStatus.director``), from which a new leader and a standby take it
        self.director_extra: dict[str, Extra] = {}
        #: model -> why the director released its replica this pass (what that replica's ``removed`` event says)
        self._director_released: dict[str, str] = {}
        #: the autoscaler's last decision per model (this term's; seeded from the model-status topic)
        self.decisions: dict[str, ScaleDecision] = {}
        self._last_plan: PlacementPlan | None = None
        self.guard = MassOfflineGuard(config.node_timeout_s, config.mass_offline_fraction)
        self._guard_decision = GuardDecision()
        #: (replica id, node) -> its cool-down: keep that replica off that node (``cooldowns``)
        self.exclusions: dict[tuple[str, str], Cooldown] = {}
        #: what this term published and the feeder may not have read back yet: node -> assignment; model -> status
        self._published: dict[str, AssignmentInfo] = {}
        self._status_published: dict[str, ModelStatus] = {}
        self._unplaced_reported: dict[str, str] = {}  # replica id -> the unschedulable reason announced
        self._evicted: dict[str, str] = {}  # replica id -> why it was evicted, while it has no node again
        self._nodes = nodes.NodeMemory()
        #: the leader's move back toward the spread (``rebalance``), and what it adds to this pass's placement
        self.rebalancer = Rebalancer(config.rebalance)
        self._rebalance = RebalanceOutcome()
        self._term = Term()  # which term this instance leads, and what it seeded
        self.last_report: ReconcileReport | None = None
        self._last_acting: ReconcileReport | None = None  # the latest pass that acted (was not skipped)
        self.statuses: dict[str, ModelStatus] = {}
        self.acted = False  # True once a pass acted (was not skipped for a stale view)
        #: what is kept between passes so a pass plans only what changed (``incremental``)
        self.derived = Derived()
        self._role: tuple[bool, int] | None = None  # (leading, epoch) of the last pass: a change plans everything
        #: what the last placement read (the shortcut that keeps its plan when none of it changed)
        self._placed_inputs: tuple[Any, ...] | None = None
        self._last_published: dict[str, AssignmentInfo] = {}
        self._last_specs: Mapping[str, Any] = {}
        self._last_exclusions: dict[tuple[str, str], Cooldown] = {}
        self._last_floors: dict[str, Extra] = {}
        self._status_changed: set[str] = set()
        self._moved: tuple[set[str], set[str]] = (set(), set())
        #: models whose spec record was read since the last placement (the journal's; cleared when it placed)
        self._specced: set[str] = set()
        self._redo = False  # the last pass's publish failed: the next one plans everything
        self._standby_follows = False

    # -- the pass ----------------------------------------------------------------------------------

    def reconcile(self, now: float) -> ReconcileReport:
        """One pass: the steps of the module docstring, in order::

            a new term forgets what an earlier term of ours kept; skip the pass on a stale or unloaded view
            a new term's first acting pass seeds from the statuses last published (``takeover``)
            failures -> nodes -> forget -> autoscale -> director -> rebalance          (counts)
            placement -> assignments -> events -> capacity -> director_unplaced -> status
            publish every record of the pass in one transaction, only while leading
        """
        started, cpu_started = time.perf_counter(), time.thread_time()
        step = StepLog()  # runs each step: its error and its duration, never a crashed loop
        durations, errors = step.durations, step.errors
        leader, epoch = self.leadership.is_leader, self.leadership.epoch
        self._begin_term(leader, epoch)
        # before the snapshot: the takeover's read barrier must cover what this pass reads
        loading = self.takeover.not_loaded(epoch) if leader else None
        snap, taken = self.state.snapshot_and_changes(self)
        wait = takeover.stale_reason(self.view, snap, now, self.config.node_timeout_s) or loading
        if wait is not None:
            self.derived.keep(taken)
            durations["total"] = time.perf_counter() - started
            report = ReconcileReport(now, leader, (), None, self.statuses, {}, durations, skipped=wait)
            self.last_report = report
            self._observe(report, snap, now)
            return report
        self.acted = True
        role, self._role = self._role, (leader, epoch)
        # a standby's passes planned what the topics hold and noted where that differs from what they published:
        # its first pass as leader plans only that and what changed (``incremental``, "A standby that leads")
        continuing = leader and role is not None and not role[0] and not self._redo
        # a standby seeds the leader's decisions and floors from every status record once, then follows changes
        self._standby_follows = not leader and role == (leader, epoch)
        mismatches = self.derived.mismatches
        # a new role, or a pass whose records were not published: what is kept may not be what the topics hold
        redo, self._redo = self._redo, False
        scope = self.derived.begin(taken, now, self.config.full_check_s, self._unfinished_rollouts(),
                                   redo or (role != (leader, epoch) and not continuing), continuing)
        if not leader or (continuing and not self._term.seeded):
            self._follow_statuses(scope)
        if leader and not self._term.seeded:
            self._seed_term(now, continuing)
        out: list[OutRecord] = []
        plan: PlacementPlan | None = None
        statuses: dict[str, ModelStatus] = {}

        step("failures", lambda: self._failures(snap, now, out))
        inventory = step("nodes", lambda: self._inventory(snap, now, out))
        if inventory is not None:
            found = inventory
            # online as placement sees it (the mass-offline guard may hold a node) and as statuses do (its heartbeats)
            scope.models |= self.derived.placed_on(self.derived.flipped(
                {n.name: (n.online, snap.node_online(n.name, now, self.config.node_timeout_s)) for n in found.nodes}))
            step("forget", lambda: self._forget_nodes(snap, found, now, out))
        counts = self._counts(snap, inventory, leader, now, out, step, scope)
        if inventory is not None:
            published = self._published_view(snap)
            plan = step("placement", lambda: self._place(snap, inventory, published, counts, scope))
            if plan is not None:
                placed = plan
                # the models and nodes whose placements changed (after a re-placement, among the replicas it touched)
                self._moved = self.derived.index(placed, self._memo.replanner.delta)
                if self._memo.plan is not None and self._memo.plan.placements is placed.placements:
                    self._memo.plan.__dict__["by_node"] = placed.by_node
                only = self._changed_nodes(snap, placed, published, scope)
                step("assignments", lambda: self._assignments(snap, placed, published, out, only))
                step("events", lambda: self._placement_events(placed, published, inventory, now, out, only))
                step("capacity", lambda: self._capacity_events(now, out))
                if self.director_extra:
                    step("director_unplaced", lambda: self._drop_unplaced_floors(placed, now, out))
        if plan is not None:
            self._last_plan = placed = plan
            statuses = step("status", lambda: self._statuses(snap, placed, now, out, scope)) or {}
        self._last_specs = snap.specs
        published_records = self._publish(leader, out, statuses, now, errors, durations)
        self.statuses = statuses or self.statuses
        if errors and not leader:
            self._redo = True  # what a standby noted as unpublished may be wrong: its next pass plans everything
        durations["total"] = time.perf_counter() - started
        # the CPU this pass's thread used: on a starved machine "total" is mostly waiting for a core
        durations["cpu"] = time.thread_time() - cpu_started
        report = ReconcileReport(now, leader, published_records, plan, statuses, errors, durations,
                                 guard=self._guard_decision.reason,
                                 decisions={n: d for n, d in self.decisions.items() if n in snap.specs},
                                 planned=None if scope.full else frozenset(scope.models), checked=scope.check,
                                 mismatched=self.derived.mismatches - mismatches)
        self.last_report = self._last_acting = report
        self._observe(report, snap, now)
        return report

    def _begin_term(self, leader: bool, epoch: int) -> None:
        """A new term forgets what a previous term of ours published and decided: what the topics hold once the
        takeover loaded them is the truth now (and a hot replica must stay hot ``sustain_s`` again)."""
        if self._term.begin(leader, epoch):
            self._published.clear()
            self._unplaced_reported.clear()
            self._director_tracks.clear()

    def _counts(self, snap: StateSnapshot, inventory: ClusterInventory | None, leader: bool, now: float,
                out: list[OutRecord], step: StepLog, scope: PassScope) -> Mapping[str, int]:
        """Step 3: the autoscaler's counts, the director's floors under them, then a rebalance move's."""
        counts = step("autoscale", lambda: self._autoscale(snap, now, leader, out, scope))
        if counts is None:  # the autoscaler failed: keep the last counts rather than fall back to the minimum
            counts = {name: d.desired for name, d in self.decisions.items()}
        self._director_released = {}
        if self.config.director is None:
            self.director_extra.clear()
        elif not leader and self._standby_follows and not scope.full:
            # a standby follows the leader's floors: those of the models whose status record changed
            floors = takeover.seed_director_floors(self._status_records(scope.models), snap)
            self.director_extra = {m: e for m, e in self.director_extra.items() if m not in scope.models} | floors
        elif not leader or not self._term.director_seeded:
            # a standby follows the leader's floors; a new leader continues them
            floors = takeover.seed_director_floors(self._status_records(), snap)
            scope.models |= {m for m in set(floors) | set(self.director_extra)
                             if floors.get(m) != self.director_extra.get(m)}
            self.director_extra = floors
            self._term.director_seeded = leader
        if leader and self.config.director is not None:
            base = counts
            step("director", lambda: self._direct(snap, now, out, base, scope))
        counts = scaling.with_director_floors(snap, counts, self.director_extra)
        self._rebalance = RebalanceOutcome()
        if leader and inventory is not None:
            floored, found = counts, inventory
            if self._term.adopt_move:
                self._term.adopt_move = False
                self.rebalancer.adopt(now, snap.specs, floored, scaling.placed_by_model(self._published_view(snap)))
            self._rebalance = step("rebalance", lambda: self._rebalance_step(snap, now, out, floored, found, scope)) \
                or RebalanceOutcome()
        else:
            self.rebalancer.move = None  # a standby moves nothing; a new leader adopts a move in flight (_seed_term)
        return scaling.with_rebalance_floors(snap, counts, self._rebalance.floors)

    def _publish(self, leader: bool, out: list[OutRecord], statuses: Mapping[str, ModelStatus], now: float,
                 errors: dict[str, str], durations: dict[str, float]) -> tuple[OutRecord, ...]:
        """Step 7: every record of the pass in one transaction, only while leading; what was published."""
        if not leader:
            return ()
        if not out:  # nothing to remember: what this term published is as it was
            self.derived.published_all()
            return ()
        t0 = time.perf_counter()
        published: tuple[OutRecord, ...] = ()
        try:
            self.publisher.publish(publishing.stamp(out, self.leadership.epoch, now))
            published = tuple(out)
            self._remember(out, statuses)
            self.derived.published_all()
        except Fenced as exc:
            self._redo = True
            self.leadership.step_down(f"fenced while publishing: {exc}")
            errors["publish"] = f"fenced: {exc}"
        except Exception as exc:
            self._redo = True
            errors["publish"] = f"{type(exc).__name__}: {exc}"
            log.warning("publish failed (retried next pass): %s", exc)
        durations["publish"] = time.perf_counter() - t0
        return published

    def _observe(self, report: ReconcileReport, snap: StateSnapshot, now: float) -> None:
        if self.metrics is not None:
            try:
                self.metrics.observe(report, snap, now, self.config.node_timeout_s)
            except Exception:  # metrics are best effort
                log.exception("metrics update failed")

    def health(self) -> dict[str, Any]:
        """The reconcile loop and the mass-offline guard, as ``/healthz`` shows them."""
        return {"reconcile": loop_health(self.last_report, self._last_acting), "liveness_guard": self.guard.status(),
                "incremental": self.derived.health()}

    def cooldowns(self) -> dict[str, list[dict[str, Any]]]:
        """Replica id -> its cool-downs (node, until_ms, reason): what ``ModelStatus`` shows."""
        return cooldowns.by_replica(self.exclusions)

    # -- the steps: each hands the state it keeps to a module of pure functions, and keeps the answer -----

    def _status_records(self, names: set[str] | None = None) -> dict[str, Any]:
        """The model-status records on the topic (``names``: only these models')."""
        with self.state._lock:  # noqa: SLF001 - the one place that seeds from the topic
            if names is None:
                return dict(self.state.model_status)
            return {m: self.state.model_status[m] for m in names if m in self.state.model_status}

    def _seed_term(self, now: float, continuing: bool) -> None:
        """A new term's statuses last published: the ones a standby followed (``continuing``), else all read."""
        last = self._status_published if continuing else takeover.parse_statuses(self._status_records())
        self._status_published, reported, self.exclusions = takeover.seed_term(
            last, self.exclusions, now, self.config.failure_cooldown_s)
        self._unplaced_reported.update(reported)
        self._term.seeded = self._term.adopt_move = True

    def _follow_statuses(self, scope: PassScope) -> None:
        """A standby keeps the statuses the leader published (what its own are compared with): all of them on a
        full pass, else those of the models in scope (a changed status record puts its model there)."""
        if scope.full:
            self._status_published = takeover.parse_statuses(self._status_records())
            return
        records = self._status_records(scope.models)
        for name in scope.models:
            self._status_published.pop(name, None)
        self._status_published.update(takeover.parse_statuses(records))

    def _published_view(self, snap: StateSnapshot) -> dict[str, AssignmentInfo]:
        """Last published assignment per node: the topic, overlaid with what this term published."""
        view, self._published = publishing.published_view(snap.assignments, self._published)
        return view

    def _remember(self, records: list[OutRecord], statuses: Mapping[str, ModelStatus]) -> None:
        self._published, self._status_published = publishing.remembered(
            records, statuses, self.leadership.epoch, self._published, self._status_published)

    def _failures(self, snap: StateSnapshot, now: float, out: list[OutRecord]) -> None:
        self.exclusions, cleared = cooldowns.clear(self.exclusions, snap, now)
        out.extend(cleared)
        failures = self.state.drain_failures()
        if not failures:
            return
        assigned = {(a.replica_id, node) for node, info in self._published_view(snap).items() for a in info.replicas}
        self.exclusions, failed = cooldowns.record_failures(self.exclusions, failures, assigned,
                                                            snap, now, self.config.failure_cooldown_s)
        out.extend(failed)

    def _inventory(self, snap: StateSnapshot, now: float, out: list[OutRecord]) -> ClusterInventory:
        inventory = snap.inventory(now, self.config.node_timeout_s)
        self._guard_decision = self.guard.assess(now, *nodes.guard_inputs(inventory, snap), self.view.lag_reason())
        out.extend(nodes.guard_events(self._guard_decision, now))
        inventory = nodes.held_online(inventory, self._guard_decision)
        out.extend(nodes.transitions(inventory, self._nodes, now, self.config.node_timeout_s))
        return inventory

    def _forget_nodes(self, snap: StateSnapshot, inventory: ClusterInventory, now: float, out: list[OutRecord]) -> None:
        out.extend(nodes.forget(snap, inventory, self._published_view(snap), self._nodes, now, self.config.node_forget_after_s))
        for name in nodes.read_back(snap, self._nodes):
            self._published.pop(name, None)

    def _autoscale(self, snap: StateSnapshot, now: float, leader: bool, out: list[OutRecord],
                   scope: PassScope) -> dict[str, int]:
        """The leader decides (and publishes each change as an event); a standby follows the decisions on the
        topic, so its API shows what the leader decided.  Only the models in scope and the ones that can scale
        are decided again; the others keep their count (``incremental``)."""
        kept = self.derived
        if self.signals is None:
            names = scope.names()
            fresh = {name: desired_count(snap.specs[name]) for name in (snap.specs if names is None else names)
                     if name in snap.specs}
        else:
            if not leader and self._standby_follows and not scope.full:
                # a standby follows the leader's decisions: those of the models whose status record changed
                self.decisions = {m: d for m, d in self.decisions.items() if m not in scope.models} | \
                    takeover.seed_decisions(self._status_records(scope.models), now)
            elif not leader or not self._term.decisions_seeded:
                seeded = takeover.seed_decisions(self._status_records(), now)
                if scope.continues:  # a standby followed them: the models with a decision are decided again
                    scope.models |= set(seeded) | set(self.decisions)
                else:
                    scope.full = True  # the seeded decisions may differ for any model
                self.decisions = seeded
                self._term.decisions_seeded = leader
            names = scope.names()
            if names is not None:
                names = names | kept.scalable
            signals = self.signals.signals() if leader else {}
            fresh, self.decisions, events = scaling.autoscale(
                snap, self.decisions, signals, leader, self._last_plan, self.rollouts.in_progress, now,
                self.config.node_timeout_s, self.config.autoscale, names)
            out.extend(events)
        if names is None:
            if scope.check:  # the models an incremental pass would have decided again are not compared
                again = scope.models | kept.scalable
                differ = {m for m in set(fresh) | set(kept.counts) if m not in again and fresh.get(m) != kept.counts.get(m)}
                if differ:
                    kept.mismatch("counts", differ)
            kept.counts = fresh
            kept.scalable = {name for name, spec in snap.specs.items() if can_scale(spec)}
        elif names:  # a new dict when any count may change: the one handed out last pass is compared by identity
            counts = dict(kept.counts)
            for name in names:
                counts.pop(name, None)
                spec = snap.specs.get(name)
                if spec is not None and can_scale(spec):
                    kept.scalable.add(name)
                else:
                    kept.scalable.discard(name)
            counts.update(fresh)
            kept.counts = counts if counts != kept.counts else kept.counts
        if leader:
            scope.models |= kept.scalable  # their decisions (in their statuses) move with their signals
        return kept.counts

    def _direct(self, snap: StateSnapshot, now: float, out: list[OutRecord], counts: Mapping[str, int],
                scope: PassScope) -> None:
        """The director looks at the models in scope and the ones it tracks or holds a replica for."""
        assert self.config.director is not None
        kept = self.derived
        names = None if scope.continues else scope.names()  # a standby tracked no replica: all are looked at
        if names is not None:
            names = names | scope.signals | kept.director_hot | set(self.director_extra) | kept.placed_on(scope.gpus)
        look = scaling.direct_replicas(snap, self._published_view(snap), self._director_tracks, self.director_extra,
                                       counts, self.rollouts.in_progress, now, self.config.node_timeout_s,
                                       self.config.director, names, kept.models_on)
        if names is None:
            kept.director_hot = set()
        for model in look.tracks if names is None else names:
            if any(t.hot_since is not None for t in look.tracks.get(model, {}).values()):
                kept.director_hot.add(model)
            else:
                kept.director_hot.discard(model)
        self._director_tracks, self.director_extra = look.tracks, look.floors
        self._director_released.update(look.released)
        self.director_decisions = [*self.director_decisions, *look.decisions][-100:]
        out.extend(look.events)

    def _rebalance_step(self, snap: StateSnapshot, now: float, out: list[OutRecord], counts: Mapping[str, int],
                        inventory: ClusterInventory, scope: PassScope) -> RebalanceOutcome:
        """Models are tried for a move when in scope, when their status changed last pass, or while they wait
        for a target or a rest to end (``Rebalancer``)."""
        names = None if scope.continues else scope.names()  # a standby kept no model waiting: all are tried
        if names is not None:
            names = names | self._status_changed
        outcome, events = scaling.rebalance(
            self.rebalancer, snap, counts, inventory, self.statuses, self.rollouts.in_progress, self.director_extra,
            lambda model: self._specs.model_demands(model, snap.specs[model], counts.get(model)), now, names)
        out.extend(events)
        return outcome

    def _unfinished_rollouts(self) -> set[str] | None:
        """The models with an unfinished rollout (always in scope); None: this rollout view cannot say."""
        unfinished = getattr(self.rollouts, "unfinished", None)
        return set(unfinished()) if unfinished is not None else None

    def _placement_inputs(self, snap: StateSnapshot, inventory: ClusterInventory,
                          published: Mapping[str, AssignmentInfo], counts: Mapping[str, int]) -> tuple[Any, ...]:
        """What placement reads, as values compared without building the demands: the spec objects (one per
        record read), the counts, the inventory, the published assignments (one object per record read), the
        cool-downs, the director's and the rebalancer's hints; and whether a rollout plans replicas."""
        return (snap.specs, counts, placement_view(inventory), published, dict(self.exclusions),
                dict(self.director_extra), dict(self._rebalance.preferred), dict(self._rebalance.excluded),
                bool(self.derived.rolling) or self._unfinished_rollouts() is None, snap.connectors)

    def _same_placement_inputs(self, inputs: tuple[Any, ...]) -> bool:
        last = self._placed_inputs
        if last is None or self._memo.plan is None or inputs[8] or last[8]:
            return False
        if self._respecified(inputs[0], last[0]):
            return False
        published, last_published = inputs[3], last[3]
        if len(published) != len(last_published) or any(published.get(n) is not a for n, a in last_published.items()):
            return False
        return inputs[1:3] == last[1:3] and inputs[4:8] == last[4:8] and inputs[9] == last[9]

    def _respecified(self, specs: Mapping[str, Any], last: Mapping[str, Any]) -> set[str]:
        """The models whose spec object differs from the last placement's: among those whose spec record was read
        since (the journal), so a pass with none compares nothing."""
        return {m for m in self._specced if specs.get(m) is not last.get(m)}

    def _replaceable(self, inputs: tuple[Any, ...], last: tuple[Any, ...] | None) -> set[str] | None:
        """The models to place again on the last plan, when only specs and counts changed (and the published
        assignments agree with that plan); None: place afresh (nodes, cool-downs, hints, connectors or a rollout
        changed, or the topic holds what this plan does not)."""
        plan = self._memo.plan
        if last is None or plan is None or not self._memo.replanner.ready or inputs[8] or last[8] or inputs[9]:
            return None  # (a connector's replicas follow its model's spec: placed afresh with it)
        if inputs[2] != last[2] or inputs[4:8] != last[4:8] or inputs[9] != last[9]:
            return None
        published, last_published = inputs[3], last[3]
        for node in set(published) | set(last_published):
            info = published.get(node)
            if info is last_published.get(node):
                continue
            mine = {(p.replica_id, tuple(p.gpu_indices)) for p in plan.by_node.get(node, ())}
            if mine != {(a.replica_id, a.gpu_indices) for a in (info.replicas if info is not None else ())}:
                return None
        counts, last_counts = inputs[1], last[1]
        changed = self._respecified(inputs[0], last[0])
        if counts != last_counts:
            changed |= {m for m in set(counts) | set(last_counts) if counts.get(m) != last_counts.get(m)}
        return changed

    def _place(self, snap: StateSnapshot, inventory: ClusterInventory, published: Mapping[str, AssignmentInfo],
               counts: Mapping[str, int] | None = None, scope: PassScope | None = None) -> PlacementPlan:
        """The last plan when nothing placement reads changed (no demand is built), the last plan with only the
        changed models placed again (``Replanner``), else ``place`` (its memo)."""
        plan = self._placement(snap, inventory, published, counts, scope)
        self._specced = set()
        return plan

    def _placement(self, snap: StateSnapshot, inventory: ClusterInventory, published: Mapping[str, AssignmentInfo],
                   counts: Mapping[str, int] | None = None, scope: PassScope | None = None) -> PlacementPlan:
        if scope is not None:
            self._specced |= scope.specs
        else:  # a caller without a journal: every spec may have changed
            self._specced |= set(snap.specs) | set(self._placed_inputs[0] if self._placed_inputs else ())
        inputs = self._placement_inputs(snap, inventory, published, counts or {})
        last = self._placed_inputs
        same = self._same_placement_inputs(inputs)
        self._placed_inputs = inputs
        changed = None if scope is None or scope.full or same else self._replaceable(inputs, last)
        if (same or changed == set()) and scope is not None and not scope.full and self._memo.plan is not None:
            kept = self._memo.plan
            # the last plan again; its evictions were that pass's (``explain_preemptions`` keeps saying why)
            plan = PlacementPlan(kept.placements, kept.unplaced, inventory)
            if "by_node" in kept.__dict__:  # the same placements over the same nodes (``placement_view``)
                plan.__dict__["by_node"] = kept.__dict__["by_node"]
            plan, self._evicted = narration.explain_preemptions(narration.explain_exclusions(plan, self.exclusions),
                                                                self._evicted)
            return plan
        if changed:
            wanted = {m: self._specs.model_demands(m, snap.specs[m], (counts or {}).get(m)) if m in snap.specs else []
                      for m in changed}
            plan = self._memo.replace(wanted, inventory)
            self.capacity, self._version_docs = {}, {}
            plan, self._evicted = narration.explain_preemptions(narration.explain_exclusions(plan, self.exclusions),
                                                                self._evicted)
            return plan
        before = self._memo.plan
        # the check compares when an incremental pass would have kept the plan as it is
        keeps = scope is not None and scope.check and before is not None and (same or self._replaceable(inputs, last) == set())
        plan = self._place_afresh(snap, inventory, published, counts)
        if keeps and before is not None and plan.placements is not before.placements:
            # placed from scratch with the kept plan as the published one: every valid placement is kept
            differ = {p.model for rid, p in plan.placements.items() if _where(before.placements.get(rid)) != _where(p)}
            differ |= {p.model for rid, p in before.placements.items() if rid not in plan.placements}
            if differ:
                self.derived.mismatch("placement", differ)
        return plan

    def _place_afresh(self, snap: StateSnapshot, inventory: ClusterInventory, published: Mapping[str, AssignmentInfo],
                      counts: Mapping[str, int] | None = None) -> PlacementPlan:
        current = current_of(published)
        excluded = cooldowns.excluded(self.exclusions, self._rebalance.excluded)
        wanted = rollout_demands(snap, demands(snap, counts, self._specs), inventory, current, counts or {},
                                 self.rollouts, self._specs, self.exclusions, excluded, published, self.decisions,
                                 self.overheads)
        self.capacity, self._version_docs = wanted.plans, wanted.templates
        plan = self._memo.place(wanted.demands, inventory, current, excluded,
                                preferred(wanted.demands, self.director_extra, self._rebalance.preferred),
                                self.config.preemption, self.overheads)
        plan, self._evicted = narration.explain_preemptions(narration.explain_exclusions(plan, self.exclusions), self._evicted)
        return plan

    def _changed_nodes(self, snap: StateSnapshot, plan: PlacementPlan, published: Mapping[str, AssignmentInfo],
                       scope: PassScope) -> set[str] | None:
        """The nodes whose Assignment may differ from the plan (None: all): with the plan of the last pass, the
        ones whose published record changed since (a read-back, another writer) and the ones holding a model
        whose spec changed (its template)."""
        last, self._last_published = self._last_published, dict(published)
        if scope.full or len(last) != len(published) or snap.connectors:
            return None  # (a connector's template follows its model's spec)
        only = {n for n, a in published.items() if last.get(n) is not a} | self._moved[1] | self.derived.unsynced_nodes
        # a new spec, or a rollout's versions, change the templates and companions its replicas carry
        respecified = {m for m in scope.models if snap.specs.get(m) is not self._last_specs.get(m)}
        respecified |= self.derived.rolling | self.derived.rolling_changed
        if respecified:
            only |= {n for n, models in self.derived.models_on.items() if models & respecified}
        return only

    def _assignments(self, snap: StateSnapshot, plan: PlacementPlan, published: Mapping[str, AssignmentInfo],
                     out: list[OutRecord], only: set[str] | None = None) -> None:
        if only is not None and not only:
            return
        records = assignment_records(plan, published, Templates(snap, self._specs), self._version_docs, only)
        self.derived.unsynced_nodes = (set() if only is None else self.derived.unsynced_nodes - only) | \
            {r.key for r in records}
        out.extend(records)

    def _placement_events(self, plan: PlacementPlan, published: Mapping[str, AssignmentInfo],
                          inventory: ClusterInventory, now: float, out: list[OutRecord],
                          only: set[str] | None = None) -> None:
        if only is not None and not only and not plan.unplaced:
            return
        events, self._unplaced_reported = narration.placement_events(
            plan, published, inventory, self.exclusions, self.decisions, self._director_released,
            self._unplaced_reported, now, only)
        out.extend(events)

    def _capacity_events(self, now: float, out: list[OutRecord]) -> None:
        events, self._capacity_reported = narration.capacity_events(self.capacity, self._capacity_reported, now)
        out.extend(events)

    def _drop_unplaced_floors(self, plan: PlacementPlan, now: float, out: list[OutRecord]) -> None:
        self.director_extra, events = scaling.drop_unplaced_floors(plan, self.director_extra, now)
        out.extend(events)

    def _statuses(self, snap: StateSnapshot, plan: PlacementPlan, now: float, out: list[OutRecord],
                  scope: PassScope | None = None) -> dict[str, ModelStatus]:
        """Each model's status: the ones in scope (and whose placements, cool-downs or director floor changed)
        built again, the others kept from the last pass; on the periodic check, all built and compared."""
        scope = scope if scope is not None else PassScope(full=True)
        moved = self._moved[0]
        last_exclusions, self._last_exclusions = self._last_exclusions, dict(self.exclusions)
        last_floors, self._last_floors = self._last_floors, dict(self.director_extra)
        changed = scope.models | moved | self.derived.unsynced_models
        changed |= {cd.model for k, cd in self.exclusions.items() if last_exclusions.get(k) != cd}
        changed |= {cd.model for k, cd in last_exclusions.items() if k not in self.exclusions}
        changed |= {m for m in set(last_floors) | set(self.director_extra) if last_floors.get(m) != self.director_extra.get(m)}
        names = None if scope.full else changed
        cooldowns_now = self.cooldowns()
        ids = self.derived.replica_ids(plan)
        statuses, records = publishing.model_statuses(snap, plan, now, self.config.node_timeout_s, self.leadership.epoch,
                                                      cooldowns_now, self.decisions, self.director_extra,
                                                      self._status_published, names, self.statuses, ids)
        if scope.check:
            self.derived.checks += 1
            kept, _ = publishing.model_statuses(snap, plan, now, self.config.node_timeout_s, self.leadership.epoch,
                                                cooldowns_now, self.decisions, self.director_extra,
                                                self._status_published, changed, self.statuses, ids)
            differ = {m for m in set(kept) | set(statuses) if not statuses[m].same_as(kept.get(m))} \
                if set(kept) == set(statuses) else set(kept) ^ set(statuses)
            if differ:
                self.derived.mismatch("statuses", differ)
        self._status_changed = {r.key for r in records}
        self.derived.unsynced_models = (set() if names is None else self.derived.unsynced_models - names) | \
            self._status_changed
        out.extend(records)
        return statuses


def _where(p: Any) -> tuple[Any, ...] | None:
    """What a placement decides (its ``note`` depends on the order replicas were committed in)."""
    return None if p is None else (p.node, tuple(p.gpu_indices), p.version, p.gpu_memory_mb)
