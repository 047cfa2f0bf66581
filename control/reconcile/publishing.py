"""Steps 6 and 7 of a pass: the model statuses to publish, and what this term published.

One pass::

    published = published_view(snap.assignments, mine)       # the topic, overlaid with what this term published
    statuses, records = model_statuses(snap, plan, ...)       # a ModelStatus record only when it changed
    publish(stamp(records, epoch, now))                       # one transaction, only while leading
    mine, statuses_published = remembered(records, ...)       # until the state reads them back

=======================================  ===================================================================
record                                   stamped at publish time
=======================================  ===================================================================
``assignments`` (not a tombstone)        ``epoch`` (the leader's) and ``issued_at_ms`` (the pass's ``now``)
``model-status`` (not a tombstone)       ``epoch``
anything else                            as made
=======================================  ===================================================================

Pure functions over the snapshot, the plan and values; what this term published is the ``Controller``'s,
passed in and returned.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sie.control.placement.engine import PlacementPlan
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.director import Extra
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import AssignmentInfo, StateSnapshot, assignment_from_record
from sie.control.reconcile.status import ModelStatus, build_status


def published_view(assignments: Mapping[str, AssignmentInfo], mine: Mapping[str, AssignmentInfo]
                   ) -> tuple[dict[str, AssignmentInfo], dict[str, AssignmentInfo]]:
    """(the last published assignment per node, what of ``mine`` the topic has not read back yet):
    ``assignments`` (the topic) overlaid with ``mine`` (what this term published)."""
    view = dict(assignments)
    pending = dict(mine)
    for node, info in mine.items():
        theirs = view.get(node)
        if theirs is not None and theirs.replicas == info.replicas:
            del pending[node]  # read back: the topic agrees
        view[node] = info
    return view, pending


def model_statuses(snap: StateSnapshot, plan: PlacementPlan, now: float, timeout_s: float, epoch: int,
                   cooldowns: Mapping[str, list[dict[str, Any]]], decisions: Mapping[str, ScaleDecision],
                   floors: Mapping[str, Extra], published: Mapping[str, ModelStatus],
                   names: Collection[str] | None = None, previous: Mapping[str, ModelStatus] | None = None,
                   ids: Mapping[str, Collection[str]] | None = None) -> tuple[dict[str, ModelStatus], list[OutRecord]]:
    """Every applied (or refused) model's ``ModelStatus`` with its autoscaler decision and director floor, and
    a record for each that differs from the ``published`` one (a tombstone for each model gone).  ``names``:
    build only these, keep the others' from ``previous`` (``incremental``); ``ids``: model -> its replica ids
    in ``plan`` when the caller grouped them."""
    if ids is None:
        grouped: dict[str, list[str]] = {}  # model -> its replicas in the plan (one sweep, not one per model)
        for rid, p in plan.placements.items():
            grouped.setdefault(p.model, []).append(rid)
        for rid, u in plan.unplaced.items():
            grouped.setdefault(u.model, []).append(rid)
        ids = grouped
    statuses: dict[str, ModelStatus] = {}
    out: list[OutRecord] = []
    if names is None or previous is None:
        todo = sorted(set(snap.specs) | set(snap.spec_errors))
    elif not names:  # nothing in scope: the last statuses, as they are (never changed in place)
        return previous if isinstance(previous, dict) else dict(previous), out
    else:
        statuses = dict(previous)
        todo = sorted(names)
        for name in todo:
            statuses.pop(name, None)
        todo = [n for n in todo if n in snap.specs or n in snap.spec_errors]
    for name in todo:
        statuses[name] = build_status(name, snap.specs.get(name), snap.spec_errors.get(name), plan, snap, now,
                                      timeout_s, epoch, cooldowns, ids.get(name, ()))
        decision = decisions.get(name)
        if decision is not None and name in snap.specs:
            statuses[name] = replace(statuses[name], autoscale=decision.to_record())
        extra = floors.get(name)
        if extra is not None and name in snap.specs:
            statuses[name] = replace(statuses[name], director=extra.to_record())
        if not statuses[name].same_as(published.get(name)):
            out.append(OutRecord("model-status", name, "ModelStatus", statuses[name].to_record()))
    if names is not None and previous is not None:
        # a model deleted is in ``names`` (its spec record was read): its published status is tombstoned
        gone = [n for n in names if n in published and n not in statuses]
    else:
        gone = sorted(set(published) - set(statuses))
    for name in sorted(gone):
        out.append(OutRecord("model-status", name, "ModelStatus", None))
    return statuses, out


def stamp(records: Sequence[OutRecord], epoch: int, now: float) -> list[OutRecord]:
    """``records`` as published: stamped with the leader's epoch (table)."""
    stamped = []
    for r in records:
        if r.topic == "assignments" and r.value is not None:
            r = OutRecord(r.topic, r.key, r.record, {**r.value, "epoch": epoch, "issued_at_ms": int(now * 1000)})
        elif r.topic == "model-status" and r.value is not None:
            r = OutRecord(r.topic, r.key, r.record, {**r.value, "epoch": epoch})
        stamped.append(r)
    return stamped


def remembered(records: Sequence[OutRecord], statuses: Mapping[str, ModelStatus], epoch: int,
               mine: Mapping[str, AssignmentInfo], status_published: Mapping[str, ModelStatus]
               ) -> tuple[dict[str, AssignmentInfo], dict[str, ModelStatus]]:
    """What this term published once ``records`` are: (assignment per node, until the topic reads it back;
    status per model, what the next pass compares with)."""
    mine, status_published = dict(mine), dict(status_published)
    for r in records:
        if r.topic == "assignments" and r.value is not None:
            mine[r.key] = assignment_from_record({**r.value, "epoch": epoch})
        elif r.topic == "model-status":
            if r.value is None:
                status_published.pop(r.key, None)
            elif r.key in statuses:
                status_published[r.key] = statuses[r.key]
    return mine, status_published
