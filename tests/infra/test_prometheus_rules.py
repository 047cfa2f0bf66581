"""SIE's Prometheus rules and Grafana dashboard as tested code.

- Without Prometheus: every series a rule, a dashboard panel or the README's PromQL line names is one
  SIE exports (scorer, agent, control plane), with the labels its matchers use (this is what caught
  ``sie_control_nodes{state=...}`` without a ``state`` label and a GPU panel on a series nothing exports).
- With ``promtool`` (Debian package ``prometheus``; the tests skip, saying so, where it is absent):
  ``promtool check rules`` and ``promtool test rules tests/infra/sie-rules.test.yml``, in which every
  alert has a case where it fires and one where it stays quiet.

The live proof (a real Prometheus scraping a real cluster) is tests/test_observability_e2e.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sie.control.service import ControlMetrics
from sie.streams.scorer.metrics import ScorerMetrics
from sie.workers.metrics import AgentMetrics
from tests.support.promql import (
    RULES,
    alert_names,
    panel_queries,
    readme_promql,
    recorded_names,
    rule_queries,
    selectors,
)

RULE_TESTS = Path(__file__).resolve().parent / "sie-rules.test.yml"
#: labels Prometheus adds to every scraped series (the control plane's http_sd target labels, job, instance)
TARGET_LABELS = {"job", "instance", "sie_component", "sie_node", "sie_replica", "sie_model"}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus; scripts/setup.sh "
                             "installs it where it can): rule syntax and alert unit tests skipped")


def exported_series() -> dict[str, set[str]]:
    """Sample name -> label names, over every registry SIE's processes export."""
    out: dict[str, set[str]] = {}
    registries = (ScorerMetrics("m", "scoring", "P0", "1", p99_budget_ms=50).registry, ControlMetrics().registry,
                  AgentMetrics("n").registry)
    for registry in registries:
        for collector, names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()) or getattr(collector, "labelnames", ()))
            for name in names:
                out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def test_every_series_the_rules_panels_and_readme_name_is_exported_with_its_labels():
    exported, recorded = exported_series(), recorded_names()
    queries = [*rule_queries(), *panel_queries()]
    assert len(queries) >= 20
    problems = []
    for where, expr in [(q.where, q.expr) for q in queries] + [("README PromQL", readme_promql())]:
        for sel in selectors(expr):
            if sel.name in recorded:
                continue
            if sel.name not in exported:
                problems.append(f"{where}: {sel.name} is not exported by SIE")
                continue
            unknown = {label for label, _op, _v in sel.matchers} - exported[sel.name] - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {sel.promql()} matches on {sorted(unknown)}, which {sel.name} lacks")
    assert not problems, "\n".join(problems)


def test_the_selector_reader_sees_what_it_must():
    found = selectors('max by (state) (sie_control_nodes{state="offline"}) > on (model_id) group_left () '
                      'rate(sie_x_total[5m]) / sie:rec:sum')
    assert [s.promql() for s in found] == ['sie_control_nodes{state="offline"}', "sie_x_total", "sie:rec:sum"]


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_stays_quiet():
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fires, quiet = set(), set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", ()):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alert_names() - fires == set(), "alerts never shown firing"
    assert alert_names() - quiet == set(), "alerts never shown quiet"


@needs_promtool
def test_promtool_check_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_unit_tests_of_every_alert():
    done = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
