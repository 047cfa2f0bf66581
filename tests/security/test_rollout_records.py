"""A record on ``<p>.rollouts`` (control's Write) names the specs a scorer loads for a rollout.  A record whose
canary spec the node's policy refuses, or that cannot be read, is a refusal logged with its reason once: the
replica keeps serving its own version, nothing of the refused spec is loaded, no batch is retried for it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.spec_policy import SpecPolicy
from sie.streams.scorer.loop import ScorerConfig
from sie.streams.scorer.rollout import RolloutScorer
from sie.streams.scorer.routing import RoutingTable
from sie.workers.worker_main import version_loader
from tests.streams.scorer.test_rollout_routing import Backend, Source, batch, echo_spec, record


def _scorer() -> tuple[RolloutScorer, Source, list[str], Any]:
    spec = echo_spec()
    loaded: list[str] = []

    def load(model_spec):
        loaded.append(model_spec.version)
        return Backend(model_spec.version, 3.0)

    own = Backend("1.0.0", 2.0)
    factory = version_loader(spec, own, SpecPolicy(allowed_modules=("tests",)), lambda s: s, "test")
    source = Source()
    scorer = RolloutScorer(ScorerConfig(settings=Settings(), spec=spec, instance="t-0"),
                           RoutingTable.single("1.0.0", own), weights=source,
                           backend_factory=lambda s: factory(s) if s.version == "1.0.0" else (factory(s), load(s))[1])
    return scorer, source, loaded, spec


@pytest.mark.parametrize(("canary", "reason"), [
    ({"topics": {"requests": "sie.specs", "results": "sie.assignments", "dead_letters": "x.dlq", "backfill": "x.bf"}},
     "spec.topics.requests: sie.specs is SIE's system topic"),
    ({"backend": {"type": "python", "callable": "subprocess:Popen"}}, "module 'subprocess' is not in this node's"),
])
def test_a_rollout_to_a_refused_spec_is_refused_once_and_the_own_version_keeps_serving(canary, reason, caplog):
    scorer, source, loaded, spec = _scorer()
    doc = {**spec.to_document(), "version": "1.1.0", **canary}
    source.record = record(spec, doc, "Canary", 5000, 1)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            prepared = scorer.prepare(batch(spec, 20))
            assert {json.loads(o.value)["version"] for o in prepared.outputs} == {"1.0.0"}
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and reason in refusals[0] and "keeps serving 1.0.0" in refusals[0]
    assert loaded == [] and scorer.epoch == 0


def test_an_unreadable_rollout_record_is_refused_not_retried(caplog):
    scorer, source, loaded, spec = _scorer()
    source.record = {**record(spec, spec.to_document(), "Canary", 5000, 2), "canary_spec_json": "{not json"}
    with caplog.at_level(logging.ERROR):
        for _ in range(2):
            assert len(scorer.prepare(batch(spec, 5)).outputs) == 5
    assert [r.getMessage() for r in caplog.records if "unreadable rollout record" in r.getMessage()] != []
    assert loaded == []
