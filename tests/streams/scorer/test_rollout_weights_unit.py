"""The rollouts reader of a scorer (``KafkaWeightSource``) is a read barrier by ``sie.kernel.replay``'s rule
(issue 39): caught up when every partition's position reaches the end taken at ``refresh``, a refused end is
asked again rather than guessed, and a topic that ends on a commit marker is read to its end although no record
lies there.  No broker: ``tests/fakes/kafka_clients``."""

from __future__ import annotations

from confluent_kafka import KafkaError

from sie.kernel.settings import Settings
from sie.schemas.avro_codec import encode
from sie.streams.scorer.rollout import KafkaWeightSource
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, kafka_error

SETTINGS = Settings()
TOPIC = SETTINGS.names.system_topic("rollouts")


def _rollout(offset: int, epoch: int, model: str = "m") -> FakeMessage:
    record = {"model": model, "stable_version": "1.0.0", "canary_version": "1.1.0", "phase": "Progressing",
              "step": 0, "weight_bp": 100 * epoch, "epoch": epoch, "stable_spec_json": "{}", "canary_spec_json": "{}",
              "started_ms": 1, "phase_since_ms": 1, "reason": "", "policy_json": "{}", "events": [],
              "updated_at_ms": 1}
    return FakeMessage(TOPIC, 0, offset, key=model.encode(), value=encode("Rollout", record))


def test_a_refused_end_is_asked_again_and_the_reader_waits_for_what_the_broker_has() -> None:
    consumer = FakeConsumer([_rollout(0, 1), _rollout(2, 2)],
                            faults={"get_watermark_offsets": [kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION)]})
    consumer.add_marker(TOPIC, 0, 1)
    consumer.add_marker(TOPIC, 0, 3)
    consumer.set_watermarks(TOPIC, 0, high=6)  # a newer epoch is committed but not fetched yet
    source = KafkaWeightSource(SETTINGS, "m", consumer_factory=consumer.configure)
    assert len(consumer.called("get_watermark_offsets")) == 2  # refused once, asked again: the end is known
    assert not source.caught_up(), "caught up before the end the broker reported"
    assert source.latest()["epoch"] == 2
    consumer.append(_rollout(4, 3))
    consumer.add_marker(TOPIC, 0, 5)  # the topic ends on a commit marker: no record at end - 1
    assert source.wait_caught_up(10)
    assert source.latest()["epoch"] == 3
    source.close()


def test_refresh_takes_the_end_now_and_the_barrier_passes_a_trailing_marker() -> None:
    consumer = FakeConsumer([_rollout(0, 1)])
    consumer.add_marker(TOPIC, 0, 1)
    source = KafkaWeightSource(SETTINGS, "m", consumer_factory=consumer.configure)
    assert source.wait_caught_up(10) and source.latest()["epoch"] == 1
    consumer.append(_rollout(2, 4))  # a newer epoch committed by the leader while this replica was serving
    consumer.add_marker(TOPIC, 0, 3)
    source.refresh()
    assert source.wait_caught_up(10), "the barrier did not pass the trailing commit marker"
    assert source.latest()["epoch"] == 4
    source.close()


def test_an_end_that_cannot_be_asked_is_waited_for_until_the_catch_up_limit(monkeypatch) -> None:
    from sie.streams.scorer import rollout

    monkeypatch.setattr(rollout, "CATCH_UP_LIMIT_S", 0.5)
    consumer = FakeConsumer([_rollout(0, 1)],
                            faults={"get_watermark_offsets": kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED)})
    source = KafkaWeightSource(SETTINGS, "m", consumer_factory=consumer.configure)
    assert not source.caught_up(), "an unknown end was taken as reached"
    assert source.wait_caught_up(10)  # the limit passed: it goes on with what it read
    assert source.latest()["epoch"] == 1
    source.close()
