"""A record on ``<p>.rollouts`` (control's Write) names the specs a scorer serves during a rollout.  A canary spec
the node's policy refuses (a system topic as its results, code outside the allow-list) never loads: no replica
serves its share with another version (each refuses its batches, saying why, and holds no partitions); a record that cannot be read is refused once with
its reason and never stalls the scorer (before: every batch raised on it again).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.spec_policy import SpecPolicy
from sie.streams.scorer.errors import VersionsNotReady
from sie.streams.scorer.loop import ScorerConfig
from sie.streams.scorer.rollout import InProcessVersions, RolloutScorer
from sie.streams.scorer.routing import RoutingTable
from tests.streams.scorer.test_rollout_routing import Backend, Source, batch, echo_spec, record


def _scorer() -> tuple[RolloutScorer, Source, list[str], Any]:
    spec = echo_spec()
    loaded: list[str] = []
    policy = SpecPolicy(allowed_modules=("tests",))

    def factory(model_spec: Any) -> Backend:  # what a companion's preparation does first: the node's policy
        policy.enforce(model_spec, source=f"rollout to {model_spec.version}")
        loaded.append(model_spec.version)
        return Backend(model_spec.version, 3.0)

    scorer = RolloutScorer(ScorerConfig(settings=Settings(), spec=spec, instance="t-0"),
                           RoutingTable.single("1.0.0", Backend("1.0.0", 2.0)), weights=(source := Source()),
                           versions=InProcessVersions(factory))
    return scorer, source, loaded, spec


@pytest.mark.parametrize(("canary", "reason"), [
    ({"topics": {"requests": "sie.model.x.requests", "results": "sie.specs", "dead_letters": "x.dlq",
                 "backfill": "x.bf"}}, "spec.topics.results: sie.specs is SIE's system topic"),
    ({"backend": {"type": "python", "callable": "subprocess:Popen"}}, "module 'subprocess' is not in this node's"),
])
def test_a_rollout_to_a_refused_spec_never_loads_and_no_version_answers_its_share(canary, reason):
    scorer, source, loaded, spec = _scorer()
    doc = {**spec.to_document(), "version": "1.1.0", **canary}
    source.record = record(spec, doc, "Canary", 5000, 1)
    with pytest.raises(VersionsNotReady, match="1.1.0 not ready here") as refused:
        scorer.prepare(batch(spec, 40))
    assert reason in str(refused.value) and loaded == [] and not scorer.serving()


def test_an_unreadable_rollout_record_is_refused_once_not_raised_on_every_batch(caplog: pytest.LogCaptureFixture):
    scorer, source, loaded, spec = _scorer()
    source.record = {**record(spec, spec.to_document(), "Canary", 5000, 2), "canary_spec_json": "{not json"}
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            assert {json.loads(o.value)["version"] for o in scorer.prepare(batch(spec, 5)).outputs} == {"1.0.0"}
        scorer.apply_latest()  # the idle tick too
    refusals = [r.getMessage() for r in caplog.records if "unreadable rollout record refused" in r.getMessage()]
    assert len(refusals) == 1 and "JSONDecodeError" in refusals[0] and loaded == []
