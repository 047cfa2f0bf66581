"""The rollout gates: does the canary do worse than the stable version, with a stated confidence?

Why not one ratio of two p99s: a canary at 10 % has ~150 answers in a 5 s step, and the p99 of 150 answers
is their second-largest, noise on a loaded machine.  So each gate is a sequential test (Wald's SPRT) on the
canary's answers, judged at every leader tick on the step's window; it says FAIL (the canary is worse, with
confidence), PASS (enough evidence that it is not) or nothing yet::

    judge(gates, canary, stable, steps):
        canary answered < minSamples            -> INCONCLUSIVE (nothing is judged on a handful of answers)
        alpha = (1 - confidence) / (steps x tests switched on)     # union bound: per rollout, <= 1 - confidence
        for each test: k "bad" canary observations of n, vs the gate's limit
            llr = k ln(p1/p0) + (n - k) ln((1-p1)/(1-p0))           # H0: bad share <= p0, H1: >= p1
            llr >= ln((1-beta)/alpha) -> FAIL     llr <= ln(beta/(1-alpha)) -> PASS     else open
        any FAIL -> FAIL;  every test PASS -> PASS;  else INCONCLUSIVE
    at the step's deadline (``Rollout.tick``: interval x (1 + inconclusiveIntervals)), still open:
        GateResult.at_deadline(): an open test with llr nearer its FAIL boundary, or < minSamples -> FAIL
                                  else -> PASS

The tests (``s``: the stable's own share above the same limit, in the same window: what the machine, not
the version, puts there; p1 - p0 is ``WORSE``):

=====================  =========================================  ==========================  ==================
test (spec fields)     a "bad" observation: one canary ...        p0 (allowed)                p1 (worse)
=====================  =========================================  ==========================  ==================
p50 vs stable          model call slower than stable's median      50 % + s                    75 % + s
(p99MaxRatio,          x ratio + slack
p99SlackMs)
p99 vs stable          model call slower than stable's p99         1 % + s                     5 % + s
                       x ratio + slack
p99MaxMs (the SLA)     answer with queue + inference > p99MaxMs    1 % + s                     5 % + s
maxErrorRateIncrease   inference error / output violation /        stable's rate + increase    p0 + 4 points
                       too-large dead letter (a row)
maxExpiryRateIncrease  expired answer (a row)                      stable's rate + increase    p0 + 4 points
=====================  =========================================  ==========================  ==================

Choices (the reasons and their measurements: ``docs/rollouts.md``, "The gates"):

- the relative tests compare model-call (inference) time: both versions share the scorer's queue time; the SLA
  test keeps queue + inference, what callers wait for;
- the median too: on a loaded machine a canary 3x slower per call is only ~2x worse at the p99, 3x at the median;
- the stable's quantiles come from its last ``REFERENCE_S`` (``VersionWindow.reference``), not the step alone;
- evidence counts model calls, not rows (an answer weighs 1 / rows in its call); error and expiry tests count rows;
- the SPRT's bounds hold however often it is looked at, so judging every tick costs nothing; PASS needs
  evidence too (``BETA``): a step whose interval ends first waits for it, up to its deadline.

Failures:

==============================================  ================================================================
case                                            verdict
==============================================  ================================================================
canary answered fewer than ``minSamples``       INCONCLUSIVE; at the step's deadline: FAIL ("not proven")
stable answered fewer than ``minSamples``       the relative tests are not applied (the 100 % step: stable idle)
canary has no ok answer (all errors / expired)  latency tests open; the error or expiry test decides
a window without latency samples                latency tests stay open (never a silent PASS)
==============================================  ================================================================
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sie.schemas.rollout_policy import Gates

__all__ = ["BETA", "REFERENCE_S", "WORSE", "Answer", "Check", "GateResult", "Verdict", "VersionWindow",
           "call_quantile", "judge", "p99", "sprt_llr"]

#: probability that a canary truly at the "worse" level (p1) passes one step's gate
BETA = 0.05
#: quantile -> how much larger a share of the canary's calls above the limit the test is powered to fail: the p99
#: (1 % allowed) against its p95 over the limit, the median (50 %) against its lower quartile; error and expiry
#: rates like the p99 (4 points over what is allowed)
WORSE = {0.99: 0.04, 0.5: 0.25}
#: the stable's p99 comes from at least this many seconds of its answers: one 10 % step of 5-20 s holds ~100
#: stable calls, whose p99 is their maximum, and one slow call would lift the limit over a 3x slower canary
REFERENCE_S = 60.0


class Answer(NamedTuple):
    """One ok answer of a version: what the gates judge."""

    latency_ms: float  # queue + inference: what the caller waited for (the absolute gate)
    inference_ms: float  # the time of the model call that scored it (the relative gate)
    call_rows: int = 1  # rows in that call: the answer weighs 1 / call_rows (one call, one observation)


def p99(values: Iterable[float]) -> float | None:
    """The 99th percentile (nearest rank), or None without values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None


