"""The autoscaler: how many replicas each model should have, from its backlog and its latency.

A pure function, ``decide(inputs, signals, previous, now, policy) -> ScaleDecision``: no I/O, no clock of
its own.  The controller calls it once per model and reconcile pass (leader only); what it returns is the
replica count the placement pass places, and it is published with the model's status on the compacted
``model-status`` topic (``AutoscaleStatus``), so a new leader continues from the last decision (cool-down
timers, learned capacity, wake time) instead of starting over.

WHY backlog and not GPU utilisation (the design's operations chapters): requests wait in the model's
request topic, so the scorer group's lag (records appended but not yet committed) is exactly the queue,
and committed offsets advance only when results commit (exactly-once: offsets and results in one
transaction), so their rate is the measured throughput.  Utilisation says little about either: a
replica can be 100 % busy and keep up, or 30 % busy and fall behind on I/O.

The rules, in the order they are checked (each decision carries the numbers behind it):

1. **Bounds.**  ``min_replicas .. max_replicas`` from the spec; a P0 model never goes below 1 (it is
   never scaled to zero, whatever its spec says).  ``min == max``: the count is fixed, nothing is measured.
2. **Hold** without acting when a rollout of the model is in progress (``ModelInputs.rollout``, from the
   control plane's rollouts: no scaling fights with a rollout), when there is no backlog signal, or when the signal is
   older than ``signal_max_age_s`` (no component acts on a view it knows is stale).
3. **Blocked.**  Replicas added by a scale-up that could not be placed (no node has room) are reported
   once and taken back: the count falls to what is placed and no scale-up is tried again for
   ``blocked_retry_s`` (no hot loop of unschedulable events).  Replicas below ``min_replicas`` are never
   taken back: they stay unschedulable with the placement engine's reason.
4. **Wake from zero.**  A model at zero replicas with records waiting gets replicas at once (the cold
   first request the design accepts for long-tail models); the time from waking to the first committed
   result is recorded (``first_result_ms``, shown by ``sie describe model``).  A wake that could not be
   placed (rule 3 took it back to zero) is not tried again until ``blocked_retry_s`` has passed (no
   wake / blocked / take-back cycle every other pass).
5. **Up, fast.**  ``capacity`` = records/s one READY replica commits while it has a backlog (learned from
   the signal windows in which the replicas had work queued throughout, ``ModelSignals.busy``; an EWMA).
   Until such a window was seen (a model that never had a backlog), the replicas' own inference throughput
   stands in for it (records per second spent in ``infer``, reported with their heartbeats): optimistic,
   since commits and polling are not in it, so the first decision may add too few and the measured
   capacity then adds the rest, but it lets the first decision that sees a backlog size the fleet.  The replicas needed are
   ``ceil((arrivals / target_utilisation + lag / budget) / capacity)``: keep up with arrivals with
   headroom AND drain the backlog within the budget (``max_queue_time_ms x drain_budget_fraction``;
   half by default so records are served before the scorer expires them).  More needed than desired ->
   that many at once (capped at ``max_replicas`` and at the request topic's partition count: a replica
   beyond it would get no partition).  Capacity not known yet and the backlog does not shrink although every
   replica is READY -> double, at most once per ``up_settle_s``.  Latency: p99 above the SLA's ``p99_latency_ms`` while the backlog grows ->
   one more, at most once per ``up_settle_s``.
6. **Down, slowly.**  One step per ``cooldown_s`` (since the last change either way), only when the
   replicas left would still be enough by rule 5 and p99 is within the SLA.  The last step to zero
   (``min_replicas: 0``, never P0) also needs ``idle_to_zero_s`` without arrivals or backlog.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

#: actions that change the replica count (an event each)
SCALING_ACTIONS = frozenset({"up", "down", "to_zero", "wake", "blocked", "bounds"})


def policy_numbers(cls: type, doc: Mapping[str, Any] | None, where: str) -> dict[str, float]:
    """The numeric fields of the policy dataclass ``cls`` from a config mapping: an unknown key or a value
    that is not a number is a ``ConfigError`` naming ``<where>.<key>`` (control.autoscale, director ...)."""
    from dataclasses import fields

    from sie.kernel.errors import ConfigError

    known = {f.name for f in fields(cls)}
    values: dict[str, float] = {}
    for key, value in (doc or {}).items():
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown (known: {', '.join(sorted(known))})")
        try:
            if isinstance(value, bool):
                raise TypeError(value)
            values[key] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{key}: must be a number (got {value!r})") from None
    return values


@dataclass(frozen=True)
class AutoscalePolicy:
    """The autoscaler's parameters (``control.autoscale`` in control-plane-config.yaml; docs/elasticity.md)."""

    #: scale down at most one replica per this many seconds since the last change (the design: ~5 min)
    cooldown_s: float = 300.0
    #: a ``min_replicas: 0`` model with no arrivals and no backlog this long stops its last replica
    idle_to_zero_s: float = 300.0
    #: drain budget of a spec without ``sla.max_queue_time_ms``
    drain_budget_s: float = 30.0
    #: share of ``max_queue_time_ms`` the backlog may take to drain (the rest is margin before records expire)
    drain_budget_fraction: float = 0.5
    #: replicas are sized so arrivals use at most this share of their measured capacity
    target_utilisation: float = 0.8
    #: a backlog signal older than this is stale: hold
    signal_max_age_s: float = 10.0
    #: heuristic step-ups (capacity unknown, latency over SLA) at most this often
    up_settle_s: float = 15.0
    #: after added replicas could not be placed, no scale-up above the placed count for this long
    blocked_retry_s: float = 60.0
    #: weight of the newest capacity sample in the running estimate
    capacity_alpha: float = 0.5

    def __post_init__(self) -> None:
        from sie.kernel.errors import ConfigError

        for name in ("cooldown_s", "idle_to_zero_s", "drain_budget_s", "signal_max_age_s", "up_settle_s",
                     "blocked_retry_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"control.autoscale.{name}: must be >= 0 (got {getattr(self, name)})")
        for name in ("drain_budget_fraction", "target_utilisation", "capacity_alpha"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"control.autoscale.{name}: must be > 0 and <= 1 (got {value})")


@dataclass(frozen=True)
class ModelSignals:
    """A model's backlog as last sampled (``signals.BacklogSampler``): the scorer group's committed offsets
    against the request topic's ends.  ``arrival_rate``/``drain_rate`` are records/s over the window since the
    previous sample; ``busy``: the replicas had work queued all through it (so the drain rate is what they
    can do, not merely what arrived)."""

    at: float
    lag: int | None
    partitions: int = 0
    arrival_rate: float | None = None
    drain_rate: float | None = None
    busy: bool = False
    window_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class ModelInputs:
    """What the controller knows about one model this pass."""

    name: str
    priority: str
    min_replicas: int
    max_replicas: int
    max_queue_time_ms: float | None = None
    p99_latency_ms: float | None = None
    #: replicas its agents report READY now
    ready: int = 0
    #: replicas of the last plan with / without a node
    placed: int = 0
    unplaced: int = 0
    unplaced_reason: str | None = None
    #: the highest p99 (ms) its READY replicas report (None: none reported)
    p99_ms: float | None = None
    #: records per second of inference time its READY replicas report, averaged (None: none reported)
    inference_rps: float | None = None
    #: why a rollout holds scaling (None: no rollout in progress)
    rollout: str | None = None


@dataclass(frozen=True)
class ScaleDecision:
    """The replica count of one model, why, and the state the next decision continues from."""

    desired: int
    action: str
    reason: str
    at: float
    last_scale_at: float
    last_active_at: float
    capacity: float | None = None
    blocked_until: float | None = None
    woke_at: float | None = None
    first_result_ms: float | None = None
    #: the signal sample this decision used (a sample is learned from once)
    sample_at: float | None = None
    lag: int | None = None
    arrival_rate: float | None = None
    drain_rate: float | None = None
    drain_time_s: float | None = None
    budget_s: float | None = None
    p99_ms: float | None = None
    needed: int | None = None

    @property
    def scaled(self) -> bool:
        return self.action in SCALING_ACTIONS

    def to_record(self) -> dict[str, Any]:
        """The Avro ``AutoscaleStatus`` record (times in ms; the JSON the API shows)."""

        def ms(t: float | None) -> int | None:
            return None if t is None else int(t * 1000)

        return {
            "desired": self.desired, "action": self.action, "reason": self.reason,
            "decided_at_ms": int(self.at * 1000), "last_scale_at_ms": int(self.last_scale_at * 1000),
            "capacity_per_replica": _finite(self.capacity), "blocked_until_ms": ms(self.blocked_until),
            "woke_at_ms": ms(self.woke_at), "first_result_ms": _finite(self.first_result_ms),
            "lag": self.lag, "arrival_rate": _finite(self.arrival_rate), "drain_rate": _finite(self.drain_rate),
            "drain_time_s": _finite(self.drain_time_s), "budget_s": _finite(self.budget_s),
            "p99_ms": _finite(self.p99_ms), "needed": self.needed,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], now: float) -> ScaleDecision:
        """A decision published by an earlier leader.  Its idle timer restarts at ``now``: the last proof of
        traffic is not persisted (it changes every pass), and restarting it can only delay a scale-to-zero."""

        def sec(v: Any) -> float | None:
            return None if v is None else float(v) / 1000.0

        return cls(
            desired=int(rec["desired"]), action=str(rec.get("action") or "hold"), reason=str(rec.get("reason") or ""),
            at=sec(rec.get("decided_at_ms")) or now, last_scale_at=sec(rec.get("last_scale_at_ms")) or now,
            last_active_at=now, capacity=rec.get("capacity_per_replica"), blocked_until=sec(rec.get("blocked_until_ms")),
            woke_at=sec(rec.get("woke_at_ms")), first_result_ms=rec.get("first_result_ms"), lag=rec.get("lag"),
            arrival_rate=rec.get("arrival_rate"), drain_rate=rec.get("drain_rate"), drain_time_s=rec.get("drain_time_s"),
            budget_s=rec.get("budget_s"), p99_ms=rec.get("p99_ms"), needed=rec.get("needed"),
        )


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}/s" if value >= 10 else f"{value:.1f}/s"


