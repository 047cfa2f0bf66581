"""When a pass may act, and what a new term continues from (the model statuses last published).

A pass (``Controller.reconcile``)::

    new term = term.begin(leader, epoch)       # won, or won again: forget what an earlier term of ours kept
    wait = stale_reason(view, snap, now, node_timeout_s) or takeover.not_loaded(epoch)
    if wait: skip the pass
    on a new term's first acting pass:
        published statuses, unschedulable reasons, cool-downs = seed_term(statuses, exclusions)
            statuses = the ones a standby followed (its passes parse each changed model-status record), or
                       parse_statuses(model-status records) when this instance was not a standby last pass
    autoscaler counts  = seed_decisions(model-status records)    (a new term; a standby every pass)
    director's floors  = seed_director_floors(model-status records) (a new term; a standby every pass)

A new leader's first pass changes no assignment its predecessor published: each of these was published in the
same transaction as the assignments it shaped (docs/control-plane.md, "What a new leader loads before it acts";
tests/control/test_takeover_unit.py walks every rollout phase).

==========================================  ============================================================
record (of a model's ``ModelStatus``)       unreadable
==========================================  ============================================================
the status itself                           logged; the status is published again
``autoscale`` (the autoscaler's decision)   logged; the model's autoscaling starts afresh
``director`` (the director's floor)         logged; the model starts without a floor
==========================================  ============================================================

Pure functions over the records read from the model-status topic (the caller copies them under the state's
lock) and ``now``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.cooldowns import Cooldown, Exclusions
from sie.control.reconcile.director import Extra
from sie.control.reconcile.ports import StateView
from sie.control.reconcile.records import StateSnapshot
from sie.control.reconcile.status import ModelStatus
from sie.schemas.replica_state import ReplicaState

log = logging.getLogger(__name__)

#: model -> its ModelStatus record as the model-status topic holds it
StatusRecords = Mapping[str, Mapping[str, Any]]


@dataclass
class Term:
    """What this instance knows of its own term: which one it leads, and what its passes seeded from the topics
    so far (a new term seeds each again, from what its predecessor published)."""

    #: the leader epoch of this instance's current term (None: not leading); whether the last pass led
    epoch: int | None = None
    led_last_pass: bool = False
    #: the term's first acting pass seeded the statuses, cool-downs and reports last published (``seed_term``)
    seeded: bool = False
    #: the autoscaler's decisions and the director's floors were seeded (a standby seeds them every pass)
    decisions_seeded: bool = False
    director_seeded: bool = False
    #: a move its predecessor published goes on (``Rebalancer.adopt``), once, on the term's first acting pass
    adopt_move: bool = False

    def begin(self, leader: bool, epoch: int) -> bool:
        """One pass's leadership: True when it begins a new term (also one won again between two passes)."""
        new = leader and (not self.led_last_pass or epoch != self.epoch)
        if new:
            self.seeded = self.decisions_seeded = self.director_seeded = False
        self.led_last_pass, self.epoch = leader, epoch if leader else None
        return new


def stale_reason(view: StateView, snap: StateSnapshot, now: float, timeout_s: float) -> str | None:
    """Why a pass must not act on ``snap`` (``controller`` docstring), or None: the state reader is not caught
    up, died or stalled; or it caught up less than ``timeout_s`` ago and a node of the replayed heartbeats was
    not heard live since (replayed heartbeats are history)."""
    stale = view.stale_reason()
    if stale is not None:
        return stale
    caught_up_at = view.caught_up_at
    if caught_up_at is None:
        return "state reader not caught up"
    if now < caught_up_at + timeout_s:
        unheard = sorted(n for n in snap.heartbeats if n in snap.nodes and not snap.heard_live(n, now, timeout_s))
        if unheard:
            shown = ", ".join(unheard[:10]) + (f" and {len(unheard) - 10} more" if len(unheard) > 10 else "")
            return (f"caught up {now - caught_up_at:.1f}s ago; waiting up to {caught_up_at + timeout_s - now:.1f}s "
                    f"for a live heartbeat of {shown} before judging liveness")
    return None


def seed_decisions(records: StatusRecords, now: float) -> dict[str, ScaleDecision]:
    """The autoscaler's decisions last published: a new leader, or a standby, continues from them instead of
    starting every model at its minimum."""
    decisions: dict[str, ScaleDecision] = {}
    for name, status in records.items():
        rec = status.get("autoscale")
        if rec:
            try:
                decisions[name] = ScaleDecision.from_record(rec, now)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("autoscale state of %s unreadable (starting it afresh): %s", name, exc)
    return decisions


def seed_director_floors(records: StatusRecords, snap: StateSnapshot) -> dict[str, Extra]:
    """The director's floors as last published (``ModelStatus.director``, in the same transaction as the
    assignments that hold them), of models still applied: a new leader keeps the replica the director added
    instead of removing it, and a standby's view counts it like the leader's.  WHY not re-derived from the
    assignments alone: a model's replicas beyond the autoscaler's count could also be a count the old leader was
    about to lower, and the floor's ``since``/``cool_since`` (its hysteresis) are not in them."""
    floors: dict[str, Extra] = {}
    for name, status in records.items():
        rec = status.get("director")
        if rec and name in snap.specs:
            try:
                floors[name] = Extra.from_record(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("traffic director floor of %s unreadable (starting without it): %s", name, exc)
    return floors


def parse_statuses(records: StatusRecords) -> dict[str, ModelStatus]:
    """The statuses of the model-status records (one unreadable is left out: the table)."""
    published: dict[str, ModelStatus] = {}
    for name, rec in records.items():
        try:
            published[name] = ModelStatus.from_record(rec)
        except Exception as exc:
            log.warning("model status of %s unreadable (it is published again): %s", name, exc)
    return published


def seed_term(published: Mapping[str, ModelStatus], exclusions: Exclusions, now: float, cooldown_s: float
              ) -> tuple[dict[str, ModelStatus], dict[str, str], dict[tuple[str, str], Cooldown]]:
    """What a new term continues from, of the statuses last published (``parse_statuses``): (the statuses,
    compared with which nothing is re-published without a change; the unschedulable reasons, not announced
    again; ``exclusions`` with their replicas' running cool-downs added).  WHY the cool-downs: a standby's passes
    built the same from FAILED reports, but a fresh process replays only those of replicas still on that node: a
    replica FAILED on node-a and moved to node-b would otherwise be free to go back within its cool-down."""
    reported: dict[str, str] = {}
    seeded = dict(exclusions)
    for status in published.values():
        for view in status.replicas:
            if view.state == ReplicaState.UNSCHEDULABLE and view.reason:
                reported[view.replica_id] = view.reason
            for cd in view.cooldowns:
                until = int(cd["until_ms"]) / 1000.0
                key = (view.replica_id, str(cd["node"]))
                if until > now and key not in seeded:
                    # since: the FAILED report (until = report + cooldown_s), for cooldowns.clear
                    seeded[key] = Cooldown(until, str(cd["reason"]), view.model, until - cooldown_s)
    return dict(published), reported, seeded