def call_quantile(answers: Sequence[Answer], q: float, measure: str = "inference") -> float | None:
    """The ``q`` quantile of inference (or queue + inference) time over model calls: each call once (its
    answers weigh 1 / rows); None without answers."""
    ordered = sorted(((a.inference_ms if measure == "inference" else a.latency_ms), 1.0 / max(1, a.call_rows))
                     for a in answers)
    total = sum(w for _v, w in ordered)
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        if seen > total * q + 1e-9:
            return value
    return ordered[-1][0] if ordered else None


@dataclass(frozen=True)
class VersionWindow:
    """What one version did over a window: requests answered, errors (inference + dead letters), expired,
    p99 of queue + inference, and its ok answers (``Answer``) for the latency gates."""

    requests: int = 0
    errors: int = 0
    expired: int = 0
    p99_ms: float | None = None
    answers: tuple[Answer, ...] = ()
    #: the stable version's answers over a longer horizon (the driver: at least the last ``REFERENCE_S``),
    #: from which its p99 is estimated; empty: ``answers``
    reference: tuple[Answer, ...] = ()

    @classmethod
    def of(cls, answers: Sequence[Answer], errors: int = 0, expired: int = 0) -> VersionWindow:
        """A window from its ok answers and its error / expiry counts (requests = all of them)."""
        return cls(len(answers) + errors + expired, errors, expired, p99(a.latency_ms for a in answers),
                   tuple(answers))

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def expiry_rate(self) -> float:
        return self.expired / self.requests if self.requests else 0.0

    @property
    def calls(self) -> float:
        """Model calls behind the ok answers (each answer weighs 1 / rows in its call)."""
        return sum(1.0 / max(1, a.call_rows) for a in self.answers)


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Check:
    """One gate's test on one window: its verdict, log likelihood ratio, and what it would decide if the
    step's time were up now (``at_deadline``: its likelihood ratio nearer the fail or the pass boundary)."""

    gate: str
    verdict: Verdict
    detail: str
    llr: float = 0.0
    at_deadline: Verdict = Verdict.INCONCLUSIVE


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    reasons: tuple[str, ...]
    checks: tuple[Check, ...] = ()

    def line(self) -> str:
        return "; ".join(self.reasons)

    def at_deadline(self) -> Verdict:
        """The truncated tests' decision when a step's time is up without a verdict: FAIL if an open test's
        likelihood ratio is nearer its fail boundary than its pass boundary (leaning worse), or nothing was
        judged (fewer than minSamples answers: not proven); PASS otherwise."""
        if self.verdict is not Verdict.INCONCLUSIVE:
            return self.verdict
        if not self.checks:
            return Verdict.FAIL
        return Verdict.FAIL if any(c.at_deadline is Verdict.FAIL for c in self.checks) else Verdict.PASS


def sprt_llr(bad: float, n: float, p0: float, p1: float) -> float:
    """Log likelihood ratio of ``bad`` bad observations in ``n`` under a bad share p1 vs p0 (0 < p0 < p1 < 1)."""
    return bad * math.log(p1 / p0) + (n - bad) * math.log((1.0 - p1) / (1.0 - p0))


