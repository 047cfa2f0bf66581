"""Per-caller quotas of the LLM window: requests/s and tokens/s, policy ``reject`` or ``delay``.

Configuration (``spec.backend.config.quotas``), who the caller is and the limits across replicas:
docs/llm.md, "Quotas".  In short:

* the caller: a name listed in ``callers`` gets its own buckets (with ``token_sha256`` only when the
  record's ``sie.caller.token`` header proves it); every other request is one caller, ``SHARED``, at the
  default limits (or a ``quota_exceeded`` dead letter with ``unknown_callers: reject``), so invented names
  cannot evade the limit and the state is bounded by the configuration;
* a token bucket per caller and kind, holding one second of its rate: ``take`` charges one request and an
  *estimate* of its tokens (the caller's running mean; ``first_estimate`` before its first answer), since
  tokens are known only after the generation; ``charge`` corrects it by the real count, possibly into debt;
* ``reject``: a request that may not be sent now becomes a ``quota_exceeded`` dead letter; ``delay``: it
  waits in its caller's queue in the window (``sie.streams.llm.fair``), nothing dropped;
* ``set_share``: each replica enforces ``quota x share`` (its partitions of the request topic / all of
  them), recomputed on every rebalance; skewed keys get less than their quota, never more.

After a crash a redone record meets the buckets as they are then: with ``reject`` its single visible
outcome may differ from the lost attempt's (exactly-once holds: one outcome is ever visible).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import ConfigError

POLICIES = ("reject", "delay")
#: the caller every request belongs to that no listed caller's name (and token) claims
SHARED = "*"
#: the record header that proves a caller whose ``token_sha256`` is set
TOKEN_HEADER = "sie.caller.token"


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

    def rescale(self, rate: float, now: float) -> None:
        """A new rate (a rebalance changed this replica's share); the level keeps its fraction of capacity."""
        self.refill(now)
        fraction = self.level / self.capacity
        self.rate, self.capacity = rate, max(rate, 1.0)
        self.level = fraction * self.capacity


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

    def __init__(self, cfg: Mapping[str, Any], clock: Callable[[], float] = time.monotonic,
                 first_estimate: float = 0.0) -> None:
        where = "spec.backend.config.quotas"
        policy = cfg.get("policy", "reject")
        if policy not in POLICIES:
            raise ConfigError(f"{where}.policy: must be one of {', '.join(POLICIES)} (got {policy!r})")
        self.policy = str(policy)
        path = cfg.get("caller", "metadata.caller")
        if not isinstance(path, str) or not path or path.split(".")[0] in ("inputs", "id"):
            raise ConfigError(f"{where}.caller: a dotted path outside inputs, e.g. metadata.caller (got {path!r})")
        self._path = path.split(".")
        self._default = Limits(_rate(cfg, "requests_per_s", where), _rate(cfg, "tokens_per_s", where))
        callers = cfg.get("callers") or {}
        if not isinstance(callers, Mapping):
            raise ConfigError(f"{where}.callers: a mapping caller -> limits (got {type(callers).__name__})")
        if SHARED in callers:
            raise ConfigError(f"{where}.callers: {SHARED!r} is the shared bucket of unlisted callers, not a name")
        self._limits = {str(name): Limits(_rate(v or {}, "requests_per_s", f"{where}.callers.{name}"),
                                          _rate(v or {}, "tokens_per_s", f"{where}.callers.{name}"))
                        for name, v in callers.items()}
        #: listed callers that must prove themselves: the sha256 of their token
        self._tokens = {str(name): str(v["token_sha256"]).lower() for name, v in callers.items()
                        if isinstance(v, Mapping) and v.get("token_sha256")}
        unknown = cfg.get("unknown_callers", "shared")
        if unknown not in ("shared", "reject"):
            raise ConfigError(f"{where}.unknown_callers: must be shared or reject (got {unknown!r})")
        self.reject_unknown = unknown == "reject"
        self.max_delay_s = _rate(cfg, "max_delay_s", where) or 10.0
        max_delayed = _rate(cfg, "max_delayed", where)
        self.max_delayed = int(max_delayed) if max_delayed is not None else None  # None: the stage decides
        defer = cfg.get("defer", True)
        if not isinstance(defer, bool):
            raise ConfigError(f"{where}.defer: must be true or false (got {defer!r})")
        self.defer = defer and self.policy == "delay"
        self.defer_after_s = _rate(cfg, "defer_after_s", where) or 1.0
        over, window = _rate(cfg, "defer_over", where), _rate(cfg, "deferred_window", where)
        self.defer_over = int(over) if over is not None else None  # None: the stage decides
        self.deferred_window = int(window) if window is not None else None
        self._clock = clock
        self._share = 1.0
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._mean: dict[str, float] = {}  # the caller's running mean of tokens per request (the estimate)
        self._first_estimate = first_estimate

    def named(self, extra: Mapping[str, Any] | None) -> str | None:
        """The name at the configured path of the request (its keys besides inputs/id), else None."""
        node: Any = extra or {}
        for part in self._path:
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, str) and node else None

    def caller(self, extra: Mapping[str, Any] | None, headers: Iterable[tuple[str, Any]] | None = None) -> str | None:
        """Whose quota the request spends (module docstring): a listed caller it names (proved by its token
        where one is set), else ``SHARED``; None when ``unknown_callers: reject`` refuses it."""
        name = self.named(extra)
        if name is not None and name in self._limits:
            want = self._tokens.get(name)
            if want is None or _token_matches(headers, want):
                return name
        return None if self.reject_unknown else SHARED

    def unknown_why(self, extra: Mapping[str, Any] | None) -> str:
        """Why ``caller`` refused a request (``unknown_callers: reject``)."""
        name = self.named(extra)
        if name is None:
            return f"no caller at {'.'.join(self._path)} (quotas.unknown_callers: reject)"
        if name in self._limits:
            return f"caller {name[:80]!r}: no valid {TOKEN_HEADER} header (quotas.callers.{name[:80]}.token_sha256)"
        return f"caller {name[:80]!r} is not listed in quotas.callers (quotas.unknown_callers: reject)"

    def state_size(self) -> int:
        """Per-caller entries held (buckets and estimates): bounded by the configuration, not by the names."""
        return len(self._buckets) + len(self._mean)

    @property
    def share(self) -> float:
        return self._share

    def set_share(self, share: float) -> None:
        """This replica's fraction of every quota (its partitions / the topic's; module docstring)."""
        share = min(1.0, max(share, 0.0))
        if share == self._share:
            return
        self._share = share
        now = self._clock()
        for (caller, kind), bucket in self._buckets.items():
            rate = self._rate(caller, kind)
            if rate is not None:
                bucket.rescale(rate, now)

    def _rate(self, caller: str, kind: str) -> float | None:
        limits = self._limits.get(caller, self._default)
        rate = limits.tokens_per_s if kind == "tokens" else limits.requests_per_s
        # a replica with no partition of the topic serves no request: keep its buckets tiny, never zero
        return None if rate is None else max(rate * self._share, 1e-6)

    def _bucket(self, caller: str, kind: str) -> Bucket | None:
        rate = self._rate(caller, kind)
        if rate is None:
            return None
        bucket = self._buckets.get((caller, kind))
        if bucket is None:
            bucket = self._buckets[(caller, kind)] = Bucket(rate, self._clock())
        return bucket

    def wait_s(self, caller: str) -> float:
        """0 if ``caller`` may send one more request now, else about how long until it may."""
        now = self._clock()
        wait = 0.0
        tokens = self._bucket(caller, "tokens")
        if tokens is not None and tokens.refill(now) < 0:
            wait = -tokens.level / tokens.rate
        requests = self._bucket(caller, "requests")
        if requests is not None and requests.refill(now) < 1.0:
            wait = max(wait, (1.0 - requests.level) / requests.rate)
        return wait

    def why(self, caller: str) -> str:
        """Which limit ``caller`` is over (for a ``quota_exceeded`` dead letter)."""
        limits = self._limits.get(caller, self._default)
        who = "unlisted callers (shared)" if caller == SHARED else f"caller {caller[:80]!r}"
        tokens = self._bucket(caller, "tokens")
        if tokens is not None and tokens.level < 0:
            return f"{who}: over tokens_per_s {limits.tokens_per_s:g}"
        return f"{who}: over requests_per_s {limits.requests_per_s:g}"

    def take(self, caller: str) -> float:
        """Count one request of ``caller`` being sent now; returns the tokens estimated for it (pass them
        back to ``charge``).  Called after ``wait_s`` said 0, or when a delay ran out (then it overdraws)."""
        requests = self._bucket(caller, "requests")
        if requests is not None:
            requests.refill(self._clock())
            requests.level -= 1.0
        estimate = self._mean.get(caller, self._first_estimate)
        tokens = self._bucket(caller, "tokens")
        if tokens is not None:
            tokens.refill(self._clock())
            tokens.level -= estimate
        return estimate

    def admit(self, caller: str) -> str | None:
        """Policy ``reject`` in one call: None if the request is counted and may be sent, else why not."""
        if self.wait_s(caller) > 0:
            return self.why(caller)
        self.take(caller)
        return None

    def charge(self, caller: str, tokens: int | None, estimated: float = 0.0) -> None:
        """The tokens a finished generation of ``caller`` used, less what ``take`` estimated for it (may
        take its bucket into debt); updates the caller's estimate.  ``None``: no generation (the request
        was refused or could not be sent): the estimate is given back."""
        if tokens is None:
            tokens = 0
        else:
            mean = self._mean.get(caller)
            self._mean[caller] = float(tokens) if mean is None else 0.8 * mean + 0.2 * tokens
        bucket = self._bucket(caller, "tokens")
        if bucket is not None:
            bucket.refill(self._clock())
            bucket.level -= tokens - estimated


def _token_matches(headers: Iterable[tuple[str, Any]] | None, want_sha256: str) -> bool:
    """Whether the record carries ``TOKEN_HEADER`` whose sha256 is ``want_sha256`` (constant-time compare)."""
    for key, value in headers or ():
        if key == TOKEN_HEADER and isinstance(value, bytes):
            return hmac.compare_digest(hashlib.sha256(value).hexdigest(), want_sha256)
    return False
