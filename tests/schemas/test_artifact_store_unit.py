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


CHUNKS = SETTINGS.names.system_topic("artifact-chunks")
DATA = bytes(range(256)) * 156 + b"tail"  # 39,940 bytes: 3 chunks of 16 KiB
CHUNK = 16_384


def _chunk_log(digest: str, offsets: dict[int, int]) -> list[FakeMessage]:
    """``offsets``: offset -> chunk index; other artifacts' chunks lie before and after."""
    import hashlib

    out = [FakeMessage(CHUNKS, 0, 0, key=b"sha256:" + b"f" * 64 + b"/0", value=b"x")]
    for offset, index in offsets.items():
        chunk = DATA[index * CHUNK:(index + 1) * CHUNK]
        out.append(FakeMessage(CHUNKS, 0, offset, key=f"sha256:{digest}/{index}".encode(), value=chunk,
                               headers=[("sie.sha256", hashlib.sha256(chunk).hexdigest().encode())]))
    return out


def _never_idle(_consumer: FakeConsumer) -> None:
    raise AssertionError("the fetch waited for more than its range")


def test_a_fetch_reads_its_range_to_the_manifests_last_offset_and_no_further() -> None:
    import hashlib
    import io

    digest = hashlib.sha256(DATA).hexdigest()
    manifest = Manifest(digest, "m.bin", len(DATA), CHUNK, 3, 0, 1, 3, 1)
    records = _chunk_log(digest, {1: 0, 2: 1, 3: 2})
    records.append(FakeMessage(CHUNKS, 0, 4, key=f"sha256:{digest}/0".encode(), value=b"not in the range"))
    consumer = FakeConsumer(records, on_idle=_never_idle)
    sink = io.BytesIO()
    ArtifactStore(SETTINGS, clients=fake_clients(consumer=consumer).clients).fetch(manifest, sink, timeout=10)
    assert sink.getvalue() == DATA
    assert consumer.closed


def test_a_range_cut_short_by_the_partitions_end_names_the_missing_chunk() -> None:
    import hashlib
    import io

    from sie.schemas.artifact_cache import ArtifactRefused

    digest = hashlib.sha256(DATA).hexdigest()
    manifest = Manifest(digest, "m.bin", len(DATA), CHUNK, 3, 0, 1, 3, 1)
    consumer = FakeConsumer(_chunk_log(digest, {1: 0, 2: 1}), on_idle=_never_idle)  # the partition ends at 3
    store = ArtifactStore(SETTINGS, clients=fake_clients(consumer=consumer).clients)
    with pytest.raises(ArtifactRefused, match=r"chunk 2 of 3 not found on .*artifact-chunks\[0\]"):
        store.fetch(manifest, io.BytesIO(), timeout=10)
