"""`sie describe model` read from Kafka says when no control plane runs (issue 38, item 7): it printed ``Phase: Ready``
from the last ModelStatus a leader published, with no hint that nothing reconciles the model any more."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from sie.control.reconcile.status import ModelStatus
from sie.kernel.admin import ensure_topics
from sie.kernel.clients import KafkaClients
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import encode
from sie.schemas.spec_store import produce_acknowledged, publish_spec, spec_from_record
from tests.control.reconcile.test_control_unit import spec_record
from tests.support.cluster_harness import REPO
from tests.support.helpers import wait_until

pytestmark = pytest.mark.kafka


def _describe(settings: Settings, prefix: str) -> str:
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "SIE_TOPIC_PREFIX": prefix}
    done = subprocess.run([sys.executable, "-m", "sie", "describe", "model", "alpha"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_describe_says_no_control_plane_runs_and_not_once_one_does(kafka_settings: Settings) -> None:
    prefix = f"nolead{uuid.uuid4().hex[:8]}"
    settings = kafka_settings.with_overrides(topic_prefix=prefix)
    ensure_topics(settings, system_topics(prefix))
    spec = spec_from_record(spec_record("alpha", 0, replicas=1))
    publish_spec(settings, spec, ensure_topic=False)
    status = ModelStatus("alpha", spec.version, "P1", "scoring", "Ready", None, 1, 1, (), epoch=1,
                         updated_at_ms=int(time.time() * 1000))
    produce_acknowledged(settings, [("alpha", encode("ModelStatus", status.to_record()))], 30,
                         topic=settings.names.system_topic("model-status"))

    out = _describe(settings, prefix)
    assert "Phase:       Ready (last published)" in out, out
    assert f"Control:     no control plane is running (group {prefix}.control has no members)" in out, out

    # a member of the control group (as every `sie control` instance is): no hint
    member = KafkaClients().consumer(settings.kafka_client_config(**{
        "group.id": settings.names.control_group, "enable.auto.commit": False, "session.timeout.ms": 6000}))
    try:
        member.subscribe([settings.names.system_topic("control-leader")])
        wait_until(lambda: member.poll(0.2) is None and member.assignment(), 30, 0.0, "joined the control group")
        out = _describe(settings, prefix)
        assert "Phase:       Ready\n" in out and "Control:" not in out, out
    finally:
        member.close()
