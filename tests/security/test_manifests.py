"""Hole 4: an artifact manifest was trusted before it was checked: ``chunks = 2**31-1`` under a real artifact's key
made every fetching agent build ``set(range(chunks))`` (MemoryError / OOM kill).  Now ``Manifest.from_record``
checks every number against the others before anything is sized by it, the latest invalid record of a key makes
the artifact refused with the reason (no crash, no allocation), and a re-upload of the bytes heals it.
"""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

from sie.kernel.admin import ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.artifact_cache import ArtifactRefused
from sie.schemas.artifact_store import ArtifactStore, Manifest
from sie.schemas.avro_codec import encode
from sie.schemas.spec_models import ArtifactRef
from sie.workers.agent.artifacts import ArtifactFetcher
from sie.workers.process import LaunchRefused
from tests.support.helpers import wait_until

SHA = "ab" * 32
GOOD = Manifest(SHA, "w.safetensors", 300_000, 49_152, 7, 1, 10, 16, 1)
MAX = 8 << 30


@pytest.mark.parametrize(("change", "reason"), [
    ({"chunks": 2**31 - 1}, "chunks 2147483647 is not ceil(size / chunk_size) = 7"),
    ({"chunks": 0}, "chunks 0 is not ceil(size / chunk_size) = 7"),
    ({"size": MAX + 1, "chunks": -(-(MAX + 1) // 49_152)}, "is not between 0 and max_artifact_bytes"),
    ({"chunk_size": 1, "chunks": 300_000}, "chunk_size 1 is not between 16384 and 524288"),
    ({"chunk_size": 0}, "chunk_size 0 is not between"),
    ({"last_offset": 12}, "offsets 10..12 cannot hold 7 chunks"),
    ({"first_offset": 20}, "must be a partition and an offset range"),
    ({"chunk_partition": -1}, "must be a partition and an offset range"),
    ({"chunks": "7"}, "chunks must be whole numbers"),
    ({"size": True}, "size must be whole numbers"),
    ({"sha256": "../../etc"}, "sha256 must be 64 lowercase hex digits"),
    ({"name": "../x"}, "name must be a plain file name"),
])
def test_a_manifest_is_checked_in_full_before_anything_is_sized_by_it(change: dict[str, Any], reason: str):
    record = {**GOOD.to_record(), **change}
    tracemalloc.start()
    with pytest.raises(ArtifactRefused, match="manifest sha256:") as refused:
        Manifest.from_record(record, MAX)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert reason in str(refused.value) and peak < 1 << 20
    assert Manifest.from_record(GOOD.to_record(), MAX) == GOOD
    with pytest.raises(ArtifactRefused, match="its key names sha256:cdcdcdcdcdcd"):
        Manifest.from_record(GOOD.to_record(), MAX, key_digest="cd" * 32)


def test_fetch_itself_refuses_an_unchecked_manifest_a_caller_built():
    store = ArtifactStore.__new__(ArtifactStore)
    store.settings = Settings()
    with pytest.raises(ArtifactRefused, match="chunks 2147483647 is not ceil"):
        store.fetch(dataclasses.replace(GOOD, chunks=2**31 - 1), sink=None)  # type: ignore[arg-type]


@pytest.mark.kafka
def test_a_forged_manifest_on_the_broker_is_a_named_refusal_not_an_oom_and_a_reupload_heals_it(
        kafka_settings: Settings, tmp_path: Path):
    from confluent_kafka import Producer

    prefix = f"m{uuid.uuid4().hex[:10]}"
    settings = kafka_settings.with_overrides(topic_prefix=prefix, max_record_bytes=65_536, cache_dir=tmp_path)
    ensure_topics(settings, system_topics(prefix), replication_factor=1)
    store = ArtifactStore(settings)
    data = os.urandom(120_000)
    artifact = tmp_path / "w.safetensors"
    artifact.write_bytes(data)
    real, _ = store.upload_file(artifact, timeout=30)
    producer = Producer(settings.kafka_client_config(**{"acks": "all"}))  # whoever holds Write on <p>.artifacts
    forged = {**real.to_record(), "chunks": 2**31 - 1}
    producer.produce(store.manifest_topic, key=settings.names.artifact_key(real.sha256).encode(),
                     value=encode("ArtifactManifest", forged))
    assert producer.flush(30) == 0

    assert store.lookup(real.sha256) is None
    assert "chunks 2147483647 is not ceil(size / chunk_size) = 3" in store.invalid[real.sha256]
    ref = ArtifactRef(sha256=real.sha256, name="w.safetensors", size=len(data))
    fetcher = ArtifactFetcher(settings, policy=None, store=store, backoff_initial_s=0.1)
    tracemalloc.start()
    try:
        def refused() -> str | None:
            try:
                fetcher.resolve(ref)
            except LaunchRefused as exc:
                return str(exc)
            except Exception:  # LaunchDeferred while the fetch runs
                return None
            return "resolved"
        reason = wait_until(refused, timeout=60, message="the fetch of a forged manifest ends")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        fetcher.close()
    assert reason.startswith(f"artifact sha256:{real.sha256[:12]} (w.safetensors): its manifest on {prefix}.artifacts "
                             "is refused (manifest sha256:")
    assert "chunks 2147483647" in reason and peak < 64 << 20
    healed, uploaded = store.upload_file(artifact, timeout=30)  # the same bytes again: a valid manifest wins
    assert uploaded and store.lookup(real.sha256) == healed