def _secs(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "never at the current capacity"
    return f"{value:.1f}s"


def bounds(inputs: ModelInputs) -> tuple[int, int, str]:
    """(lowest, highest, note): P0 never below one replica."""
    lo, note = inputs.min_replicas, ""
    if inputs.priority == "P0" and lo < 1:
        lo, note = 1, " (a P0 model is never scaled to zero)"
    return lo, max(inputs.max_replicas, lo), note


def budget_of(inputs: ModelInputs, policy: AutoscalePolicy) -> float:
    """Seconds the backlog may take to drain."""
    if inputs.max_queue_time_ms:
        return inputs.max_queue_time_ms / 1000.0 * policy.drain_budget_fraction
    return policy.drain_budget_s


#: what a hold for a rollout says; its text (the rollout's step) is part of the published decision
#: (``status._decision_identity``): otherwise the status kept the phase of the step the hold began in
ROLLOUT_HOLD = "rollout in progress"


def decide(inputs: ModelInputs, signals: ModelSignals | None, previous: ScaleDecision | None, now: float,
           policy: AutoscalePolicy = AutoscalePolicy()) -> ScaleDecision:
    """The replica count of ``inputs.name`` now (module docstring: the rules, in order)."""
    lo, hi, floor_note = bounds(inputs)
    if previous is None:
        previous = ScaleDecision(lo, "init", f"starting at min_replicas {lo}{floor_note}", now, now, now)
        if lo == hi:
            return replace(previous, action="fixed", reason=f"min_replicas = max_replicas = {lo}{floor_note}")
    current = min(max(previous.desired, lo), hi)
    blocked_until = previous.blocked_until if previous.blocked_until is not None and previous.blocked_until > now else None
    base = replace(previous, at=now, blocked_until=blocked_until)

    def hold(reason: str, **changes: Any) -> ScaleDecision:
        return replace(base, desired=current, action="hold", reason=reason, **changes)

    def scale(target: int, action: str, reason: str, **changes: Any) -> ScaleDecision:
        return replace(base, desired=target, action=action, reason=reason, last_scale_at=now, **changes)

    if current != previous.desired:
        return scale(current, "bounds", f"spec bounds are {lo}..{hi}{floor_note}: {previous.desired} -> {current}")
    if lo == hi:
        return replace(base, desired=lo, action="fixed", reason=f"min_replicas = max_replicas = {lo}{floor_note}")
    if inputs.rollout:
        return hold(f"holding at {current}: {ROLLOUT_HOLD} ({inputs.rollout})")
    if signals is None:
        return hold(f"holding at {current}: no backlog signal yet")
    if signals.lag is None:
        return hold(f"holding at {current}: backlog unreadable ({signals.error or 'unknown error'})")
    age = now - signals.at
    if age > policy.signal_max_age_s:
        return hold(f"holding at {current}: backlog signal is {age:.0f}s old (> {policy.signal_max_age_s:g}s); "
                    "not acting on a stale view")

    # -- what the signal says -----------------------------------------------------------------------
    lag = signals.lag
    arrivals = signals.arrival_rate or 0.0
    drained = signals.drain_rate or 0.0
    measured = previous.capacity
    fresh = signals.at != previous.sample_at
    if fresh and signals.busy and inputs.ready > 0 and drained > 0:
        sample = drained / inputs.ready
        measured = sample if measured is None else policy.capacity_alpha * sample + (1 - policy.capacity_alpha) * measured
    capacity = measured or inputs.inference_rps
    source = "measured" if measured else "inference time, reported" if capacity else "unknown"
    active = lag > 0 or arrivals > 0
    last_active = now if active else previous.last_active_at
    first_ms = previous.first_result_ms
    if previous.woke_at is not None and first_ms is None and drained > 0 and signals.at > previous.woke_at:
        first_ms = (signals.at - previous.woke_at) * 1000.0  # the first result committed within this window
    budget = budget_of(inputs, policy)
    serving = inputs.ready * capacity if capacity else 0.0
    net = serving - arrivals
    drain_time = 0.0 if lag == 0 else (lag / net if net > 0 else math.inf)
    if lag == 0 and arrivals == 0:
        needed: int | None = 0
    elif capacity:
        needed = math.ceil((arrivals / policy.target_utilisation + lag / budget) / capacity)
    else:
        needed = None
    limit, limit_note = hi, ""
    if signals.partitions and signals.partitions < hi:
        limit = max(lo, signals.partitions)
        limit_note = f" (capped at the request topic's {signals.partitions} partitions)"
    base = replace(base, capacity=measured, last_active_at=last_active, first_result_ms=first_ms,
                   sample_at=signals.at, lag=lag, arrival_rate=arrivals, drain_rate=drained, drain_time_s=drain_time,
                   budget_s=budget, p99_ms=inputs.p99_ms, needed=needed)
    facts = (f"lag {lag}, arrivals {_rate(arrivals)}, capacity {_rate(capacity)} per replica ({source}) x "
             f"{inputs.ready} ready, "
             f"drain time {_secs(drain_time)} vs budget {budget:g}s")

    # -- blocked: added replicas that found no node -----------------------------------------------------
    floor = max(lo, inputs.placed)
    if inputs.unplaced and current > floor:
        return scale(floor, "blocked", f"{inputs.unplaced} added replica(s) could not be placed "
                     f"({inputs.unplaced_reason or 'no room'}): back to the {floor} placed; no scale-up for "
                     f"{policy.blocked_retry_s:g}s", blocked_until=now + policy.blocked_retry_s)

    # -- wake from zero ---------------------------------------------------------------------------------
    if current == 0:
        if lag > 0 and blocked_until is not None:
            # the last wake found no node (rule 3 took it back): waking again at once would repeat
            # wake -> unschedulable -> blocked on every other pass; the blocked window holds the wake too
            return hold(f"scaled to zero with {lag} record(s) waiting: the last wake could not be placed (its "
                        f"scale_blocked event says why); retrying in {blocked_until - now:.0f}s")
        if lag > 0:
            target = min(limit, max(1, needed or 1))
            return scale(target, "wake", f"{lag} record(s) waiting with no replica: starting {target} "
                         "(cold first request)", woke_at=now, first_result_ms=None)
        return hold("scaled to zero: no records waiting")

    # -- up, fast ---------------------------------------------------------------------------------------
    settled = now - previous.last_scale_at >= policy.up_settle_s
    if lag > 0 and (needed is None or needed > current):
        if needed is not None:
            target, why = needed, f"{needed} needed ({facts})"
        elif settled and inputs.ready >= current and (previous.lag is None or lag >= previous.lag):
            # (only once every replica is READY: a backlog that waits for a starting replica says nothing
            # about capacity, and doubling then just adds more cold starts, e.g. right after a wake from zero)
            target, why = current * 2, f"capacity unknown and the backlog is not shrinking ({facts})"
        else:
            target, why = current, ""
        target = min(target, limit)
        if blocked_until is not None and target > current:
            return hold(f"holding at {current}: added replicas could not be placed; retrying scale-up in "
                        f"{blocked_until - now:.0f}s ({facts})")
        if target > current:
            return scale(target, "up", f"{current} -> {target}: {why}{limit_note if target == limit else ''}")
    over_sla = bool(inputs.p99_latency_ms and inputs.p99_ms is not None and inputs.p99_ms > inputs.p99_latency_ms)
    growing = lag > 0 and previous.lag is not None and lag > previous.lag
    if over_sla and growing and current < limit and blocked_until is None:
        if settled:
            return scale(current + 1, "up", f"{current} -> {current + 1}: p99 {inputs.p99_ms:.0f} ms > SLA "
                         f"{inputs.p99_latency_ms:g} ms and the backlog grows ({previous.lag} -> {lag})")
        return hold(f"holding at {current}: p99 over SLA and backlog growing; last scale-up "
                    f"{now - previous.last_scale_at:.0f}s ago (settle {policy.up_settle_s:g}s)")
    if lag > 0 and needed is not None and needed > current and current >= limit:
        return hold(f"at the limit of {limit}{limit_note or ' (max_replicas)'}: {facts}")

    # -- down, slowly -------------------------------------------------------------------------------------
    if current > lo and needed is not None and needed < current and not over_sla:
        target = current - 1
        waited = now - previous.last_scale_at
        idle_for = now - last_active
        if target == 0 and idle_for < policy.idle_to_zero_s:
            return hold(f"holding at 1: idle for {idle_for:.0f}s; scales to zero after {policy.idle_to_zero_s:g}s idle")
        if waited < policy.cooldown_s:
            return hold(f"holding at {current}: {needed} would do ({facts}); next step down in "
                        f"{policy.cooldown_s - waited:.0f}s (cool-down {policy.cooldown_s:g}s)")
        if target == 0:
            return scale(0, "to_zero", f"1 -> 0: idle for {idle_for:.0f}s (no arrivals, no backlog; "
                         f"min_replicas 0)")
        return scale(target, "down", f"{current} -> {target}: {needed} needed ({facts}); one step per "
                     f"{policy.cooldown_s:g}s cool-down")
    return hold(f"holding at {current}: {facts}")
