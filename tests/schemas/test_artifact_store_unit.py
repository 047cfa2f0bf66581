"""The artifact manifests are replayed by ``sie.kernel.replay`` (issue 39): to the ends the topic has when the read
starts, a transient refusal of those ends retried, a read that cannot reach them refused naming the partition short
of its end.  No broker: ``tests/fakes/kafka_clients``; the broker round trips are in test_artifact_store_kafka."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import ArtifactUnavailable
from sie.schemas.artifact_store import RECORD, ArtifactStore, Manifest
from sie.schemas.avro_codec import encode
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, fake_clients, kafka_error

SETTINGS = Settings()
TOPIC = SETTINGS.names.system_topic("artifacts")


def _manifest(digest: str) -> Manifest:
    return Manifest(digest, "model.bin", 100_000, 65_536, 2, 0, 0, 1, 1)


def _record(offset: int, manifest: Manifest) -> FakeMessage:
    return FakeMessage(TOPIC, 0, offset, key=f"sha256:{manifest.sha256}".encode(),
                       value=encode(RECORD, manifest.to_record()))


def test_the_manifests_are_read_to_their_end_after_a_refused_end_is_retried() -> None:
    first, second = _manifest("a" * 64), _manifest("b" * 64)
    consumer = FakeConsumer([_record(0, first), _record(1, second)],
                            faults={"get_watermark_offsets": [kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION)]})
    store = ArtifactStore(SETTINGS, clients=fake_clients(consumer=consumer).clients)
    assert store.manifests(timeout=10) == {first.sha256: first, second.sha256: second}
    assert len(consumer.called("get_watermark_offsets")) == 2  # refused once (a leader moving), asked again
    assert consumer.closed


def test_a_manifests_topic_not_read_to_its_end_names_the_partition_short_of_it() -> None:
    consumer = FakeConsumer([_record(0, _manifest("a" * 64))])
    consumer.set_watermarks(TOPIC, 0, high=5)  # the broker has records this reader is never sent
    store = ArtifactStore(SETTINGS, clients=fake_clients(consumer=consumer).clients)
    with pytest.raises(ArtifactUnavailable) as refused:
        store.manifests(timeout=1)
    text = str(refused.value)
    assert f"{TOPIC}[0] at 1 of 5" in text and "sie topics list" in text, text
    assert consumer.closed
