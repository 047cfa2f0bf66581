"""`sie demo` deletes the models it applied (issue 38, item 7): run against a user's own cluster
(SIE_BOOTSTRAP_SERVERS) it left its three models (qwen2-7b-scoring, fraud-scorer, fraud-rules) applied there.  The
demo's steps run against a real broker here, with the processes' steps (control plane, agents, scoring) left out:
only what the demo applies, and what it leaves, is under test; ``--keep-models`` keeps them."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sie.demo import DEMO_SPECS, Demo
from sie.kernel.admin import ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.spec import load
from sie.schemas.spec_store import read_specs

pytestmark = pytest.mark.kafka


def _demo(settings: Settings, keep: bool, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> tuple[Demo, list[str]]:
    lines: list[str] = []
    demo = Demo(settings, lines.append, requests=1, http_port=0, keep_models=keep)

    def cluster() -> None:  # what the real step applies, without starting processes
        for path in DEMO_SPECS:
            demo.apply(load(path, topic_prefix=settings.topic_prefix))

    def scoring() -> None:
        if fail:
            raise RuntimeError("the scoring step failed")

    monkeypatch.setattr(demo, "kafka", lambda: None)
    monkeypatch.setattr(demo, "cluster", cluster)
    monkeypatch.setattr(demo, "scoring", scoring)
    for step in ("cdc", "backfill", "operator_view"):
        monkeypatch.setattr(demo, step, lambda: None)
    return demo, lines


@pytest.mark.parametrize("fail", [False, True], ids=["completed", "failed"])
def test_the_demo_deletes_the_models_it_applied(kafka_settings: Settings, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    settings = kafka_settings.with_overrides(topic_prefix=f"demo{uuid.uuid4().hex[:8]}", cache_dir=tmp_path)
    ensure_topics(settings, system_topics(settings.topic_prefix))
    demo, lines = _demo(settings, False, monkeypatch, fail)
    if fail:
        with pytest.raises(RuntimeError):
            demo.run()
    else:
        demo.run()
    assert read_specs(settings, timeout=20) == {}
    assert any("removing the demo's models (fraud-rules, fraud-scorer, qwen2-7b-scoring)" in line for line in lines)


def test_keep_models_keeps_them(kafka_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = kafka_settings.with_overrides(topic_prefix=f"demo{uuid.uuid4().hex[:8]}", cache_dir=tmp_path)
    ensure_topics(settings, system_topics(settings.topic_prefix))
    demo, _ = _demo(settings, True, monkeypatch)
    demo.run()
    assert sorted(read_specs(settings, timeout=20)) == ["fraud-rules", "fraud-scorer", "qwen2-7b-scoring"]
