"""A model's rollout policy: canary steps, time per step, SLO gates (the spec's ``rollout`` block).

WHY in ``sie.schemas``: the policy is part of the ModelService contract, validated when a spec is parsed
(an error names ``spec.rollout.<field>``), and read by the control plane's rollout state machine
(``sie.control.rollout.machine``), which is above this layer.  Spec form (all optional)::

    rollout:
      steps: [10, 20, 50, 100]       # percent of requests on the new version, strictly rising, ends at 100
      intervalSeconds: 20            # time per step before the gates may pass it
      surgeTimeoutSeconds: 300       # how long the new version may take to become ready
      gates: {p99MaxMs, p99MaxRatio, p99SlackMs, maxErrorRateIncrease, maxExpiryRateIncrease, minSamples,
              confidence, inconclusiveIntervals}

What the gates test and why (sequential tests, a stated confidence): ``sie.control.rollout.gates``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sie.kernel.errors import ConfigError

DEFAULT_STEPS = (10, 20, 50, 100)
DEFAULT_INTERVAL_S = 20.0
_KEYS = {"steps", "intervalSeconds", "surgeTimeoutSeconds", "gates"}
_GATE_KEYS = {"p99MaxMs", "p99MaxRatio", "p99SlackMs", "maxErrorRateIncrease", "maxExpiryRateIncrease", "minSamples",
              "confidence", "inconclusiveIntervals"}
#: dataclass field -> its name in the spec (errors name the spec's field)
_GATE_FIELDS = {"p99_max_ms": "p99MaxMs", "p99_max_ratio": "p99MaxRatio", "p99_slack_ms": "p99SlackMs",
                "max_error_rate_increase": "maxErrorRateIncrease", "max_expiry_rate_increase": "maxExpiryRateIncrease"}


@dataclass(frozen=True)
class Gates:
    """SLO gates of one canary step.  ``None`` switches a gate off.  Each gate is a sequential test on the
    step's window (``sie.control.rollout.gates``): it fails the canary only with ``confidence``."""

    #: absolute p99 (queue + inference) the canary must hold (default: the spec's ``sla.p99LatencyMs``)
    p99_max_ms: float | None = None
    #: canary inference p99 <= stable's * ratio + slack (slack keeps millisecond noise from failing a fast model)
    p99_max_ratio: float | None = 1.5
    p99_slack_ms: float = 5.0
    #: canary error rate (inference errors + dead letters) <= stable's + this
    max_error_rate_increase: float | None = 0.01
    #: canary expiry rate <= stable's + this
    max_expiry_rate_increase: float | None = 0.01
    #: requests the canary must have answered in the window before any gate judges it
    min_samples: int = 100
    #: probability that a canary no worse than the limits completes the whole rollout (1 - confidence is the
    #: false-rollback rate, split over the steps and the gates switched on)
    confidence: float = 0.99
    #: a step whose gates reach no verdict by the end of its interval waits up to this many more intervals,
    #: then rolls back ("not proven"), so an inconclusive canary never holds its share forever
    inconclusive_intervals: int = 2

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ConfigError(f"rollout.gates.minSamples: must be >= 1 (got {self.min_samples})")
        for name, spec_name in _GATE_FIELDS.items():
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"rollout.gates.{spec_name}: must be >= 0 (got {value})")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"rollout.gates.confidence: must be in [0.5, 1) (got {self.confidence}); "
                              f"e.g. 0.99: an identical canary is rolled back at most 1 % of the time")
        if self.inconclusive_intervals < 0:
            raise ConfigError(f"rollout.gates.inconclusiveIntervals: must be >= 0 (got {self.inconclusive_intervals})")


