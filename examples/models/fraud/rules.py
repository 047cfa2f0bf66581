"""A transparent rules-based fraud scorer (python backend demo).

Every point of risk comes from a named rule, and ``reason`` lists the rules that fired, so an analyst can read
exactly why a transaction scored what it did: the counterpart to the opaque MLP in ``model.py``.
"""

from __future__ import annotations

from typing import Any

# (name, weight, predicate): weights sum to 1.0, so risk_score is in [0, 1].
RULES: tuple[tuple[str, float, Any], ...] = (
    ("high_amount", 0.20, lambda tx: tx["amount"] >= 1_000),
    ("risky_merchant", 0.20, lambda tx: tx["merchant_risk"] >= 0.7),
    ("night_time", 0.10, lambda tx: tx["hour"] <= 5),
    ("foreign", 0.15, lambda tx: bool(tx["is_foreign"])),
    ("new_account", 0.20, lambda tx: tx["account_age_days"] < 30),
    ("high_velocity", 0.15, lambda tx: tx["tx_count_24h"] >= 10),
)


def score_one(tx: dict[str, Any]) -> dict[str, Any]:
    fired = [(name, weight) for name, weight, rule in RULES if rule(tx)]
    risk = round(min(1.0, sum(weight for _, weight in fired)), 4)
    return {"risk_score": risk, "reason": ",".join(name for name, _ in fired) or "none"}


def score(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Backend entry point (``models.fraud.rules:score``): one output per input, same order."""
    return [score_one(tx) for tx in inputs]
