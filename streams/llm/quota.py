"""Per-caller quotas of one LLM scorer replica: requests/s and tokens/s, policy ``reject``.

    quotas:
      caller: metadata.caller     # dotted path into the request document (outside "inputs"); absent: "-"
      requests_per_s: 5           # every caller's default (omit: unlimited)
      tokens_per_s: 2000          # prompt + completion tokens (omit: unlimited)
      callers: {vip: {requests_per_s: 50, tokens_per_s: 20000}}
      policy: reject              # the only policy built

A token bucket per caller and kind, holding up to one second of its rate.  A request is admitted when
its caller's request bucket holds a whole request and its token bucket is not in debt; tokens are known
only after the generation, so they are charged then and may take the bucket below zero (the next
requests of that caller are refused until it refills).  A refused request is finished at once as a
``quota_exceeded`` dead letter, in its place in the window: the commit rule is unchanged.

Per replica: with N replicas a caller gets up to N times its quota (no shared state across replicas).
After a crash a redone record meets the buckets as they are then: its single visible outcome may be
the other one than the lost attempt's (exactly-once holds: one outcome is ever visible).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import ConfigError


class Bucket:
    """A token bucket of ``rate`` per second holding at most ``rate`` (one second's worth, at least 1)."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(rate, 1.0)
        self.level = self.capacity
        self._at = now

    def refill(self, now: float) -> float:
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now
        return self.level


@dataclass(frozen=True)
class Limits:
    requests_per_s: float | None = None
    tokens_per_s: float | None = None


def _rate(cfg: Mapping[str, Any], name: str, where: str) -> float | None:
    value = cfg.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}.{name}: must be a number > 0 (got {value!r})")
    return float(value)


class Quotas:
    """The quota state of one replica (module docstring).  Used from the stage's thread only."""

    def __init__(self, cfg: Mapping[str, Any], clock: Callable[[], float] = time.monotonic) -> None:
        where = "spec.backend.config.quotas"
        policy = cfg.get("policy", "reject")
        if policy != "reject":
            raise ConfigError(f"{where}.policy: only 'reject' is built (got {policy!r}); see docs/llm.md")
        path = cfg.get("caller", "metadata.caller")
        if not isinstance(path, str) or not path or path.split(".")[0] in ("inputs", "id"):
            raise ConfigError(f"{where}.caller: a dotted path outside inputs, e.g. metadata.caller (got {path!r})")
        self._path = path.split(".")
        self._default = Limits(_rate(cfg, "requests_per_s", where), _rate(cfg, "tokens_per_s", where))
        callers = cfg.get("callers") or {}
        if not isinstance(callers, Mapping):
            raise ConfigError(f"{where}.callers: a mapping caller -> limits (got {type(callers).__name__})")
        self._limits = {str(name): Limits(_rate(v or {}, "requests_per_s", f"{where}.callers.{name}"),
                                          _rate(v or {}, "tokens_per_s", f"{where}.callers.{name}"))
                        for name, v in callers.items()}
        self._clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def caller(self, extra: Mapping[str, Any] | None) -> str:
        """The caller named at the configured path of the request (its keys besides inputs/id), else "-"."""
        node: Any = extra or {}
        for part in self._path:
            if not isinstance(node, Mapping) or part not in node:
                return "-"
            node = node[part]
        return node if isinstance(node, str) and node else "-"

    def _bucket(self, caller: str, kind: str, rate: float | None) -> Bucket | None:
        if rate is None:
            return None
        bucket = self._buckets.get((caller, kind))
        if bucket is None:
            bucket = self._buckets[(caller, kind)] = Bucket(rate, self._clock())
        return bucket

    def admit(self, caller: str) -> str | None:
        """None if ``caller`` may send one more request now (it is counted), else why not."""
        limits = self._limits.get(caller, self._default)
        now = self._clock()
        tokens = self._bucket(caller, "tokens", limits.tokens_per_s)
        if tokens is not None and tokens.refill(now) < 0:
            return f"caller {caller[:80]!r}: over tokens_per_s {limits.tokens_per_s:g}"
        requests = self._bucket(caller, "requests", limits.requests_per_s)
        if requests is not None:
            if requests.refill(now) < 1.0:
                return f"caller {caller[:80]!r}: over requests_per_s {limits.requests_per_s:g}"
            requests.level -= 1.0
        return None

    def charge(self, caller: str, tokens: int) -> None:
        """Tokens a finished generation of ``caller`` used (may take its bucket into debt)."""
        limits = self._limits.get(caller, self._default)
        bucket = self._bucket(caller, "tokens", limits.tokens_per_s)
        if bucket is not None:
            bucket.refill(self._clock())
            bucket.level -= tokens