@dataclass(frozen=True)
class Policy:
    """How a rollout proceeds: canary steps (percent of traffic), time per step, gates."""

    steps: tuple[int, ...] = DEFAULT_STEPS
    interval_s: float = DEFAULT_INTERVAL_S
    gates: Gates = field(default_factory=Gates)
    #: how long the new version may take to become ready (Surging) before the rollout fails
    surge_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        steps = self.steps
        if not steps or any(not 0 < s <= 100 for s in steps) or list(steps) != sorted(set(steps)):
            raise ConfigError(f"rollout.steps: must be strictly rising percentages in (0, 100] (got {list(steps)})")
        if steps[-1] != 100:
            raise ConfigError(f"rollout.steps: the last step must be 100 (got {list(steps)})")
        if self.interval_s <= 0:
            raise ConfigError(f"rollout.intervalSeconds: must be > 0 (got {self.interval_s})")
        if self.surge_timeout_s <= 0:
            raise ConfigError(f"rollout.surgeTimeoutSeconds: must be > 0 (got {self.surge_timeout_s})")

    @classmethod
    def from_document(cls, doc: Mapping[str, Any] | None, sla_p99_ms: float | None = None) -> Policy:
        """The spec's ``rollout`` block (camelCase, all optional); the absolute p99 gate defaults to the SLA."""
        doc = dict(doc or {})
        unknown = sorted(set(doc) - _KEYS)
        if unknown:
            raise ConfigError(f"rollout.{unknown[0]}: unknown field; known: {', '.join(sorted(_KEYS))}")
        if not isinstance(doc.get("gates") or {}, Mapping):
            raise ConfigError("rollout.gates: must be a mapping")
        gates_doc = dict(doc.get("gates") or {})
        unknown = sorted(set(gates_doc) - _GATE_KEYS)
        if unknown:
            raise ConfigError(f"rollout.gates.{unknown[0]}: unknown field; known: {', '.join(sorted(_GATE_KEYS))}")
        try:
            return cls._build(doc, gates_doc, sla_p99_ms)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rollout: steps must be integers and every other value a number ({exc})") from None

    @classmethod
    def _build(cls, doc: dict[str, Any], gates_doc: dict[str, Any], sla_p99_ms: float | None) -> Policy:
        def num(key: str, default: float | None) -> float | None:
            value = gates_doc.get(key, default)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"gates.{key} = {value!r}")
            return None if value is None else float(value)

        def integer(key: str, default: int) -> int:
            value = gates_doc.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"rollout.gates.{key}: must be an integer (got {value!r})")
            return value

        confidence = num("confidence", 0.99)
        if confidence is None:
            raise ConfigError("rollout.gates.confidence: must be a number in [0.5, 1) (got null)")

        gates = Gates(
            p99_max_ms=num("p99MaxMs", sla_p99_ms),
            p99_max_ratio=num("p99MaxRatio", 1.5),
            p99_slack_ms=num("p99SlackMs", 5.0) or 0.0,
            max_error_rate_increase=num("maxErrorRateIncrease", 0.01),
            max_expiry_rate_increase=num("maxExpiryRateIncrease", 0.01),
            min_samples=int(gates_doc.get("minSamples", 100)),
            confidence=confidence,
            inconclusive_intervals=integer("inconclusiveIntervals", 2),
        )
        return cls(steps=tuple(int(s) for s in doc.get("steps", DEFAULT_STEPS)),
                   interval_s=float(doc.get("intervalSeconds", DEFAULT_INTERVAL_S)), gates=gates,
                   surge_timeout_s=float(doc.get("surgeTimeoutSeconds", 300.0)))

    def to_document(self) -> dict[str, Any]:
        g = self.gates
        gates: dict[str, Any] = {"p99MaxMs": g.p99_max_ms, "p99MaxRatio": g.p99_max_ratio, "p99SlackMs": g.p99_slack_ms,
                                 "maxErrorRateIncrease": g.max_error_rate_increase,
                                 "maxExpiryRateIncrease": g.max_expiry_rate_increase, "minSamples": g.min_samples}
        # fields newer than the rollout record format only when set: a control plane one release older (a
        # rolling upgrade) reads the record of a rollout that kept their defaults
        if g.confidence != Gates.confidence:
            gates["confidence"] = g.confidence
        if g.inconclusive_intervals != Gates.inconclusive_intervals:
            gates["inconclusiveIntervals"] = g.inconclusive_intervals
        return {"steps": list(self.steps), "intervalSeconds": self.interval_s,
                "surgeTimeoutSeconds": self.surge_timeout_s, "gates": gates}
