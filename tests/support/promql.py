"""What SIE's Prometheus rules and Grafana dashboard query, read from their files (for the tests that prove
those queries match what SIE exports: tests/infra/test_prometheus_rules.py, tests/test_observability_e2e.py).

``selectors(expr)``: the vector selectors of a PromQL expression (metric name + label matchers), found by a
small tokenizer: label lists after ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` and
range durations are dropped, an identifier followed by ``(`` is a function or aggregation, the rest are
series names (recording rules' ``a:b:c`` names included).  Enough for the expressions SIE ships.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "infra" / "prometheus" / "sie-rules.yml"
DASHBOARD = REPO / "infra" / "grafana" / "sie-overview.json"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r'\{[^}]*\}|\[[^\]]*\]|\d+(?:\.\d+)?(?:e[+-]?\d+)?|[A-Za-z_:][A-Za-z0-9_:]*|\S')
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)

    def promql(self) -> str:
        inner = ",".join(f'{label}{op}"{value}"' for label, op, value in self.matchers)
        return f"{self.name}{{{inner}}}" if inner else self.name


def selectors(expr: str) -> list[Selector]:
    text = _GROUPING.sub(" ", expr)
    tokens = [m.group(0) for m in _TOKEN.finditer(text)]
    found: list[Selector] = []
    for i, tok in enumerate(tokens):
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) or tok.lower() in _KEYWORDS:
            continue
        after = tokens[i + 1] if i + 1 < len(tokens) else ""
        if after == "(":
            continue  # a function or an aggregation
        matchers = tuple(_MATCHER.findall(after)) if after.startswith("{") else ()
        found.append(Selector(tok, matchers))
    return found


@dataclass(frozen=True)
class Query:
    where: str  # "rule <name>" or "panel <title> (<refId>)"
    expr: str


def rule_queries() -> list[Query]:
    doc = yaml.safe_load(RULES.read_text())
    return [Query(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for g in doc["groups"] for r in g["rules"]]


def recorded_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def alert_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def panel_queries() -> list[Query]:
    dash = json.loads(DASHBOARD.read_text())
    return [Query(f"panel {p['title']!r} ({t['refId']})", t["expr"])
            for p in dash["panels"] if p.get("type") != "row" for t in p.get("targets", ())]


def readme_promql() -> str:
    """The PromQL line the README shows (its first ```promql block)."""
    text = (REPO / "README.md").read_text()
    match = re.search(r"```promql\n(.+?)\n```", text, re.S)
    assert match, "README.md has no ```promql block"
    return match.group(1).strip()
