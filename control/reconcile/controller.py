"""The reconcile loop: desired (specs -> demands -> placement) vs published assignments, close the gap.

``Controller.reconcile(now)`` is level-triggered (Kubernetes style): it ignores what changed and re-derives
everything from the ``ClusterState`` snapshot, so running it twice changes nothing, and a restarted control
plane reaches the same decision.  One pass (docs/control-plane.md, "The reconcile loop")::

    1. failures:    FAILED replica reports -> per-(replica, node) exclusions with a cool-down (ended early by a
                    re-applied spec, a deleted model or ``sie replica reset``)
    2. nodes:       liveness (heartbeat timeout), GPU health -> inventory, transitions -> events; a node to
                    forget (``sie node forget``, or offline for ``node_forget_after_s``) -> tombstoned
    3. counts:      ``autoscaler.decide`` per model (leader only; without a backlog signal ``sla.min_replicas``),
                    then the traffic director's floor (``director``), then the move back toward the spread
                    (``rebalance``)
    4. placement:   ``place(demands, inventory, current)``, ``current`` = the LAST PUBLISHED assignments (healthy
                    replicas keep their node and GPU); with ``preemption``, evictions (each an event)
    5. assignments: a node's Assignment is published only when its replica set changed (epoch not compared)
    6. events and ModelStatus (status only when it changed)
    7. publish everything of the pass in ONE transaction, and only while leading

Each step runs in its own try/except: a failing step becomes a subsystem error in ``health`` and a metric,
never a crashed loop.  Side effects go through ``Publisher`` (a fake in unit tests).

No pass acts on a view it knows is stale (``StateView``, the state feeder in production); the pass is
SKIPPED (``ReconcileReport.skipped``):

* while the state reader is not caught up, died, or stalled;
* after catching up, until every node of the replayed heartbeats was heard LIVE (at most one
  ``node_timeout_s``): replayed heartbeats are history, and a node is not judged offline before it could speak;
* for a NEW LEADER, until its takeover loaded what its predecessor published (``TakeoverView``;
  ``service.Takeover``): the control topics to the end they had after the election, and every unfinished
  rollout (planned without them, a pass would remove a surge replica as "no longer desired").
And when many nodes go offline at once while the silence is more likely ours, ``MassOfflineGuard``
(``liveness.py``) holds their replicas where they are.

A new leader's first pass changes no assignment its predecessor published: everything a pass decides from is
published in the same transaction as the assignments it shaped, or re-derived from what agents report (the
table of what comes from where: docs/control-plane.md, "What a new leader loads before it acts"; here
``_seed_term`` for cool-downs and statuses, ``_seed_decisions`` for autoscaler counts, ``_seed_director_floors``
for the director's replica, ``Rebalancer.adopt`` for a move in flight; tests/control/test_takeover_unit.py
walks every rollout phase).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie.control.placement.demand import ReplicaDemand, demands_from_spec
from sie.control.placement.engine import PlacementPlan, node_eligible, place
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory
from sie.control.placement.rollout_capacity import PLANNED_PHASES, CapacityInputs, CapacityPlan, plan_capacity
from sie.control.reconcile.autoscaler import ModelInputs, ScaleDecision, decide
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.connectors import connector_demands, connector_documents
from sie.control.reconcile.counts import can_scale, ceiling, desired_count, scale_range
from sie.control.reconcile.director import Extra, Signal, Track, direct, replica_lever
from sie.control.reconcile.liveness import GuardDecision, MassOfflineGuard
from sie.control.reconcile.ports import (
    FreshView,
    Leadership,
    Loaded,
    NoRollouts,
    OutRecord,
    Publisher,
    RolloutReplicas,
    RolloutView,
    SignalSource,
    StateView,
    TakeoverView,
)
from sie.control.reconcile.rebalance import RebalanceOutcome, Rebalancer
from sie.control.reconcile.records import (
    NODE_FORGOTTEN_KIND,
    AssignedReplica,
    AssignmentInfo,
    ClusterState,
    StateSnapshot,
)
from sie.control.reconcile.status import ModelStatus, build_status
from sie.kernel.names import Names
from sie.schemas.replica_state import ReplicaState
from sie.schemas.replica_template import ReplicaTemplate, template_from_json, template_of
from sie.streams.eos.errors import Fenced

log = logging.getLogger(__name__)
#: the template of a replica whose model has no spec any more (its Assignment entry says so with an empty document)
_NO_TEMPLATE = template_from_json("")

# ---------------------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class Cooldown:
    """A replica kept off a node after it FAILED there: until when, why, and since when (the FAILED report).

    It ends at ``until``, or earlier (operators control it) when the model's spec is applied again after
    ``since`` (a fix shipped as a new version, or the same spec re-applied), when the model is deleted, or
    when ``sie replica reset`` asks for it after ``since``.  FAILED reports made before such a clear are
    stale (a heartbeat read late) and start nothing.
    """

    until: float
    reason: str
    model: str
    since: float

    def to_json(self, node: str) -> dict[str, Any]:
        return {"node": node, "until_ms": int(self.until * 1000), "reason": self.reason}


# ------------------------------------------------------------------------------------------ result


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

    def of(self, topic: str) -> list[OutRecord]:
        return [r for r in self.published if r.topic == topic]


def _placement_view(inventory: ClusterInventory) -> tuple[Any, ...]:
    """What placement reads of the inventory, as a comparable value: every node but its momentary available
    memory (shown to operators, never packed against; it moves with every heartbeat)."""
    return tuple((n.name, n.online, n.cpu_count, n.memory_mb, n.process_slots, tuple(sorted(n.labels.items())), n.gpus)
                 for n in inventory.nodes)


@dataclass(frozen=True)
class _ModelIndex:
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
    def of(cls, snap: StateSnapshot, now: float, timeout_s: float, plan: PlacementPlan | None) -> _ModelIndex:
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


# -------------------------------------------------------------------------------------- controller


class Controller:
    """Desired vs actual for the whole cluster; one ``reconcile(now)`` = one bounded pass."""

    def __init__(
        self,
        state: ClusterState,
        publisher: Publisher,
        leadership: Leadership,
        config: ControlConfig = ControlConfig(),
        metrics: Any | None = None,
        view: StateView | None = None,
        signals: SignalSource | None = None,
        rollouts: RolloutView | None = None,
        overheads: HostOverheads | None = None,
        takeover: TakeoverView | None = None,
    ) -> None:
        self.state = state
        #: what a new leader loads before its first pass (the module docstring's takeover)
        self.takeover: TakeoverView = takeover if takeover is not None else Loaded()
        #: host memory a replica's process costs beyond its spec's memoryMb (SIE_PROCESS_OVERHEAD_MB,
        #: SIE_MODEL_OVERHEAD_MB; ``host_memory`` module); default: the settings' defaults
        self.overheads = overheads if overheads is not None else HostOverheads.defaults()
        self.view: StateView = view if view is not None else FreshView()
        #: None: no autoscaling (every model gets sla.min_replicas)
        self.signals = signals
        self.rollouts: RolloutView = rollouts if rollouts is not None else NoRollouts()
        #: the replica plan of each model in a rollout this pass (``rollout_capacity``; the driver's readiness gate)
        self.capacity: dict[str, CapacityPlan] = {}
        #: (model, version) -> replica template of a rollout version that replicas run next to the applied spec
        self._version_docs: dict[tuple[str, str], ReplicaTemplate] = {}
        #: model -> (its spec object, the spec's replica template): ``_template``
        self._spec_docs: dict[str, tuple[Any, ReplicaTemplate]] = {}
        #: the inputs of the latest placement and its plan: a pass with equal inputs reuses the plan (``_place``)
        self._last_placement: tuple[tuple[Any, ...], PlacementPlan] | None = None
        #: model -> (its spec object, the count, its replica demands): ``_model_demands``
        self._demand_cache: dict[str, tuple[Any, int | None, list[ReplicaDemand]]] = {}
        self._capacity_reported: dict[str, str] = {}
        #: the traffic director's memory per model and replica, and its decisions (newest last)
        self._director_tracks: dict[str, dict[str, Track]] = {}
        self.director_decisions: list[Any] = []
        #: model -> the replica the director added (a floor under its count, ``director`` docstring); published
        #: with the model's status (``ModelStatus.director``), from which a new leader and a standby take it
        self.director_extra: dict[str, Extra] = {}
        self._director_seeded = False
        #: model -> why the director released its replica this pass (what that replica's ``removed`` event says)
        self._director_released: dict[str, str] = {}
        #: the autoscaler's last decision per model (this term's; seeded from the model-status topic)
        self.decisions: dict[str, ScaleDecision] = {}
        self._decisions_seeded = False
        self._last_plan: PlacementPlan | None = None
        self.guard = MassOfflineGuard(config.node_timeout_s, config.mass_offline_fraction)
        self._guard_decision = GuardDecision()
        self.publisher = publisher
        self.leadership = leadership
        self.config = config
        self.metrics = metrics
        # (replica id, node) -> its cool-down: keep that replica off that node
        self.exclusions: dict[tuple[str, str], Cooldown] = {}
        # what this process published and the feeder may not have read back yet: node -> assignment
        self._published: dict[str, AssignmentInfo] = {}
        self._status_published: dict[str, ModelStatus] = {}
        #: the current term's first acting pass seeded what it continues from (``_seed_term``)
        self._term_seeded = False
        self._unplaced_reported: dict[str, str] = {}
        #: replica id -> why it was evicted, while it has no node again
        self._evicted: dict[str, str] = {}
        self._node_online: dict[str, bool] = {}
        #: the leader's move back toward the spread (``rebalance``), and what it adds to this pass's placement
        self.rebalancer = Rebalancer(config.rebalance)
        self._rebalance = RebalanceOutcome()
        self._adopt_move = False
        #: node -> when this process first saw it offline (a node without a heartbeat in the replayed window)
        self._offline_since: dict[str, float] = {}
        #: node -> when this process published its forgetting (not again until read back, or 10 s later)
        self._forgetting: dict[str, float] = {}
        self._gpu_healthy: dict[tuple[str, int], bool] = {}
        self._led_last_pass = False
        #: the leader epoch of this instance's current term (None: not leading)
        self._term: int | None = None
        self.last_report: ReconcileReport | None = None
        #: the latest pass that acted (was not skipped)
        self._last_acting: ReconcileReport | None = None
        self.statuses: dict[str, ModelStatus] = {}
        #: True once a pass acted (was not skipped for a stale view)
        self.acted = False

    # -- the pass ----------------------------------------------------------------------------------

    def reconcile(self, now: float) -> ReconcileReport:
        started, cpu_started = time.perf_counter(), time.thread_time()
        durations: dict[str, float] = {}
        errors: dict[str, str] = {}
        leader = self.leadership.is_leader
        epoch = self.leadership.epoch
        if leader and (not self._led_last_pass or epoch != self._term):
            # new term (also one won again between two passes): forget what a previous term of ours published
            # and decided; what the topics hold once the takeover loaded them is the truth now
            self._published.clear()
            self._unplaced_reported.clear()
            self._decisions_seeded = False  # continue from the last decision published, not our own guesses
            self._director_seeded = False  # ... and from the director's published floor
            self._term_seeded = False  # ... and from the statuses, cool-downs and reports last published
            self._director_tracks.clear()  # hysteresis memory: a hot replica must stay hot sustain_s again
        self._led_last_pass = leader
        self._term = epoch if leader else None
        # before the snapshot: the takeover's read barrier must cover what this pass reads
        loading = self.takeover.not_loaded(epoch) if leader else None
        snap = self.state.snapshot()
        wait = self._stale_view(snap, now) or loading
        if wait is not None:
            durations["total"] = time.perf_counter() - started
            report = ReconcileReport(now, leader, (), None, self.statuses, {}, durations, skipped=wait)
            self.last_report = report
            self._observe(report, snap, now)
            return report
        self.acted = True
        if leader and not self._term_seeded:
            self._seed_term(now)
            self._term_seeded = True
            self._adopt_move = True  # a move its predecessor published goes on (``Rebalancer.adopt``)
        out: list[OutRecord] = []
        plan: PlacementPlan | None = None
        statuses: dict[str, ModelStatus] = {}

        def step(name: str, fn: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn()
            except Exception as exc:  # one failing subsystem must not stop the loop
                errors[name] = f"{type(exc).__name__}: {exc}"
                log.exception("reconcile step %s failed", name)
                return None
            finally:
                durations[name] = time.perf_counter() - t0

        step("failures", lambda: self._record_failures(snap, now, out))
        inventory = step("nodes", lambda: self._inventory(snap, now, out))
        if inventory is not None:
            nodes = inventory
            step("forget", lambda: self._forget_nodes(snap, nodes, now, out))
        counts = step("autoscale", lambda: self._autoscale(snap, now, leader, out))
        if counts is None:  # the autoscaler failed: keep the last counts rather than fall back to the minimum
            counts = {name: d.desired for name, d in self.decisions.items()}
        self._director_released = {}
        if self.config.director is None:
            self.director_extra.clear()
        elif not leader or not self._director_seeded:
            self._seed_director_floors(snap)  # a standby follows the leader's floors; a new leader continues them
            self._director_seeded = leader
        if leader and self.config.director is not None:
            base = counts
            step("director", lambda: self._direct(snap, now, out, base))
        counts = self._with_director_floors(snap, counts)
        self._rebalance = RebalanceOutcome()
        if leader and inventory is not None:
            floored, nodes = counts, inventory
            if self._adopt_move:
                self._adopt_move = False
                self.rebalancer.adopt(now, snap.specs, floored, self._placed_by_model(snap))
            self._rebalance = step("rebalance", lambda: self._rebalance_step(snap, now, out, floored, nodes)) \
                or RebalanceOutcome()
        else:
            self.rebalancer.move = None  # a standby moves nothing; a new leader adopts a move in flight (_seed_term)
        if self._rebalance.floors:
            counts = {**counts, **{m: desired_count(snap.specs[m], counts.get(m, 0), rebalance_floor=f)
                                   for m, f in self._rebalance.floors.items() if m in snap.specs}}
        if inventory is not None:
            published = self._published_view(snap)
            plan = step("placement", lambda: self._place(snap, inventory, published, counts))
            if plan is not None:
                step("assignments", lambda: self._assignments(snap, plan, published, out))
                step("events", lambda: self._placement_events(plan, published, inventory, now, out))
                step("capacity", lambda: self._capacity_events(now, out))
                if self.director_extra:
                    step("director_unplaced", lambda: self._drop_unplaced_extras(plan, now, out))
        if plan is not None:
            self._last_plan = plan
            statuses = step("status", lambda: self._statuses(snap, plan, now, out)) or {}
        published_records: tuple[OutRecord, ...] = ()
        if leader and out:
            t0 = time.perf_counter()
            try:
                self.publisher.publish(self._stamp(out, now))
                published_records = tuple(out)
                self._remember(out, statuses)
            except Fenced as exc:
                self.leadership.step_down(f"fenced while publishing: {exc}")
                errors["publish"] = f"fenced: {exc}"
            except Exception as exc:
                errors["publish"] = f"{type(exc).__name__}: {exc}"
                log.warning("publish failed (retried next pass): %s", exc)
            durations["publish"] = time.perf_counter() - t0
        elif leader:
            self._remember([], statuses)
        self.statuses = statuses or self.statuses
        durations["total"] = time.perf_counter() - started
        # the CPU this pass's thread used: on a starved machine "total" is mostly waiting for a core
        durations["cpu"] = time.thread_time() - cpu_started
        report = ReconcileReport(now, leader, published_records, plan, statuses, errors, durations,
                                 guard=self._guard_decision.reason,
                                 decisions={n: d for n, d in self.decisions.items() if n in snap.specs})
        self.last_report = self._last_acting = report
        self._observe(report, snap, now)
        return report

    def _observe(self, report: ReconcileReport, snap: StateSnapshot, now: float) -> None:
        if self.metrics is not None:
            try:
                self.metrics.observe(report, snap, now, self.config.node_timeout_s)
            except Exception:  # metrics are best effort
                log.exception("metrics update failed")

    def _stale_view(self, snap: StateSnapshot, now: float) -> str | None:
        """Why this pass must not act (module docstring), or None."""
        stale = self.view.stale_reason()
        if stale is not None:
            return stale
        caught_up_at = self.view.caught_up_at
        if caught_up_at is None:
            return "state reader not caught up"
        timeout = self.config.node_timeout_s
        if now < caught_up_at + timeout:
            unheard = sorted(n for n in snap.heartbeats if n in snap.nodes and not snap.heard_live(n, now, timeout))
            if unheard:
                shown = ", ".join(unheard[:10]) + (f" and {len(unheard) - 10} more" if len(unheard) > 10 else "")
                return (f"caught up {now - caught_up_at:.1f}s ago; waiting up to {caught_up_at + timeout - now:.1f}s "
                        f"for a live heartbeat of {shown} before judging liveness")
        return None

    def health(self) -> dict[str, Any]:
        """The reconcile loop and the mass-offline guard, as ``/healthz`` shows them."""
        report = self.last_report
        if report is None:
            loop: dict[str, Any] = {"ok": False, "detail": "no reconcile pass yet"}
        elif report.skipped:
            loop = {"ok": False, "detail": f"not acting: {report.skipped}"}
        elif report.errors:
            loop = {"ok": False, "detail": "; ".join(f"{k}: {v}" for k, v in sorted(report.errors.items()))}
        else:
            loop = {"ok": True, "detail": "reconciling"}
        acted = self._last_acting
        if acted is not None:  # where the time of a pass goes (docs/control-plane.md, "Scale")
            loop["last_pass_ms"] = {k: round(v * 1000, 1) for k, v in acted.durations.items()}
        return {"reconcile": loop, "liveness_guard": self.guard.status()}

    # -- steps -------------------------------------------------------------------------------------

    def _record_failures(self, snap: StateSnapshot, now: float, out: list[OutRecord]) -> None:
        """FAILED on the node the replica is assigned to -> exclusion (replica, node) for the cool-down;
        cool-downs that a re-apply, a delete or a reset ended are cleared (``Cooldown``)."""
        self._clear_cooldowns(snap, now, out)
        assigned = {(a.replica_id, node) for node, info in self._published_view(snap).items() for a in info.replicas}
        for report in self.state.drain_failures():
            key = (report.replica_id, report.node)
            until = report.at + self.config.failure_cooldown_s
            if key not in assigned or until <= now or key in self.exclusions:
                continue
            if report.at <= self._cleared_since(snap, report.model, report.replica_id):
                continue  # FAILED before the spec was re-applied or the replica reset: stale
            reason = report.reason or "crashed too often"
            self.exclusions[key] = Cooldown(until, reason, report.model, report.at)
            out.append(self._event(now, "replica_failed", report.model, report.replica_id, report.node,
                                   f"replica FAILED on {report.node}: {reason}; kept off it for "
                                   f"{self.config.failure_cooldown_s:g}s (or until a re-apply or "
                                   f"`sie replica reset {report.replica_id}`)"))

    @staticmethod
    def _applied(snap: StateSnapshot, model: str) -> tuple[str, str, float | None]:
        """(``model`` or ``connector``, what was applied, when it was last applied; None: it no longer is).
        A connector's replicas (``cdc:<name>``) are applied on the connectors topic (apply, pause and resume
        each write its record), a model's on the specs topic."""
        connector = Names.connector_of_replica_model(model)
        if connector is not None:
            info = snap.connectors.get(connector)
            return "connector", f"connector {connector}", None if info is None else info.applied_at_ms / 1000.0
        spec = snap.specs.get(model)
        if spec is None:
            return "model", f"spec {model}", None
        return "model", f"spec {model} {spec.version}", snap.spec_applied_at.get(model, 0.0)

    @classmethod
    def _cleared_since(cls, snap: StateSnapshot, model: str, replica_id: str) -> float:
        """The latest time a cool-down of ``replica_id`` was ended by an operator: its spec or connector
        (re)applied, or a reset asked for; FAILED reports made before it are stale."""
        return max(cls._applied(snap, model)[2] or 0.0, snap.cooldown_resets.get(replica_id, 0.0))

    def _clear_cooldowns(self, snap: StateSnapshot, now: float, out: list[OutRecord]) -> None:
        for key, cd in list(self.exclusions.items()):
            rid, node = key
            why = None
            kind, what, applied_at = self._applied(snap, cd.model)
            if applied_at is None:
                why = f"the {kind} is no longer applied"
            elif applied_at > cd.since:
                why = f"{what} applied after the failure"
            elif snap.cooldown_resets.get(rid, 0.0) > cd.since:
                why = f"reset by hand (sie replica reset {rid})"
            elif cd.until <= now:
                del self.exclusions[key]  # ran out: placement simply uses the node again
                continue
            if why is not None:
                del self.exclusions[key]
                out.append(self._event(now, "cooldown_cleared", cd.model, rid, node,
                                       f"cool-down of {rid} on {node} cleared: {why}"))

    def cooldowns(self) -> dict[str, list[dict[str, Any]]]:
        """Replica id -> its cool-downs (node, until_ms, reason): what ``ModelStatus`` shows."""
        out: dict[str, list[dict[str, Any]]] = {}
        for (rid, node), cd in sorted(self.exclusions.items()):
            out.setdefault(rid, []).append(cd.to_json(node))
        return out

    def _inventory(self, snap: StateSnapshot, now: float, out: list[OutRecord]) -> ClusterInventory:
        inventory = self._guarded(snap.inventory(now, self.config.node_timeout_s), snap, now, out)
        for node in inventory.nodes:
            was = self._node_online.get(node.name)
            if was is not None and was != node.online:
                kind = "node_online" if node.online else "node_offline"
                detail = (f"node {node.name} is back" if node.online
                          else f"node {node.name} offline: no heartbeat for > {self.config.node_timeout_s:g}s")
                out.append(self._event(now, kind, None, None, node.name, detail))
            self._node_online[node.name] = node.online
            for g in node.gpus:
                key = (node.name, g.index)
                was_ok = self._gpu_healthy.get(key)
                if was_ok is not None and was_ok != g.healthy:
                    kind = "gpu_recovered" if g.healthy else "gpu_failed"
                    out.append(self._event(now, kind, None, None, node.name, f"gpu {node.name}/{g.index} ({g.product}) {'healthy again' if g.healthy else 'reported unhealthy'}"))
                self._gpu_healthy[key] = g.healthy
        return inventory

    def _forget_nodes(self, snap: StateSnapshot, inventory: ClusterInventory, now: float, out: list[OutRecord]) -> None:
        """Forget offline nodes an operator asked to forget (after the node was last alive), or offline for
        ``node_forget_after_s``: tombstones of the registration and the assignment with a ``node_forgotten`` event,
        in this pass's transaction.  A node whose published assignment still holds replicas waits for the pass that
        moves them; a node held online by the mass-offline guard is online here."""
        after = self.config.node_forget_after_s
        published = self._published_view(snap)
        for node in inventory.nodes:
            name = node.name
            if node.online:
                self._offline_since.pop(name, None)
                continue
            hb = snap.heartbeats.get(name)
            last_alive = hb.alive_at if hb is not None else None
            offline_for = now - (last_alive if last_alive is not None else self._offline_since.setdefault(name, now))
            asked = snap.forget_requests.get(name)
            if asked is not None and asked > (last_alive or 0.0):
                why = "an operator asked (sie node forget)"
            elif after > 0 and offline_for >= after:
                why = f"offline for {offline_for:.0f}s (control.node_forget_after_s: {after:g})"
            else:
                continue
            if now - self._forgetting.get(name, float("-inf")) < 10.0:
                continue  # published, not read back yet
            assigned = published.get(name)
            if assigned is not None and assigned.replicas:
                continue  # its replicas are moved first (this pass's placement), then it is forgotten
            out.append(OutRecord("nodes", name, "NodeRegistration", None))
            if assigned is not None:
                out.append(OutRecord("assignments", name, "Assignment", None))
            out.append(self._event(now, NODE_FORGOTTEN_KIND, None, None, name,
                                   f"node {name} forgotten: {why}; gone from inventory, status and alerts (an agent "
                                   f"started on it again registers anew)"))
            self._forgetting[name] = now
        for name in list(self._forgetting):
            if name not in snap.nodes and name not in snap.heartbeats:
                del self._forgetting[name]  # read back: the state dropped it
                self._published.pop(name, None)
                self._node_online.pop(name, None)
                self._offline_since.pop(name, None)

    def _guarded(self, inventory: ClusterInventory, snap: StateSnapshot, now: float, out: list[OutRecord]) -> ClusterInventory:
        """The mass-offline guard's verdict applied: held nodes count as online this pass."""
        from dataclasses import replace as dc_replace

        alive_at = {}
        for node in inventory.nodes:
            hb = snap.heartbeats.get(node.name)
            alive_at[node.name] = hb.alive_at if hb is not None else None
        online = {n.name for n in inventory.nodes if n.online}
        decision = self.guard.assess(now, alive_at, online, self.view.lag_reason())
        self._guard_decision = decision
        if decision.engaged:
            log.warning("liveness guard: %s", decision.engaged)
            out.append(self._event(now, "liveness_guard", None, None, None, decision.engaged))
        if decision.released:
            log.warning("liveness guard released: %s", decision.released)
            out.append(self._event(now, "liveness_guard_released", None, None, None, decision.released))
        if not decision.holding:
            return inventory
        return ClusterInventory.of(dc_replace(n, online=True) if n.name in decision.holding else n for n in inventory.nodes)

    def _demands(self, snap: StateSnapshot, counts: Mapping[str, int] | None = None) -> list[ReplicaDemand]:
        counts = counts or {}
        models = [d for name in sorted(snap.specs) for d in self._model_demands(name, snap.specs[name], counts.get(name))]
        return models + connector_demands(snap.connectors, snap.specs)  # CDC connectors run as CPU replicas

    def _rollout_demands(self, snap: StateSnapshot, demands: list[ReplicaDemand], inventory: ClusterInventory,
                         current: Mapping[str, tuple[str, tuple[int, ...]]],
                         counts: Mapping[str, int]) -> list[ReplicaDemand]:
        """Each model in a rollout gets the replicas ``rollout_capacity.plan_capacity`` gives it (a surge or
        replaced new-version replica, then the one-at-a-time drain); every other demand is unchanged."""
        from sie.schemas.spec import ModelService

        plans: dict[str, CapacityPlan] = {}
        docs: dict[tuple[str, str], ReplicaTemplate] = {}
        for name in sorted(snap.specs):
            ro = self.rollouts.replicas_of(name) if hasattr(self.rollouts, "replicas_of") else None
            if ro is None or ro.phase not in PLANNED_PHASES:
                continue  # no rollout, or rolling back: the applied (stable) spec is placed as ever
            specs = {ro.stable_version: ModelService.from_document(dict(ro.stable_spec)),
                     ro.canary_version: ModelService.from_document(dict(ro.canary_spec))}
            for version, doc in ((ro.stable_version, ro.stable_spec), (ro.canary_version, ro.canary_spec)):
                docs[(name, version)] = template_of(doc)
            others = [d for d in demands if d.model != name]
            count = desired_count(snap.specs[name], counts.get(name))
            trial = demands_from_spec(specs[ro.canary_version],
                                      desired_count(snap.specs[name], counts.get(name), surge=1))[-1]
            tried = place([*demands, trial], inventory, current, excluded=self._excluded(), overheads=self.overheads)
            blocked = ""
            if trial.replica_id not in tried.placements:
                failed = [f"it FAILED on {node}: {cd.reason}" for (rid, node), cd in sorted(self.exclusions.items())
                          if rid == trial.replica_id]
                blocked = "; ".join(failed) or tried.unplaced[trial.replica_id].reason
            plan = plan_capacity(self._capacity_inputs(snap, name, ro, count, not blocked, blocked))
            plans[name] = plan
            mine = [demands_from_spec(specs[version], idx + 1)[idx] for idx, version in enumerate(plan.versions)]
            demands = others + mine if plan.mode != "unmanaged" else demands
        self.capacity = plans
        self._version_docs = docs
        return demands

    def _direct(self, snap: StateSnapshot, now: float, out: list[OutRecord], counts: Mapping[str, int]) -> None:
        """The traffic director over each model's READY replicas (heartbeats: the GPU utilisation of the
        replica's GPUs, its scorer's lag as the queue, its p99).  In-process scorers share a model's partitions
        by Kafka's group assignment, so the director's lever is a replica on a cooler node: ``replica_lever``
        holds one more replica as a floor under the autoscaler's count (``counts``), bounded by the spec's
        maximum, never while a rollout of the model is in progress, released by the director's hysteresis.
        Each decision is a ``director`` event with the numbers behind it (``sie describe model`` lists it)."""
        assert self.config.director is not None
        where = {a.replica_id: (node, a.gpu_indices) for node, info in self._published_view(snap).items()
                 for a in info.replicas}
        by_model: dict[str, list[Signal]] = {}
        for node, hb in sorted(snap.heartbeats.items()):
            if not snap.node_online(node, now, self.config.node_timeout_s):
                continue
            util = {g.index: g.utilization_pct for g in hb.gpus}
            for r in hb.replicas:
                if r.state != ReplicaState.READY or r.model not in snap.specs:
                    continue
                gpus = where.get(r.replica_id, (node, ()))[1]
                used = [util[i] for i in gpus if i in util]
                by_model.setdefault(r.model, []).append(
                    Signal(r.replica_id, max(used) if used else None, None if r.lag is None else float(r.lag),
                           r.p99_ms, node))
        for model in sorted(set(by_model) | set(self.director_extra)):
            signals = by_model.get(model, [])
            decisions: list[Any] = []
            if len(signals) >= 2:  # one replica: nothing is cooler than it (the autoscaler adds replicas on backlog)
                tracks, decisions = direct(signals, self._director_tracks.get(model, {}), now, self.config.director,
                                           lever="replicas")
                self._director_tracks[model] = tracks
            spec = snap.specs.get(model)
            if spec is None:
                self.director_extra.pop(model, None)
                continue
            base, hi = desired_count(spec, counts.get(model)), ceiling(spec)
            extra, decisions = replica_lever(self.director_extra.get(model), decisions, signals, base, hi, now,
                                             self.config.director, held=self.rollouts.in_progress(model))
            if extra is None:
                if self.director_extra.pop(model, None) is not None:
                    self._director_released[model] = "released by the traffic director (every replica cool)"
            else:
                self.director_extra[model] = extra
            for d in decisions:
                self.director_decisions = [*self.director_decisions[-99:], d]
                log.info("traffic director %s: %s", model, d.reason)
                out.append(self._event(now, "director", model, d.name, d.node, f"{d.action}: {d.reason}"))
        for gone in set(self._director_tracks) - set(by_model):
            del self._director_tracks[gone]

    def _drop_unplaced_extras(self, plan: PlacementPlan, now: float, out: list[OutRecord]) -> None:
        """A replica the director added that no node has room for is given up at once (its ``unschedulable``
        event says why): a floor nobody can place would only hold an unschedulable replica until the release."""
        for model, extra in sorted(self.director_extra.items()):
            mine = [u for u in plan.unplaced.values() if u.model == model]
            if mine:
                del self.director_extra[model]
                out.append(self._event(now, "director", model, extra.replica, extra.node,
                                       f"release_replica: the added replica could not be placed ({mine[0].reason}); "
                                       f"floor {extra.floor} lifted"))

    def _placed_by_model(self, snap: StateSnapshot) -> dict[str, dict[str, str]]:
        """model -> {replica id: node} of the last published assignments."""
        out: dict[str, dict[str, str]] = {}
        for node, info in self._published_view(snap).items():
            for a in info.replicas:
                out.setdefault(a.model, {})[a.replica_id] = node
        return out

    def _rebalance_step(self, snap: StateSnapshot, now: float, out: list[OutRecord], counts: Mapping[str, int],
                        inventory: ClusterInventory) -> RebalanceOutcome:
        """The move back toward the spread (``rebalance`` module): floors, exclusions and preferred nodes for this
        pass's placement, and a ``rebalance`` event per step."""
        busy = {name for name in snap.specs if self.rollouts.in_progress(name) is not None} | set(self.director_extra)
        online = [n.name for n in inventory.nodes if n.online]
        def eligible(model: str, node: str) -> bool:
            state, demands = inventory.get(node), self._model_demands(model, snap.specs[model], counts.get(model))
            return state is not None and bool(demands) and node_eligible(demands[0], state)

        outcome = self.rebalancer.step(now, snap.specs, counts, self.statuses, online, busy, eligible)
        for model, rid, detail in outcome.events:
            log.info("rebalance %s: %s", model, detail)
            out.append(self._event(now, "rebalance", model, rid, None, detail))
        return outcome

    def _with_director_floors(self, snap: StateSnapshot, counts: Mapping[str, int]) -> dict[str, int]:
        """Each model's count with the director's floor under it (``director`` docstring: max of the two)."""
        out = dict(counts)
        for model, extra in self.director_extra.items():
            spec = snap.specs.get(model)
            if spec is not None:
                out[model] = desired_count(spec, out.get(model), director_floor=extra.floor)
        return out

    def _capacity_events(self, now: float, out: list[OutRecord]) -> None:
        """A ``rollout_capacity`` event each time a model's replica plan says something new (not every pass)."""
        for name, plan in sorted(self.capacity.items()):
            if self._capacity_reported.get(name) != plan.reason:
                self._capacity_reported[name] = plan.reason
                out.append(self._event(now, "rollout_capacity", name, None, None, f"{plan.mode}: {plan.reason}"))
        for gone in set(self._capacity_reported) - set(self.capacity):
            del self._capacity_reported[gone]

    def _capacity_inputs(self, snap: StateSnapshot, name: str, ro: RolloutReplicas, count: int,
                         fits: bool, blocked: str) -> CapacityInputs:
        prefix = f"{name}-"
        assigned: dict[int, str] = {}
        for info in self._published_view(snap).values():
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
        decision = self.decisions.get(name)
        needed = desired_count(snap.specs[name], decision.needed if decision is not None else None)
        return CapacityInputs(ro.phase, ro.stable_version, ro.canary_version, count, min(needed, count),
                              assigned, frozenset(ready), fits, problems, blocked, companions)

    def _excluded(self) -> dict[str, frozenset[str]]:
        """Exclusions as the placement engine takes them: replica id -> nodes it must not use."""
        out: dict[str, set[str]] = {}
        for rid, node in self.exclusions:
            out.setdefault(rid, set()).add(node)
        for rid, nodes in self._rebalance.excluded.items():  # a replica being moved off a crowded node
            out.setdefault(rid, set()).update(nodes)
        return {rid: frozenset(nodes) for rid, nodes in out.items()}

    def _place(self, snap: StateSnapshot, inventory: ClusterInventory, published: Mapping[str, AssignmentInfo],
               counts: Mapping[str, int] | None = None) -> PlacementPlan:
        current: dict[str, tuple[str, tuple[int, ...]]] = {}
        for node in sorted(published):
            for a in published[node].replicas:
                current.setdefault(a.replica_id, (node, a.gpu_indices))
        demands = self._rollout_demands(snap, self._demands(snap, counts), inventory, current, counts or {})
        preferred = {d.replica_id: self.director_extra[d.model].node for d in demands
                     if d.model in self.director_extra and d.index == self.director_extra[d.model].floor - 1}
        for rid, node in self._rebalance.preferred.items():
            preferred.setdefault(rid, node)
        excluded = self._excluded()
        inputs = (demands, _placement_view(inventory), current, excluded, preferred)
        last = self._last_placement
        if last is not None and last[0] == inputs:
            # the same inputs give the same plan ("same inputs -> equal plan", placement module): most passes
            # change nothing placement reads, and placing again is a large share of a pass (bench/bench_scale.py)
            plan = PlacementPlan(last[1].placements, last[1].unplaced, inventory, last[1].preempted)
        else:
            plan = place(demands, inventory, current, excluded=excluded,
                         preempt=self.config.preemption, overheads=self.overheads, preferred=preferred)
            self._last_placement = (inputs, plan)
        return self._explain_preemptions(self._explain_exclusions(plan))

    def _explain_preemptions(self, plan: PlacementPlan) -> PlacementPlan:
        """A replica evicted by an earlier pass and still without a node keeps "preempted by ..." leading its
        reason (the next pass only sees that no node has room, not why it lost its place)."""
        for rid, pre in plan.preempted.items():
            self._evicted[rid] = pre.describe()
        for rid in list(self._evicted):
            if rid not in plan.unplaced:
                del self._evicted[rid]  # placed again, or no longer wanted
        stale = {rid: note for rid, note in self._evicted.items() if "preempted by" not in plan.unplaced[rid].reason}
        if not stale:
            return plan
        from dataclasses import replace as dc_replace
        from types import MappingProxyType

        unplaced = dict(plan.unplaced)
        for rid, note in stale.items():
            u = unplaced[rid]
            unplaced[rid] = dc_replace(u, reason=f"unschedulable: {note}; no other node has room "
                                                 f"({u.reason.removeprefix('unschedulable: ')})")
        return PlacementPlan(plan.placements, MappingProxyType(unplaced), plan.inventory, plan.preempted)

    def _explain_exclusions(self, plan: PlacementPlan) -> PlacementPlan:
        """Unplaced while excluded from some node: lead with the FAILED report that caused it."""
        if not self.exclusions or not plan.unplaced:
            return plan
        from dataclasses import replace as dc_replace
        from types import MappingProxyType

        unplaced = dict(plan.unplaced)
        for rid, u in plan.unplaced.items():
            nodes = sorted(n for r, n in self.exclusions if r == rid)
            if nodes:
                reason = f"unschedulable: FAILED on {', '.join(nodes)} (cool-down); no other eligible node fits"
                if "excluded from every eligible node" not in u.reason:
                    reason += f" ({u.reason.removeprefix('unschedulable: ')})"
                unplaced[rid] = dc_replace(u, reason=reason)
        return PlacementPlan(plan.placements, MappingProxyType(unplaced), plan.inventory, plan.preempted)

    def _assignments(self, snap: StateSnapshot, plan: PlacementPlan, published: Mapping[str, AssignmentInfo], out: list[OutRecord]) -> None:
        templates = {name: self._template(name, spec) for name, spec in snap.specs.items()}
        for cache in (self._spec_docs, self._demand_cache):
            for gone in set(cache) - set(templates):
                del cache[gone]
        templates.update({m: template_from_json(doc) for m, doc in connector_documents(snap.connectors, snap.specs).items()})
        nodes = set(plan.by_node) | {n for n, a in published.items() if a.replicas}
        for node in sorted(nodes):
            wanted = tuple(
                AssignedReplica(p.replica_id, p.model, p.version, tuple(p.gpu_indices), int(p.gpu_memory_mb),
                                t.json, self._companions(p.model, p.version), t.hash)
                for p in plan.assignments(node)
                for t in (self._version_docs.get((p.model, p.version)) or templates.get(p.model) or _NO_TEMPLATE,)
            )
            last = published.get(node)
            if last is not None and last.replicas == wanted:
                continue
            if last is None and not wanted:
                continue
            out.append(OutRecord("assignments", node, "Assignment", {
                "node": node,
                "epoch": 0,  # stamped at publish time with the leader epoch
                "issued_at_ms": 0,
                "replicas": [a.to_record() for a in wanted],
            }))

    def _model_demands(self, name: str, spec: Any, count: int | None) -> list[ReplicaDemand]:
        """``demands_from_spec`` once per (spec record, count): the demands are immutable values, and 3,000 of them
        made afresh every pass cost ~50 ms at 1,000 models.  ``count`` None: ``desired_count`` without layers."""
        count = desired_count(spec) if count is None else count
        cached = self._demand_cache.get(name)
        if cached is None or cached[0] is not spec or cached[1] != count:
            cached = (spec, count, demands_from_spec(spec, count))
            self._demand_cache[name] = cached
        return cached[2]

    def _template(self, name: str, spec: Any) -> ReplicaTemplate:
        """The replica template an Assignment carries for ``spec`` (``sie.schemas.replica_template``), made once
        per spec record (the state holds one immutable object per record read), not once per pass: 1,000 specs
        cost ~25 ms a pass."""
        cached = self._spec_docs.get(name)
        if cached is None or cached[0] is not spec:
            cached = (spec, template_of(spec.to_document()))
            self._spec_docs[name] = cached
        return cached[1]

    def _companions(self, model: str, version: str) -> tuple[str, ...]:
        """The other version's document a replica of ``model`` at ``version`` serves during its rollout (from a
        process of its own, prepared by its agent); () outside a rollout's planned phases."""
        return tuple(t.json for (m, v), t in sorted(self._version_docs.items()) if m == model and v != version)

    def _placement_events(self, plan: PlacementPlan, published: Mapping[str, AssignmentInfo], inventory: ClusterInventory, now: float, out: list[OutRecord]) -> None:
        before: dict[str, tuple[str, AssignedReplica]] = {}
        for node in sorted(published):
            for a in published[node].replicas:
                before.setdefault(a.replica_id, (node, a))
        for rid, pre in sorted(plan.preempted.items()):
            if rid not in before:
                continue  # evicted in the plan only (never published there): nothing to drain
            now_at = plan.placements.get(rid)
            after = (f"re-placed on {now_at.node}" if now_at is not None else
                     "unschedulable: no other node has room")
            out.append(self._event(now, "preempted", pre.victim_model, rid, pre.node, f"{pre.describe()}; drained; {after}"))
        for rid, p in sorted(plan.placements.items()):
            old = before.get(rid)
            where = f"{p.node}" + (f" gpu {','.join(map(str, p.gpu_indices))}" if p.gpu_indices else " (cpu)")
            if old is None:
                out.append(self._event(now, "placed", p.model, rid, p.node, f"{rid} placed on {where}" + (f" ({p.note})" if p.note else "")))
            elif (old[0], old[1].gpu_indices) != (p.node, tuple(p.gpu_indices)):
                why = (plan.preempted[rid].describe() if rid in plan.preempted
                       else self._why_moved(rid, old[0], old[1].gpu_indices, inventory))
                out.append(self._event(now, "moved", p.model, rid, p.node, f"{rid} moved from {old[0]} to {where}: {why}"))
            self._unplaced_reported.pop(rid, None)
        for rid, u in sorted(plan.unplaced.items()):
            old = before.get(rid)
            if self._unplaced_reported.get(rid) == u.reason and old is None:
                continue
            detail = u.reason if old is None else f"{u.reason} (was on {old[0]}: {self._why_moved(rid, old[0], old[1].gpu_indices, inventory)})"
            out.append(self._event(now, "unschedulable", u.model, rid, None, detail))
            self._unplaced_reported[rid] = u.reason
        wanted = set(plan.placements) | set(plan.unplaced)
        for rid, (node, a) in sorted(before.items()):
            if rid not in wanted:
                decision = self.decisions.get(a.model)
                why = (self._director_released.get(a.model)
                       or (f"scaled down ({decision.reason})" if decision is not None and decision.scaled
                           else "no longer desired"))
                out.append(self._event(now, "removed", a.model, rid, node, f"{rid} removed from {node}: {why}"))
        for rid in list(self._unplaced_reported):
            if rid not in wanted:
                del self._unplaced_reported[rid]

    def _why_moved(self, rid: str, node: str, gpus: tuple[int, ...], inventory: ClusterInventory) -> str:
        state = inventory.get(node)
        if state is None:
            return f"node {node} is no longer registered"
        if not state.online:
            return f"node {node} offline"
        bad = [i for i in gpus if not any(g.index == i and g.healthy for g in state.gpus)]
        if bad:
            return f"gpu {node}/{bad[0]} failed"
        if (rid, node) in self.exclusions:
            return f"replica FAILED on {node}: {self.exclusions[(rid, node)].reason}"
        return "spec or constraints changed"

    def _statuses(self, snap: StateSnapshot, plan: PlacementPlan, now: float, out: list[OutRecord]) -> dict[str, ModelStatus]:
        from dataclasses import replace as dc_replace

        epoch = self.leadership.epoch
        statuses: dict[str, ModelStatus] = {}
        cooldowns = self.cooldowns()
        ids: dict[str, list[str]] = {}  # model -> its replicas in the plan (one sweep, not one per model)
        for rid, p in plan.placements.items():
            ids.setdefault(p.model, []).append(rid)
        for rid, u in plan.unplaced.items():
            ids.setdefault(u.model, []).append(rid)
        for name in sorted(set(snap.specs) | set(snap.spec_errors)):
            statuses[name] = build_status(name, snap.specs.get(name), snap.spec_errors.get(name), plan, snap, now,
                                          self.config.node_timeout_s, epoch, cooldowns, ids.get(name, ()))
            decision = self.decisions.get(name)
            if decision is not None and name in snap.specs:
                statuses[name] = dc_replace(statuses[name], autoscale=decision.to_record())
            extra = self.director_extra.get(name)
            if extra is not None and name in snap.specs:
                statuses[name] = dc_replace(statuses[name], director=extra.to_record())
            if not statuses[name].same_as(self._status_published.get(name)):
                out.append(OutRecord("model-status", name, "ModelStatus", statuses[name].to_record()))
        for name in sorted(set(self._status_published) - set(statuses)):
            out.append(OutRecord("model-status", name, "ModelStatus", None))
        return statuses

    # -- autoscaling -----------------------------------------------------------------------------------

    _EVENT_OF_ACTION = {"up": "scaled_up", "down": "scaled_down", "to_zero": "scaled_to_zero",
                        "wake": "woke_from_zero", "blocked": "scale_blocked", "bounds": "scaled_to_bounds"}

    def _seed_decisions(self, now: float) -> None:
        """The decisions last published (``model-status`` topic): a new leader, or a standby, continues
        from them instead of starting every model at its minimum."""
        with self.state._lock:  # noqa: SLF001 - the one place that seeds from the topic (like statuses)
            records = {name: rec.get("autoscale") for name, rec in self.state.model_status.items()}
        self.decisions = {}
        for name, rec in records.items():
            if rec:
                try:
                    self.decisions[name] = ScaleDecision.from_record(rec, now)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("autoscale state of %s unreadable (starting it afresh): %s", name, exc)

    def _seed_term(self, now: float) -> None:
        """A new term continues from the statuses last published (model-status topic), read once the takeover
        loaded them: compared with them, nothing is re-published without a change; their replicas' cool-downs
        join the exclusions (a standby's passes built the same from FAILED reports, but a fresh process
        replays only those of replicas still on that node: a replica FAILED on node-a and moved to node-b
        would otherwise be free to go back within its cool-down); their unschedulable reasons are not
        announced again."""
        from sie.control.reconcile.status import ModelStatus as MS

        with self.state._lock:  # noqa: SLF001 - the one place that seeds from the topic
            loaded = dict(self.state.model_status)
        self._status_published = {}
        for name, rec in loaded.items():
            try:
                status = MS.from_record(rec)
            except Exception as exc:
                log.warning("model status of %s unreadable (it is published again): %s", name, exc)
                continue
            self._status_published[name] = status
            for view in status.replicas:
                if view.state == ReplicaState.UNSCHEDULABLE and view.reason:
                    self._unplaced_reported[view.replica_id] = view.reason
                for cd in view.cooldowns:
                    until = int(cd["until_ms"]) / 1000.0
                    key = (view.replica_id, str(cd["node"]))
                    if until > now and key not in self.exclusions:
                        # since: the FAILED report (until = report + failure_cooldown_s), for _clear_cooldowns
                        self.exclusions[key] = Cooldown(until, str(cd["reason"]), view.model,
                                                        until - self.config.failure_cooldown_s)

    def _seed_director_floors(self, snap: StateSnapshot) -> None:
        """The director's floors as last published (``ModelStatus.director``, in the same transaction as the
        assignments that hold them): a new leader keeps the replica the director added instead of removing it,
        and a standby's view counts it like the leader's.  WHY not re-derived from the assignments alone: a
        model's replicas beyond the autoscaler's count could also be a count the old leader was about to lower,
        and the floor's ``since``/``cool_since`` (its hysteresis) are not in them."""
        with self.state._lock:  # noqa: SLF001 - the one place that seeds from the topic (like decisions)
            records = {name: rec.get("director") for name, rec in self.state.model_status.items()}
        self.director_extra = {}
        for name, rec in records.items():
            if rec and name in snap.specs:
                try:
                    self.director_extra[name] = Extra.from_record(rec)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("traffic director floor of %s unreadable (starting without it): %s", name, exc)

    def _autoscale_inputs(self, name: str, spec: Any, index: _ModelIndex) -> ModelInputs:
        ready, p99, rates = index.ready.get(name, (0, None, []))
        placed = len(index.placed.get(name, ()))
        mine = index.unplaced.get(name, [])
        sla = spec.sla
        return ModelInputs(name, str(spec.priority_level), int(sla.min_replicas), int(sla.max_replicas),
                           sla.max_queue_time_ms, sla.p99_latency_ms, ready, placed, len(mine),
                           mine[0].reason if mine else None, p99,
                           sum(rates) / len(rates) if rates else None, self.rollouts.in_progress(name))

    def _autoscale(self, snap: StateSnapshot, now: float, leader: bool, out: list[OutRecord]) -> dict[str, int]:
        """Replica count per model.  The leader decides (and publishes each change as an event); a standby
        follows the decisions on the topic, so its API shows what the leader decided."""
        if self.signals is None:
            return {name: desired_count(spec) for name, spec in snap.specs.items()}
        if not leader or not self._decisions_seeded:
            self._seed_decisions(now)
            self._decisions_seeded = leader
        signals = self.signals.signals() if leader else {}
        counts: dict[str, int] = {}
        index: _ModelIndex | None = None  # built once, for the first model that can scale
        for name in sorted(snap.specs):
            spec = snap.specs[name]
            previous = self.decisions.get(name)
            if not can_scale(spec):
                self.decisions.pop(name, None)  # a fixed-size model has nothing to decide
                counts[name] = desired_count(spec, scale_range(spec)[0])
                continue
            if not leader:
                counts[name] = desired_count(spec, previous.desired if previous is not None else None)
                continue
            if index is None:
                index = _ModelIndex.of(snap, now, self.config.node_timeout_s, self._last_plan)
            inputs = self._autoscale_inputs(name, spec, index)
            decision = decide(inputs, signals.get(name), previous, now, self.config.autoscale)
            self.decisions[name] = decision
            counts[name] = desired_count(spec, decision.desired)
            if decision.scaled and (previous is None or decision.desired != previous.desired or decision.action == "blocked"):
                log.info("autoscale %s: %s", name, decision.reason)
                out.append(self._event(now, self._EVENT_OF_ACTION[decision.action], name, None, None, decision.reason))
        for gone in set(self.decisions) - set(snap.specs):
            del self.decisions[gone]
        return counts

    # -- bookkeeping -------------------------------------------------------------------------------

    def _published_view(self, snap: StateSnapshot) -> dict[str, AssignmentInfo]:
        """Last published assignment per node: the topic, overlaid with what this term published."""
        view = dict(snap.assignments)
        for node, mine in list(self._published.items()):
            theirs = view.get(node)
            if theirs is not None and theirs.replicas == mine.replicas:
                del self._published[node]  # read back: the topic agrees
            view[node] = mine
        return view

    def _stamp(self, records: list[OutRecord], now: float) -> list[OutRecord]:
        epoch = self.leadership.epoch
        stamped = []
        for r in records:
            if r.topic == "assignments" and r.value is not None:
                r = OutRecord(r.topic, r.key, r.record, {**r.value, "epoch": epoch, "issued_at_ms": int(now * 1000)})
            elif r.topic == "model-status" and r.value is not None:
                r = OutRecord(r.topic, r.key, r.record, {**r.value, "epoch": epoch})
            stamped.append(r)
        return stamped

    def _remember(self, records: Sequence[OutRecord], statuses: Mapping[str, ModelStatus]) -> None:
        from sie.control.reconcile.records import assignment_from_record

        for r in records:
            if r.topic == "assignments" and r.value is not None:
                self._published[r.key] = assignment_from_record({**r.value, "epoch": self.leadership.epoch})
            elif r.topic == "model-status":
                if r.value is None:
                    self._status_published.pop(r.key, None)
                elif r.key in statuses:
                    self._status_published[r.key] = statuses[r.key]

    def _event(self, now: float, kind: str, model: str | None, replica_id: str | None, node: str | None, detail: str) -> OutRecord:
        key = model or node or "cluster"
        return OutRecord("events", key, "ControlEvent", {
            "ts_ms": int(now * 1000), "kind": kind, "model": model, "replica_id": replica_id, "node": node, "detail": detail,
        })
