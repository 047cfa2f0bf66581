"""The traffic director: move load away from a hot replica, with hysteresis, and say why with the numbers.

WHY a pure function (``direct``): what the director does is a rule over a few numbers per replica (GPU
or slot utilisation, queue, p99), time and its own previous state; nothing here reads a clock, Kafka or a
socket, so a test drives it with a fake clock and synthetic signals, and the two places that run it
supply the numbers and apply the outcome:

* **Remote endpoints** (the LLM window's endpoint pool, ``sie.streams.llm``): the lever is the endpoint's
  weight in the pool's weighted rendezvous hashing.  ``weight_multiplier`` scales the configured weight;
  lowering it moves that share of the keys to the other endpoints (only those keys: stickiness holds for
  the rest).
* **In-process scorers** (replicas in one Kafka consumer group): Kafka's group assignment decides each
  replica's share, so there is no weight to turn; the director's lever is a *replica on a cooler node*:
  the decision names the hot replica and the coolest node, and ``replica_lever`` turns it into one more
  replica for the model (an ``Extra``: a floor under the model's replica count) that placement puts on that
  node when it fits there (``placement.engine``'s soft ``preferred`` hint).

The rule (the design's default, ``DirectorPolicy``): a replica is **hot** when its utilisation is above
85 % AND its queue is above 50; hot for ``sustain_s`` -> shift 30 % of its share to the others (weight x
0.7, never below ``min_weight``), provided some other replica is not hot (shifting between hot replicas
only moves the problem).  **Hysteresis**: at most one change per replica per ``hold_s``, and weight comes
back (one step, / 0.7, up to 1) only after the replica stayed **cool** (utilisation below 60 % and queue
below 10: well under the hot thresholds) for ``restore_after_s``.  Between the two bands nothing moves, so
a replica hovering at the threshold does not flap.

**Who owns the replica count** (in-process scorers): the autoscaler decides the model's count from its
signals; the director never changes that decision, it only holds a *floor* (``Extra.floor`` = the count when
it added the replica + 1, never above the spec's maximum) and the controller places ``max(autoscaler's
count, floor)``.  The floor is released by the director's own hysteresis: once EVERY replica of the model
stayed cool for ``restore_after_s`` (and not before ``hold_s`` after it was added).  So neither component
undoes the other: an autoscaler scale-down while the floor holds changes nothing until the release, and a
scale-up above the floor simply makes the floor moot.  One extra replica per model at a time; a model that
stays hot after it is the autoscaler's case (backlog).  While a rollout of the model is in progress the
director neither adds nor releases (a rollout plans with the count it found).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sie.kernel.errors import ConfigError


@dataclass(frozen=True)
class DirectorPolicy:
    hot_utilisation_pct: float = 85.0
    hot_queue: float = 50.0
    shift_fraction: float = 0.3
    cool_utilisation_pct: float = 60.0
    cool_queue: float = 10.0
    sustain_s: float = 5.0
    hold_s: float = 30.0
    restore_after_s: float = 60.0
    min_weight: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.shift_fraction < 1:
            raise ConfigError(f"director.shift_fraction: must be > 0 and < 1 (got {self.shift_fraction})")
        if not 0 < self.min_weight <= 1:
            raise ConfigError(f"director.min_weight: must be > 0 and <= 1 (got {self.min_weight})")
        if self.cool_utilisation_pct > self.hot_utilisation_pct or self.cool_queue > self.hot_queue:
            raise ConfigError("director: the cool thresholds must be at or below the hot ones (the hysteresis band)")
        for name in ("sustain_s", "hold_s", "restore_after_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"director.{name}: must be >= 0 (got {getattr(self, name)})")

    @classmethod
    def from_document(cls, doc: Mapping[str, object] | None) -> DirectorPolicy:
        """``director: {hot_utilisation_pct: 85, ...}`` (numbers only; unknown keys are errors)."""
        from sie.control.reconcile.autoscaler import policy_numbers

        return cls(**policy_numbers(cls, doc, "director"))


@dataclass(frozen=True)
class Signal:
    """One replica (or endpoint) now: utilisation in percent, queue (records or requests waiting), p99 (ms)."""

    name: str
    utilisation_pct: float | None
    queue: float | None
    p99_ms: float | None = None
    node: str | None = None


@dataclass(frozen=True)
class Track:
    """The director's memory of one replica."""

    weight_multiplier: float = 1.0
    hot_since: float | None = None
    cool_since: float | None = None
    changed_at: float | None = None