class _Sprt:
    """Wald's boundaries for one test at (alpha, BETA), and what a window still needs to reach them."""

    def __init__(self, alpha: float, p0: float, p1: float) -> None:
        self.p0, self.p1 = min(max(p0, 1e-9), 0.99), min(max(p1, p0 + 1e-6, 2e-9), 0.999)
        self.reject = math.log((1.0 - BETA) / alpha)
        self.accept = math.log(BETA / (1.0 - alpha))

    def verdict(self, bad: float, n: float) -> tuple[Verdict, float, Verdict]:
        """(verdict, log likelihood ratio, the decision if the step's time were up)."""
        llr = sprt_llr(bad, n, self.p0, self.p1)
        if llr >= self.reject:
            return Verdict.FAIL, llr, Verdict.FAIL
        if llr <= self.accept and n > 0:
            return Verdict.PASS, llr, Verdict.PASS
        if n <= 0:  # nothing seen: not proven
            return Verdict.INCONCLUSIVE, llr, Verdict.FAIL
        # truncated: the nearer boundary, not the sign of the evidence (docs/rollouts.md, "The gates")
        leaning = Verdict.FAIL if llr >= (self.reject + self.accept) / 2 else Verdict.PASS
        return Verdict.INCONCLUSIVE, llr, leaning

    def needed(self, bad: float) -> float:
        """Observations in all (with ``bad`` of them bad) at which the test would PASS."""
        per_good = -math.log((1.0 - self.p1) / (1.0 - self.p0))
        return bad + (bad * math.log(self.p1 / self.p0) - self.accept) / per_good


def _above(answers: Sequence[Answer], limit: float, measure: str) -> tuple[float, float]:
    """(calls above ``limit``, calls): each answer weighs 1 / rows in its call."""
    n = bad = 0.0
    for a in answers:
        w = 1.0 / max(1, a.call_rows)
        n += w
        if (a.inference_ms if measure == "inference" else a.latency_ms) > limit:
            bad += w
    return bad, n


def _latency_check(name: str, alpha: float, answers: Sequence[Answer], q: float, limit: float, measure: str,
                   limit_text: str, allowed: float = 0.0) -> Check:
    """The canary's ``q`` quantile of ``measure`` <= ``limit``: at most a share 1 - q of its calls above the
    limit (+ ``allowed``: the stable's own share above it in the same window), vs ``WORSE[q]`` more."""
    test = _Sprt(alpha, 1.0 - q + allowed, 1.0 - q + allowed + WORSE[q])
    bad, n = _above(answers, limit, measure)
    verdict, llr, leaning = test.verdict(bad, n)
    shown = call_quantile(answers, q, measure)
    what = f"{'inference ' if measure == 'inference' else ''}p{q * 100:g}"
    head = f"{what} {shown:.1f} ms" if shown is not None else f"{what} -"
    share = f"{(1 - q + allowed) * 100:.0f} %"
    if verdict is Verdict.FAIL:
        detail = (f"{head} > {limit_text}: {bad:.0f} of {n:.0f} canary calls above {limit:.1f} ms "
                  f"(more than {share} with {1 - alpha:.2%} confidence)")
    elif verdict is Verdict.PASS:
        detail = f"{head} <= {limit_text} ({bad:.0f} of {n:.0f} calls above {limit:.1f} ms)"
    else:
        detail = (f"{head} vs {limit_text}: {bad:.0f} of {n:.0f} calls above {limit:.1f} ms, "
                  f"undecided until ~{test.needed(bad):.0f} calls")
    return Check(name, verdict, detail, llr, leaning)


