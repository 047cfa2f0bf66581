"""Every metric SIE exports is named ``sie_*`` (issue 38, item 7): ``inference_latency_seconds`` was the one without
the prefix, so a ``{__name__=~"sie_.*"}`` selection, a relabel rule or a dashboard filter missed it.  The dashboards,
rules and docs use the new name (tests/infra/test_prometheus_rules.py checks the rules' selectors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sie.connectors.cdc_stage import CdcMetrics
from sie.control.service import ControlMetrics
from sie.streams.llm.metrics import LLMMetrics
from sie.streams.scorer.metrics import ScorerMetrics
from sie.workers.metrics import AgentMetrics


def _names(registry: CollectorRegistry) -> set[str]:
    return {metric.name for metric in registry.collect()}


def test_every_exported_metric_starts_with_sie():
    llm = CollectorRegistry()
    LLMMetrics("m", llm)
    registries = {
        "scorer": ScorerMetrics("m", "scoring", "P1", "1.0.0").registry,
        "agent": AgentMetrics("node-a").registry,
        "control": ControlMetrics().registry,
        "llm": llm,
        "cdc": CdcMetrics("c").registry,
    }
    unprefixed = {owner: sorted(n for n in _names(r) if not n.startswith("sie_")) for owner, r in registries.items()}
    assert unprefixed == {owner: [] for owner in registries}
    assert "sie_inference_latency_seconds" in _names(registries["scorer"])
