"""Spread restored: replicas moved back toward one per node with planned handovers, one replica of one model at a time.

Anti-affinity is soft (``placement.engine``): when a node is lost its replicas move onto nodes that already hold
replicas of the same model (``anti-affinity relaxed``), and placement then keeps every still-valid placement, so
when the node comes back (or another joins) nothing moves and the next node loss takes more of the model down.
The leader's ``Rebalancer`` moves one replica back per step, never lowering the number of serving replicas:

    candidate = a model with count >= 2 whose placement is "spread" (the default; label
                ``sie.lmsys.org/placement: pack`` opts out), every replica READY, no rollout, no traffic-director
                replica, one node holding 2+ of its replicas (crowded) and an online node holding none (target)
    SURGE   the count gets a floor of count + 1: the extra replica (index = count) is placed, preferring the target;
            wait until it is READY there                       (capacity: count + 1 serving)
    MOVE    keep the floor; the victim (the crowded node's replica with the highest index) is excluded from the
            crowded node and prefers the target: it drains there and starts on the target; wait until it is READY
            off the crowded node                               (capacity never below count: the surge serves)
    SETTLE  floor and exclusion dropped: the surge replica drains (the count is back); the victim keeps its new
            node (placement keeps valid placements)
    each step is a ``rebalance`` event with why; moves start at most one per ``min_interval_s`` cluster-wide, and
    one model at a time

No request is lost or answered twice in any of this: a replica that drains or starts is a member of the model's
consumer group with a transactional producer of its own (``sie.streams.eos``), as on every scale or move; the
planned part is that the replica leaving is replaced by one already READY.

=================================================  ===========================================================
what goes wrong                                    what happens
=================================================  ===========================================================
the surge replica is unschedulable, or lands on a  the move is abandoned (floor dropped: it drains), the model
node that already holds one (the target does not  rests ``backoff_s``, doubling while it keeps failing (at most
fit it)                                            an hour); event ``rebalance`` says so.  Targets are only
                                                   nodes its selector and tier allow
a step does not finish within ``step_timeout_s``   abandoned the same way (the victim stays where it got to)
the model changes meanwhile (spec, count,          abandoned at once: its plan is the rollout's or the
rollout, director, deleted)                        autoscaler's again
the leader changes                                 a new leader adopts the move from the published assignments
                                                   (a replica at index count is a surge: ``adopt``), so its
                                                   first pass changes nothing its predecessor published
=================================================  ===========================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sie.control.placement.demand import asked_placement
from sie.schemas.replica_state import ReplicaState

#: the longest a model rests after moves abandoned in a row (its rest doubles from ``backoff_s``)
MAX_REST_S = 3600.0


@dataclass(frozen=True)
class RebalancePolicy:
    """``control.rebalance`` (docs/control-plane.md, "Spread restored")."""

    enabled: bool = True
    #: seconds between the starts of two moves, cluster-wide (a node coming back does not restart everything at once)
    min_interval_s: float = 10.0
    #: a step (surge READY, victim READY) that takes longer is abandoned
    step_timeout_s: float = 180.0
    #: a model whose move was abandoned is not tried again for this long
    backoff_s: float = 300.0
    #: node tiers whose models pack instead of spreading (the label overrides either way)
    pack_tiers: tuple[str, ...] = ()


@dataclass
class Move:
    model: str
    count: int
    crowded: str
    target: str
    victim: str
    surge: str
    phase: str  # "surge" | "move"
    since: float


@dataclass
class RebalanceOutcome:
    """What this pass adds to placement: count floors, per-replica exclusions and preferred nodes; and events."""

    floors: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, frozenset[str]] = field(default_factory=dict)
    preferred: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str | None, str]] = field(default_factory=list)  # (model, replica id, detail)


def spreads(spec: Any, policy: RebalancePolicy) -> bool:
    """Whether ``spec``'s replicas are spread (moved back toward one per node) rather than packed: as asked
    (``asked_placement``), else spread."""
    asked = asked_placement(spec, policy.pack_tiers)
    return True if asked is None else asked


class Rebalancer:
    """The leader's memory of the move in progress and when the last one started (not published: a new leader
    re-derives the move from the published assignments, ``adopt``)."""

    def __init__(self, policy: RebalancePolicy) -> None:
        self.policy = policy
        self.move: Move | None = None
        self._last_start = float("-inf")
        self._resting: dict[str, float] = {}  # model -> until when it is not tried
        self._failures: dict[str, int] = {}  # model -> moves abandoned in a row
        #: models a scope-limited pass must try again though no record of theirs changes: crowded with no target
        #: yet, resting, held by a rollout or a director replica, or not tried because a move was under way
        self.waiting: set[str] = set()

    def step(self, now: float, specs: Mapping[str, Any], counts: Mapping[str, int], statuses: Mapping[str, Any],
             online: list[str], busy: set[str], eligible: Callable[[str, str], bool] = lambda _m, _n: True,
             names: Collection[str] | None = None) -> RebalanceOutcome:
        """One pass: ``counts`` the models' replica counts before any floor, ``statuses`` the last pass's
        ``ModelStatus`` per model, ``online`` the online nodes, ``busy`` models with a rollout or a director
        replica (never moved), ``eligible(model, node)`` the node's static eligibility (selector, tier).
        ``names``: the models whose inputs changed (None: all); a move is looked for among them and the
        ``waiting`` ones."""
        out = RebalanceOutcome()
        if not self.policy.enabled:
            self.move = None
            return out
        if self.move is not None:
            self._continue(now, specs, counts, statuses, busy, out)
        if self.move is None and now - self._last_start >= self.policy.min_interval_s:
            self._start(now, specs, counts, statuses, online, busy, eligible, out, names)
        elif names is not None:
            self.waiting |= set(names)  # tried when a move may start again
        move = self.move
        if move is not None:
            out.floors[move.model] = move.count + 1
            out.preferred[move.surge] = move.target
            if move.phase == "move":
                out.excluded[move.victim] = frozenset({move.crowded})
                out.preferred[move.victim] = move.target
        return out

    def adopt(self, now: float, specs: Mapping[str, Any], counts: Mapping[str, int],
              placed: Mapping[str, Mapping[str, str]]) -> str | None:
        """A new leader continues the move its predecessor published instead of dropping its surge replica (a
        takeover changes no assignment): ``placed`` is model -> {replica id: node} of the published assignments.
        A replica at index ``count`` is a surge; with a node still crowded the move is in its surge step, else in
        its move step (settled as soon as the replicas are READY).  Returns the model adopted, if any."""
        self.move = None
        for name in sorted(specs):
            count = int(counts.get(name, 0))
            surge = f"{name}-{count}"
            where = placed.get(name, {})
            if count < 2 or surge not in where:
                continue
            mine = {rid: node for rid, node in where.items() if (i := _index(rid, name)) is not None and i < count}
            per_node = Counter(mine.values())
            crowded = next((n for n, k in per_node.most_common() if k >= 2), None)
            if crowded is not None:
                victim = max((rid for rid, n in mine.items() if n == crowded), key=lambda r: _index(r, name) or 0)
                self.move = Move(name, count, crowded, where[surge], victim, surge, "surge", now)
            else:
                victim = next((rid for rid, n in sorted(mine.items()) if n == where[surge]), sorted(mine)[0])
                self.move = Move(name, count, "", where[surge], victim, surge, "move", now)
            self._last_start = now
            return name
        return None

    # -- steps ---------------------------------------------------------------------------------------------------

    def _start(self, now: float, specs: Mapping[str, Any], counts: Mapping[str, int], statuses: Mapping[str, Any],
               online: list[str], busy: set[str], eligible: Callable[[str, str], bool], out: RebalanceOutcome,
               names: Collection[str] | None = None) -> None:
        online = sorted(online)
        considered = sorted(specs) if names is None else sorted(m for m in set(names) | self.waiting if m in specs)
        self.waiting = set()
        for at, name in enumerate(considered):
            if self._resting.get(name, float("-inf")) > now or name in busy:
                self.waiting.add(name)
                continue
            count = int(counts.get(name, 0))
            status = statuses.get(name)
            if count < 2 or status is None or not spreads(specs[name], self.policy):
                continue
            mine = [r for r in status.replicas if (i := _index(r.replica_id, name)) is not None and i < count]
            if len(mine) != count or any(r.state != ReplicaState.READY or not r.node for r in mine):
                continue  # settle first: only a model fully READY is moved (its status changes when it is)
            per_node = Counter(r.node for r in mine)
            crowded, held = per_node.most_common(1)[0]
            if held < 2:
                continue  # one replica per node already: no node is asked whether it could take one
            target = next((n for n in online if per_node.get(n, 0) == 0 and eligible(name, n)), None)
            if target is None:
                self.waiting.add(name)  # a node may come online or free up
                continue
            victim = max((r.replica_id for r in mine if r.node == crowded), key=lambda rid: _index(rid, name) or 0)
            surge = f"{name}-{count}"
            self.move = Move(name, count, crowded, target, victim, surge, "surge", now)
            self._last_start = now
            self.waiting |= set(considered[at + 1:])
            out.events.append((name, surge, f"spread: {held} replicas of {name} on {crowded} while {target} holds "
                                            f"none; moving {victim} there with a planned handover: first {surge} "
                                            f"starts on {target} (READY before anything drains)"))
            return

    def _continue(self, now: float, specs: Mapping[str, Any], counts: Mapping[str, int], statuses: Mapping[str, Any],
                  busy: set[str], out: RebalanceOutcome) -> None:
        move = self.move
        assert move is not None
        if move.model not in specs or move.model in busy or int(counts.get(move.model, 0)) != move.count:
            self._abandon(now, "the model changed (spec, count, rollout or director)", out, rest=False)
            return
        views = {r.replica_id: r for r in getattr(statuses.get(move.model), "replicas", ())}
        if now - move.since > self.policy.step_timeout_s:
            self._abandon(now, f"its {move.phase} step did not finish within {self.policy.step_timeout_s:g}s", out)
            return
        if move.phase == "surge":
            surge = views.get(move.surge)
            if surge is None:
                return  # not in a status yet (the floor was set by the last pass)
            if surge.node is None:  # unschedulable: no node has room for one more (its reason says why)
                self._abandon(now, f"no node has room for {move.surge} ({surge.reason or 'unschedulable'})", out)
                return
            if surge.node != move.target and any(r.node == surge.node for rid, r in views.items() if rid != move.surge):
                self._abandon(now, f"{move.surge} could only be placed on {surge.node}, which holds {move.model} "
                                   f"already ({move.target} does not fit it)", out)
                return
            if surge.state == ReplicaState.READY:
                move.target, move.phase, move.since = surge.node, "move", now
                out.events.append((move.model, move.victim, f"spread: {move.surge} READY on {surge.node}; moving "
                                                            f"{move.victim} off {move.crowded} to {surge.node}"))
            return
        victim = views.get(move.victim)
        if victim is not None and victim.node not in (None, move.crowded) and victim.state == ReplicaState.READY:
            out.events.append((move.model, move.victim, f"spread restored: {move.victim} READY on {victim.node}; "
                                                        f"{move.surge} drains (count back to {move.count})"))
            self._failures.pop(move.model, None)
            self.move = None

    def _abandon(self, now: float, why: str, out: RebalanceOutcome, rest: bool = True) -> None:
        move = self.move
        assert move is not None
        rest_s = min(self.policy.backoff_s * 2 ** self._failures.get(move.model, 0), MAX_REST_S)
        out.events.append((move.model, None, f"spread: moving {move.victim} abandoned: {why}"
                                             + (f"; not tried again for {rest_s:g}s" if rest else "")))
        if rest:  # doubling while it keeps failing (a target that never fits is not retried every backoff_s)
            failures = self._failures[move.model] = self._failures.get(move.model, 0) + 1
            self._resting[move.model] = now + min(self.policy.backoff_s * 2 ** (failures - 1), MAX_REST_S)
        self.move = None


def _index(replica_id: str, model: str) -> int | None:
    head, _, tail = replica_id.rpartition("-")
    return int(tail) if head == model and tail.isdigit() else None