def _rate_check(name: str, alpha: float, bad: int, n: int, base: float, increase: float) -> Check:
    """The canary's rate vs the stable's (point estimate, ~9x the canary's samples at 10 %) + the increase."""
    p0 = base + increase
    test = _Sprt(alpha, p0, p0 + WORSE[0.99])
    verdict, llr, leaning = test.verdict(bad, n)
    rate = bad / n if n else 0.0
    head = f"{name} {rate:.2%}"
    limit = f"stable {base:.2%} + {increase:.2%}"
    if verdict is Verdict.FAIL:
        detail = f"{head} > {limit} ({bad} of {n}; {1 - alpha:.2%} confidence)"
    elif verdict is Verdict.PASS:
        detail = f"{head} <= {limit} ({bad} of {n})"
    else:
        detail = f"{head} vs {limit}: {bad} of {n}, undecided until ~{test.needed(bad):.0f} answers"
    return Check(name, verdict, detail, llr, leaning)


def judge(gates: Gates, canary: VersionWindow, stable: VersionWindow, steps: int = 1) -> GateResult:
    """Canary vs stable over the same window (module docstring).  ``steps``: the rollout's number of steps,
    over which (with the gates switched on) ``1 - confidence`` is split."""
    if canary.requests < gates.min_samples:
        return GateResult(Verdict.INCONCLUSIVE,
                          (f"canary answered {canary.requests} < minSamples {gates.min_samples} requests",))
    stable_ok = stable.requests >= gates.min_samples
    tests = (gates.p99_max_ms is not None) + 2 * (gates.p99_max_ratio is not None) + \
        (gates.max_error_rate_increase is not None) + (gates.max_expiry_rate_increase is not None)
    alpha = (1.0 - gates.confidence) / max(1, steps * tests)
    checks: list[Check] = []
    if gates.p99_max_ms is not None:
        # an overloaded machine breaches the SLA with either version: the canary is failed for what it adds
        # to the stable's own share above the limit (same window; at 100 %: the stable's last REFERENCE_S)
        bad_s, n_s = _above(stable.answers if stable_ok else stable.reference, gates.p99_max_ms, "latency")
        checks.append(_latency_check("p99MaxMs", alpha, canary.answers, 0.99, gates.p99_max_ms, "latency",
                                     f"p99MaxMs {gates.p99_max_ms:g}", bad_s / n_s if n_s else 0.0))
    if gates.p99_max_ratio is not None and stable_ok:
        reference = stable.reference or stable.answers
        for q in (0.5, 0.99):  # a canary slower throughout shows in its median long before its p99
            stable_q = call_quantile(reference, q, "inference")
            if stable_q is None:
                continue
            limit = stable_q * gates.p99_max_ratio + gates.p99_slack_ms
            stable_bad, stable_n = _above(stable.answers, limit, "inference")  # a slow machine slows both
            checks.append(_latency_check(f"p{q * 100:g} vs stable", alpha, canary.answers, q, limit, "inference",
                                         f"stable {stable_q:.1f} ms x {gates.p99_max_ratio:g} + "
                                         f"{gates.p99_slack_ms:g} ms", stable_bad / stable_n if stable_n else 0.0))
    if gates.max_error_rate_increase is not None:
        checks.append(_rate_check("error rate", alpha, canary.errors, canary.requests,
                                  stable.error_rate if stable_ok else 0.0, gates.max_error_rate_increase))
    if gates.max_expiry_rate_increase is not None:
        checks.append(_rate_check("expiry rate", alpha, canary.expired, canary.requests,
                                  stable.expiry_rate if stable_ok else 0.0, gates.max_expiry_rate_increase))
    failed = [c.detail for c in checks if c.verdict is Verdict.FAIL]
    if failed:
        return GateResult(Verdict.FAIL, tuple(failed), tuple(checks))
    open_ = [c.detail for c in checks if c.verdict is Verdict.INCONCLUSIVE]
    if open_:
        return GateResult(Verdict.INCONCLUSIVE, tuple(open_), tuple(checks))
    shown = f"{canary.p99_ms:.1f}" if canary.p99_ms is not None else "-"
    summary = (f"canary {canary.requests} requests ({canary.calls:.0f} calls), p99 {shown} ms, errors "
               f"{canary.error_rate:.2%}, expired {canary.expiry_rate:.2%}")
    return GateResult(Verdict.PASS, (summary, *(c.detail for c in checks if c.gate.endswith("vs stable"))),
                      tuple(checks))
