"""Which models a pass plans: the ones whose inputs changed, and a periodic check against a pass from scratch.

A level-triggered pass that re-derives every model costs what the fleet weighs, not what changed (at 2,000
models a steady pass spent 0.30 CPU-s mostly re-deriving statuses nothing had touched).  The leader keeps its
derived state (counts, the plan, statuses, the director's and rebalancer's candidates) between passes and plans
only the models in scope::

    changes = the records' journal since the last acting pass (``ClusterState.take_changes``), plus a skipped
              pass's, kept
    full    = everything changed (a connector, a reset, a forgotten node; the first pass of a term), or the
              view of rollouts is unknown, or the periodic check is due (``ControlConfig.full_check_s``)
    dirty   = changed models + unfinished rollouts + rollouts that ended + models on nodes that went online or
              offline + models whose count, floor, decision or cool-downs changed
    the steps plan ``dirty`` (everything when ``full``) and keep the rest of what the last pass derived:
              placement re-places only models whose spec or count changed (``Replanner``), Assignments and
              events cover only nodes whose placements or published records changed
    check   = on a full pass, the statuses, counts and placements the kept state gives are compared with the
              ones derived from scratch: a mismatch is logged, counted
              (``sie_control_incremental_mismatches_total``) and repaired (the from-scratch values win)

=======================================  ====================================================================
a change                                 what it puts in scope
=======================================  ====================================================================
spec applied or deleted                  the model
heartbeat                                the models of the replicas it reports differently (not its time; a
                                         replica's lag or p99 only for the traffic director)
replica-status, model-status             the model
Assignment read                          the models whose entries changed, the node
node registration                        the node (placement compares the inventory every pass)
node online <-> offline                  the models placed there
connector, reset, node forget            everything (a full pass)
a new term                               everything, but for a standby that leads: what changed since its last
                                         pass, what it noted the topics lack (``unsynced_*``), the models with a
                                         decision or floor; the director and rebalancer look at every model
nothing                                  nothing: the pass keeps the last plan, statuses and counts
=======================================  ====================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sie.control.placement.engine import PlacementPlan
from sie.control.reconcile.records import Changes

log = logging.getLogger(__name__)


@dataclass
class PassScope:
    """One pass's scope: ``full`` (plan everything) or the ``models`` whose inputs changed."""

    full: bool
    models: set[str] = field(default_factory=set)
    #: nodes whose GPU utilisation changed, models whose replicas' lag or p99 changed (what the traffic director
    #: reads; nothing else in a pass does)
    gpus: set[str] = field(default_factory=set)
    signals: set[str] = field(default_factory=set)
    #: the models whose spec record was read
    specs: set[str] = field(default_factory=set)
    #: this full pass is the periodic check (compare the kept state with the one derived from scratch)
    check: bool = False
    #: the first pass of a term that continues a standby's state: the leader-only steps (the director, the
    #: rebalancer), which a standby does not run, look at every model
    continues: bool = False

    def names(self) -> set[str] | None:
        """The models to plan, or None for all of them."""
        return None if self.full else self.models