@dataclass(frozen=True)
class Decision:
    at: float
    name: str
    action: str  # shift_away | restore | add_replica
    weight_before: float
    weight_after: float
    reason: str
    #: ``add_replica``: the cooler node the new replica should go to
    node: str | None = None


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def is_hot(s: Signal, p: DirectorPolicy) -> bool:
    return (s.utilisation_pct is not None and s.queue is not None and s.utilisation_pct > p.hot_utilisation_pct
            and s.queue > p.hot_queue)


def is_cool(s: Signal, p: DirectorPolicy) -> bool:
    return ((s.utilisation_pct is None or s.utilisation_pct < p.cool_utilisation_pct)
            and (s.queue is None or s.queue < p.cool_queue))


def direct(signals: Sequence[Signal], tracks: Mapping[str, Track], now: float, policy: DirectorPolicy = DirectorPolicy(),
           lever: str = "weights") -> tuple[dict[str, Track], list[Decision]]:
    """One look at every replica: the new tracks and the decisions taken (module docstring).
    ``lever``: ``weights`` (remote endpoints) or ``replicas`` (in-process scorers: add a replica elsewhere)."""
    if lever not in ("weights", "replicas"):
        raise ValueError(f"direct: lever must be weights or replicas (got {lever!r})")
    out: dict[str, Track] = {}
    decisions: list[Decision] = []
    hot = {s.name for s in signals if is_hot(s, policy)}
    for s in signals:
        t = tracks.get(s.name, Track())
        hot_since = (t.hot_since if t.hot_since is not None else now) if s.name in hot else None
        cool_since = (t.cool_since if t.cool_since is not None else now) if is_cool(s, policy) else None
        if (hot_since, cool_since) != (t.hot_since, t.cool_since):  # most replicas, most passes: unchanged
            t = replace(t, hot_since=hot_since, cool_since=cool_since)
        settled = t.changed_at is None or now - t.changed_at >= policy.hold_s
        cooler = [o for o in signals if o.name != s.name and o.name not in hot]
        if t.hot_since is not None and now - t.hot_since >= policy.sustain_s and settled and cooler:
            why = (f"{s.name}: utilisation {_fmt(s.utilisation_pct, '%')} > {policy.hot_utilisation_pct:g}% and queue "
                   f"{_fmt(s.queue)} > {policy.hot_queue:g} for {now - t.hot_since:.1f}s, p99 {_fmt(s.p99_ms, ' ms')}"
                   f" (others: " + ", ".join(f"{o.name} {_fmt(o.utilisation_pct, '%')}/{_fmt(o.queue)}/"
                                             f"{_fmt(o.p99_ms, ' ms')}" for o in cooler) + ")")
            if lever == "replicas":
                coolest = min(cooler, key=lambda o: (o.utilisation_pct or 0.0, o.queue or 0.0))
                where = coolest.node or coolest.name
                decisions.append(Decision(now, s.name, "add_replica", t.weight_multiplier, t.weight_multiplier,
                                          f"{why}: add a replica on the cooler node {where}", node=where))
                t = replace(t, changed_at=now)
            elif t.weight_multiplier > policy.min_weight:
                after = max(policy.min_weight, t.weight_multiplier * (1 - policy.shift_fraction))
                decisions.append(Decision(now, s.name, "shift_away", t.weight_multiplier, after,
                                          f"{why}: weight x{t.weight_multiplier:.2f} -> x{after:.2f} "
                                          f"({policy.shift_fraction:.0%} of its share to the others)"))
                t = replace(t, weight_multiplier=after, changed_at=now)
        elif (lever == "weights" and t.weight_multiplier < 1.0 and t.cool_since is not None
              and now - t.cool_since >= policy.restore_after_s and settled):
            after = min(1.0, t.weight_multiplier / (1 - policy.shift_fraction))
            decisions.append(Decision(now, s.name, "restore", t.weight_multiplier, after,
                                      f"{s.name}: cool for {now - t.cool_since:.0f}s (utilisation "
                                      f"{_fmt(s.utilisation_pct, '%')} < {policy.cool_utilisation_pct:g}%, queue "
                                      f"{_fmt(s.queue)} < {policy.cool_queue:g}, p99 {_fmt(s.p99_ms, ' ms')}): "
                                      f"weight x{t.weight_multiplier:.2f} -> x{after:.2f}"))
            t = replace(t, weight_multiplier=after, changed_at=now, cool_since=now)
        out[s.name] = t
    for name, t in tracks.items():  # a replica without a signal this time keeps its memory
        out.setdefault(name, t)
    return out, decisions


