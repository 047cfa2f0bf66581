"""A new leader's read barrier on a real broker (``StateFeeder.sync``): what the unit tests' fake consumer
cannot show is how librdkafka reports the end of a partition that ends in a transaction marker, and one whose
last transaction was aborted by the fencing of its writer (the old leader killed mid-transaction).

Each test: a state feeder caught up on fresh control topics, then the control plane's transactional writer
(the shared ``transactional.id`` every leader uses) commits or leaves a transaction open, a new writer fences
it, and the barrier asked for after that must be reached, with the committed record applied and the aborted
one not.
"""

from __future__ import annotations

import time
import uuid

import pytest

from sie.control.reconcile.feeder import StateFeeder
from sie.control.reconcile.records import ClusterState
from sie.kernel.admin import ensure_topics
from sie.kernel.clients import transactional_producer_config
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import encode
from tests.support.helpers import wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture()
def settings(kafka_settings):
    prefix = f"tko{uuid.uuid4().hex[:8]}"
    s = kafka_settings.with_overrides(topic_prefix=prefix)
    ensure_topics(s, system_topics(prefix))
    return s


def _writer(settings):
    """The leader's transactional producer (init_transactions fences any earlier one of the same id)."""
    from confluent_kafka import Producer

    producer = Producer(transactional_producer_config(settings, settings.names.control_transactional_id))
    producer.init_transactions(30)
    return producer


def _assignment(settings, producer, node: str, epoch: int) -> None:
    producer.produce(settings.names.system_topic("assignments"), key=node.encode(),
                     value=encode("Assignment", {"node": node, "epoch": epoch, "issued_at_ms": 1, "replicas": []}))


def test_a_barrier_covers_the_old_leaders_last_commit_and_passes_its_fenced_open_transaction(settings):
    state = ClusterState()
    feeder = StateFeeder(settings, state).start()
    try:
        wait_until(feeder.caught_up.is_set, 30, message="the feeder caught up on empty topics")
        old = _writer(settings)
        old.begin_transaction()
        _assignment(settings, old, "node-a", 5)
        old.commit_transaction(30)  # the old leader's last pass
        old.begin_transaction()
        _assignment(settings, old, "node-b", 6)
        old.flush(10)  # written, never committed: the old leader dies here
        new = _writer(settings)  # the election: fences the old writer, aborts its open transaction
        try:
            asked = time.monotonic()
            barrier = feeder.sync()
            wait_until(barrier.reached, 30, message=lambda: f"the barrier reached ({barrier.describe()})")
            took = time.monotonic() - asked
            assert state.assignments["node-a"].epoch == 5, "the last commit is applied before the barrier says so"
            assert "node-b" not in state.assignments, "an aborted transaction is never applied"
            topic = settings.names.system_topic("assignments")
            # the ends it waited for: the committed record + its marker, the aborted one + the abort marker
            assert barrier.ends is not None and sum(end for (t, _p), end in barrier.ends.items() if t == topic) == 4
            print(f"read barrier over {len(barrier.ends)} partitions: {took:.2f}s")
        finally:
            new.flush(10)
    finally:
        feeder.stop()