@dataclass
class Derived:
    """What the leader keeps between passes to plan only what changed, and the check's tally."""

    pending: Changes = field(default_factory=lambda: Changes(everything=True))
    checked_at: float = float("-inf")
    #: node -> online (as placement, as statuses see it), as the last acting pass saw it
    online: dict[str, Any] = field(default_factory=dict)
    #: the plan the index below was built from, and node -> models with a replica placed there
    indexed: Any = None
    models_on: dict[str, set[str]] = field(default_factory=dict)
    #: unfinished rollouts, as the last pass saw them, and the ones that began or ended at this pass
    rolling: set[str] = field(default_factory=set)
    rolling_changed: set[str] = field(default_factory=set)
    #: models with a replica the traffic director tracks as hot (looked at every pass)
    director_hot: set[str] = field(default_factory=set)
    #: model -> its count before any floor (the autoscaler's, or the spec's), and the models that can scale
    counts: dict[str, int] = field(default_factory=dict)
    scalable: set[str] = field(default_factory=set)
    #: node -> replica id -> its placement, and sorted (``by_node``); model -> its placed replica ids
    held_on: dict[str, dict[str, Any]] = field(default_factory=dict)
    sorted_on: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    ids_of: dict[str, set[str]] = field(default_factory=dict)
    #: what the last passes planned and the topics do not hold (a standby's: the leader did not publish it yet);
    #: kept in scope until they agree; empty once a leader published its pass
    unsynced_nodes: set[str] = field(default_factory=set)
    unsynced_models: set[str] = field(default_factory=set)
    checks: int = 0
    mismatches: int = 0
    last_mismatch: str = ""

    def begin(self, taken: Changes, now: float, check_every_s: float, rolling: set[str] | None,
              force_full: bool, continues: bool = False) -> PassScope:
        """This pass's scope from the journal (the module's table); the pending changes are consumed."""
        changes, self.pending = self.pending.merge(taken), Changes()
        # due, and not on a pass carrying an operator's apply (it would wait behind the check) unless overdue
        overdue = now - self.checked_at
        check = overdue >= check_every_s and (not changes.applied or overdue >= 2 * check_every_s)
        full = changes.everything or rolling is None or force_full or check
        if check:
            self.checked_at = now
        models = set(changes.models)
        if rolling is not None:
            self.rolling_changed = self.rolling ^ rolling
            models |= rolling | self.rolling_changed
            self.rolling = set(rolling)
        for node in changes.nodes:
            models |= self.models_on.get(node, set())
        return PassScope(full, models, set(changes.gpus), set(changes.signals), set(changes.specs),
                         check and not force_full and not changes.everything, continues and not full)

    def published_all(self) -> None:
        """A leader published its pass: the topics hold what it planned."""
        self.unsynced_nodes, self.unsynced_models = set(), set()

    def keep(self, taken: Changes) -> None:
        """A skipped pass's changes wait for the next acting one."""
        self.pending = self.pending.merge(taken)

    def flipped(self, online: Mapping[str, Any]) -> set[str]:
        """The nodes whose online state differs from the last acting pass's (remembered)."""
        out = {n for n, up in online.items() if self.online.get(n) != up} | (set(self.online) - set(online))
        self.online = dict(online)
        return out

    def placed_on(self, nodes: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for n in nodes:
            out |= self.models_on.get(n, set())
        return out

    def index(self, plan: PlacementPlan, delta: tuple[Mapping[str, Any], Mapping[str, Any], frozenset[str]] | None = None
              ) -> tuple[set[str], set[str]]:
        """Follow ``plan``'s placements by node and by model, updated by what changed since the last indexed plan
        (a pass that keeps its plan changes nothing here): (the models whose placements or unplaced replicas
        differ, the nodes whose placements differ); all of them the first time.  Sets ``plan.by_node``.
        ``delta``: ``Replanner.delta``; when it leads from the last indexed plan to this one, only the replica ids
        it names are compared."""
        placements, unplaced = plan.placements, dict(plan.unplaced)
        before_u = self.indexed[2] if self.indexed is not None else {}
        if self.indexed is not None and self.indexed[0] is placements:
            self.indexed = (placements, self.indexed[1], unplaced)
            self._by_node(plan)
            return _differ(before_u, unplaced), set()
        before: dict[str, Any] = self.indexed[1] if self.indexed is not None else {}
        moved: list[tuple[Any, Any]]
        if delta is not None and self.indexed is not None and delta[0] is self.indexed[0] and delta[1] is placements:
            moved = [(w, p) for rid in delta[2] if (w := before.get(rid)) is not (p := placements.get(rid)) and w != p]
            copy = before  # this index's own copy, brought up to ``placements``
            for rid in delta[2]:
                p = placements.get(rid)
                if p is None:
                    copy.pop(rid, None)
                else:
                    copy[rid] = p
        else:
            moved = [(before.get(rid), p) for rid, p in placements.items() if (w := before.get(rid)) is not p and w != p]
            moved += [(p, None) for rid, p in before.items() if rid not in placements]
            copy = dict(placements)
        nodes: set[str] = set()
        models: set[str] = set()
        for old, new in moved:
            if old is not None:
                self.held_on.get(old.node, {}).pop(old.replica_id, None)
                self.ids_of.get(old.model, set()).discard(old.replica_id)
                nodes.add(old.node)
                models.add(old.model)
            if new is not None:
                self.held_on.setdefault(new.node, {})[new.replica_id] = new
                self.ids_of.setdefault(new.model, set()).add(new.replica_id)
                nodes.add(new.node)
                models.add(new.model)
        for node in nodes:
            held = self.held_on.get(node, {})
            self.sorted_on[node] = tuple(held[rid] for rid in sorted(held))
            self.models_on[node] = {p.model for p in held.values()}
        self.indexed = (placements, copy, unplaced)
        self._by_node(plan)
        return models | _differ(before_u, unplaced), nodes

    def _by_node(self, plan: PlacementPlan) -> None:
        """``plan.by_node`` from the followed placements (every inventory node present, as ``by_node`` has it)."""
        by_node = {n.name: self.sorted_on.get(n.name, ()) for n in plan.inventory.nodes}
        by_node.update((k, v) for k, v in self.sorted_on.items() if v)
        plan.__dict__["by_node"] = MappingProxyType(by_node)

    def replica_ids(self, plan: PlacementPlan) -> Mapping[str, Collection[str]]:
        """model -> its replica ids in ``plan`` (the followed placed ones, and the unplaced)."""
        if not plan.unplaced:
            return self.ids_of
        ids: dict[str, Collection[str]] = dict(self.ids_of)
        for rid, u in plan.unplaced.items():
            ids[u.model] = [*ids.get(u.model, ()), rid]
        return ids

    def mismatch(self, what: str, names: Iterable[str]) -> None:
        """The check found kept state that differs from the one derived from scratch (it is repaired)."""
        names = sorted(names)
        self.mismatches += 1
        self.last_mismatch = f"{what}: {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        log.warning("incremental reconcile: %s differed from a pass from scratch; repaired", self.last_mismatch)

    def health(self) -> dict[str, Any]:
        return {"checks": self.checks, "mismatches": self.mismatches, "last_mismatch": self.last_mismatch or None}


def _differ(before: Mapping[str, Any], after: Mapping[str, Any]) -> set[str]:
    """The models of the replica ids whose entry (a placement, an unplaced replica) differs between the two."""
    out = {v.model for rid, v in after.items() if (w := before.get(rid)) is not v and w != v}
    out |= {v.model for rid, v in before.items() if rid not in after}
    return out
