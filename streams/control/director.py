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
  the decision names the hot replica, the coolest online node, and the numbers, as an event.

The rule (the design's default, ``DirectorPolicy``): a replica is **hot** when its utilisation is above
85 % AND its queue is above 50; hot for ``sustain_s`` -> shift 30 % of its share to the others (weight x
0.7, never below ``min_weight``), provided some other replica is not hot (shifting between hot replicas
only moves the problem).  **Hysteresis**: at most one change per replica per ``hold_s``, and weight comes
back (one step, / 0.7, up to 1) only after the replica stayed **cool** (utilisation below 60 % and queue
below 10: well under the hot thresholds) for ``restore_after_s``.  Between the two bands nothing moves, so
a replica hovering at the threshold does not flap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

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
        from sie.streams.control.autoscaler import policy_numbers

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
        t = replace(t, hot_since=(t.hot_since if t.hot_since is not None else now) if s.name in hot else None,
                    cool_since=(t.cool_since if t.cool_since is not None else now) if is_cool(s, policy) else None)
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
                                          f"{why}: add a replica on the cooler node {where}"))
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
