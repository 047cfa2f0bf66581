"""`sie delete model NAME --purge`: what a deleted model leaves on Kafka, found and removed.

A model's topics are the ones its spec names (default ``<p>.model.<name>.*``); its groups are its scorer
group (``spec.group_id``) and the redrive groups ``<p>.redrive.<name>.<reason>``.  Groups are deleted only
once empty: the control plane drains the model's replicas when its spec is deleted, so the purge waits (up
to ``timeout``) for the scorer group to empty before deleting anything, and topics go last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


@dataclass(frozen=True)
class PurgePlan:
    model: str
    topics: tuple[str, ...]
    groups: tuple[str, ...]
    scorer_group: str
    from_spec: bool

    def describe(self) -> str:
        origin = "its spec" if self.from_spec else "the default names (the model is not applied)"
        lines = [f"purge of {self.model} ({origin}):"]
        lines += [f"  topic {t}" for t in self.topics] or ["  (no topics)"]
        lines += [f"  group {g}" for g in self.groups] or ["  (no groups)"]
        return "\n".join(lines)


def plan_purge(settings: Settings, model: str, spec: Any | None, timeout: float) -> PurgePlan:
    """The topics and groups of ``model`` that exist now."""
    from sie.kernel.admin import admin_client
    from sie.schemas.request import DLQ_REASONS

    names = settings.names
    if spec is not None:
        t = spec.topics
        candidates, scorer_group = [t.requests, t.results, t.dead_letters, t.backfill], spec.group_id
    else:
        t2 = names.model_topics(model)
        candidates, scorer_group = [t2.requests, t2.results, t2.dead_letters, t2.backfill_results], \
            names.scorer_group(model)
    admin = admin_client(settings)
    existing = admin.list_topics(timeout=timeout).topics
    topics = tuple(t for t in dict.fromkeys(candidates) if t in existing)
    wanted = {scorer_group, *(names.redrive_group(model, reason) for reason in DLQ_REASONS)}
    listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
    groups = tuple(sorted(g.group_id for g in listed.valid if g.group_id in wanted))
    return PurgePlan(model, topics, groups, scorer_group, spec is not None)


def _members(admin: Any, group: str, timeout: float) -> int:
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout=timeout)
    except Exception:  # a group that vanished meanwhile has no members
        return 0
    return len(desc.members)


def run_purge(settings: Settings, plan: PurgePlan, timeout: float) -> list[str]:
    """Wait for the scorer group to empty, delete the groups, then the topics; one line per thing done."""
    from sie.kernel.admin import admin_client, delete_topics

    admin = admin_client(settings)
    out: list[str] = []
    if plan.scorer_group in plan.groups:
        deadline = time.monotonic() + timeout
        while (members := _members(admin, plan.scorer_group, timeout)) and time.monotonic() < deadline:
            time.sleep(0.5)  # the control plane is draining the replicas: poll the group until it is empty
        if members:
            raise SieError(f"group {plan.scorer_group} still has {members} member(s) after {timeout:g}s: a scorer "
                           f"of {plan.model} is still running (a `sie score` outside the cluster?); stop it and run "
                           f"`sie delete model {plan.model} --purge` again")
    if plan.groups:
        futures = admin.delete_consumer_groups(list(plan.groups), request_timeout=timeout)
        for group, fut in futures.items():
            try:
                fut.result(timeout=timeout)
                out.append(f"deleted group {group}")
            except Exception as exc:
                raise SieError(f"deleting group {group}: {exc}; run the purge again") from None
    for topic in delete_topics(settings, list(plan.topics), timeout=timeout):
        out.append(f"deleted topic {topic}")
    return out