@dataclass(frozen=True)
class Extra:
    """A replica the director added to a model (module docstring): the count it holds the model at, where it
    asked for it, for which hot replica, since when, and since when every replica has been cool."""

    floor: int
    node: str
    replica: str
    since: float
    cool_since: float | None = None

    def to_record(self) -> dict[str, Any]:
        """The ``DirectorFloor`` of the model's status (``ModelStatus.director``): published with the assignments
        that hold it, so a new leader continues from it instead of removing the replica it holds."""
        return {"floor": self.floor, "node": self.node, "replica": self.replica, "since_ms": int(self.since * 1000),
                "cool_since_ms": None if self.cool_since is None else int(self.cool_since * 1000)}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Extra:
        cool = rec.get("cool_since_ms")
        return cls(int(rec["floor"]), str(rec["node"]), str(rec["replica"]), int(rec["since_ms"]) / 1000,
                   None if cool is None else int(cool) / 1000)


def replica_lever(extra: Extra | None, decisions: Sequence[Decision], signals: Sequence[Signal], count: int,
                  max_replicas: int, now: float, policy: DirectorPolicy = DirectorPolicy(),
                  held: str | None = None) -> tuple[Extra | None, list[Decision]]:
    """The in-process lever over one model: ``direct``'s ``add_replica`` decisions become a floor (``Extra``)
    or say why not; a floor whose model stayed cool long enough is released.  ``count``: the model's
    replica count without the floor (the autoscaler's); ``held``: why a rollout holds the model (None: no
    rollout).  Returns the model's new ``Extra`` and the decisions to publish (each with its numbers)."""
    out: list[Decision] = []
    for d in decisions:
        if d.action != "add_replica":
            out.append(d)
            continue
        node = d.node or ""
        if held is not None:
            out.append(replace(d, action="add_replica_held", reason=f"{d.reason}; not now: {held}"))
        elif extra is not None:
            out.append(replace(d, action="add_replica_pending",
                               reason=f"{d.reason}; already holding one added replica (floor {extra.floor}, on "
                                      f"{extra.node}, since {now - extra.since:.0f}s): the autoscaler adds more"))
        elif count + 1 > max_replicas:
            out.append(replace(d, action="add_replica_blocked",
                               reason=f"{d.reason}; not added: {count} replicas is the spec's maximum ({max_replicas})"))
        else:
            extra = Extra(count + 1, node, d.name, now)
            out.append(replace(d, reason=f"{d.reason}; desired replicas {count} -> {count + 1} (max {max_replicas})"))
    if extra is None or held is not None or any(d.action == "add_replica" for d in out):
        return extra, out
    if not signals:
        return extra, out  # no READY replica reported: no evidence either way, keep it
    cool = all(is_cool(s, policy) for s in signals)
    extra = replace(extra, cool_since=(extra.cool_since if extra.cool_since is not None else now) if cool else None)
    if (extra.cool_since is not None and now - extra.cool_since >= policy.restore_after_s
            and now - extra.since >= policy.hold_s):
        numbers = ", ".join(f"{s.name} {_fmt(s.utilisation_pct, '%')}/{_fmt(s.queue)}/{_fmt(s.p99_ms, ' ms')}"
                            for s in signals)
        reason = (f"every replica cool for {now - extra.cool_since:.0f}s (utilisation < "
                  f"{policy.cool_utilisation_pct:g}%, queue < {policy.cool_queue:g}: {numbers}): release the replica "
                  f"added on {extra.node}; floor {extra.floor} lifted (the autoscaler's count {count} stands)")
        out.append(Decision(now, extra.replica, "release_replica", 1.0, 1.0, reason, node=extra.node))
        return None, out
    return extra, out
