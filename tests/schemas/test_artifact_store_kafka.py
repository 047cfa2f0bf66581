"""Artifacts on the real broker: chunked upload, manifest after the chunks, fetch of exactly its range,
content addressing (nothing uploaded twice), and every way a fetch is refused with a reason."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest

from sie.kernel.admin import ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.artifact_cache import ArtifactCache, ArtifactRefused
from sie.schemas.artifact_store import ArtifactStore, Manifest, chunk_size_for, upload_bytes
from sie.schemas.spec_models import ArtifactRef
from tests.support.helpers import forge_artifact

pytestmark = pytest.mark.kafka


@pytest.fixture()
def store(kafka_settings: Settings, tmp_path: Path) -> ArtifactStore:
    prefix = f"a{uuid.uuid4().hex[:10]}"
    # the smallest records SIE allows: 48 KiB chunks, so a few hundred KiB make many chunks
    settings = kafka_settings.with_overrides(topic_prefix=prefix, max_record_bytes=65_536, cache_dir=tmp_path)
    ensure_topics(settings, system_topics(prefix), replication_factor=1)
    return ArtifactStore(settings)


def _fetch(store: ArtifactStore, manifest: Manifest, root: Path) -> Path:
    ref = ArtifactRef(sha256=manifest.sha256, name=manifest.name, size=manifest.size)
    cache = ArtifactCache(root, store.settings.max_artifact_bytes)
    return cache.put(ref, lambda sink: store.fetch(manifest, sink, timeout=30))


def test_upload_then_fetch_round_trips_in_chunks(store: ArtifactStore, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "w.safetensors"
    path.write_bytes(data)
    manifest, uploaded = store.upload_file(path, timeout=30)
    size = chunk_size_for(store.settings)
    assert uploaded and size == 49_152 and manifest.chunks == -(-len(data) // size) == 7
    assert manifest.sha256 == hashlib.sha256(data).hexdigest() and manifest.size == len(data)
    assert manifest.last_offset - manifest.first_offset == manifest.chunks - 1  # one contiguous range
    assert store.lookup(manifest.sha256) == manifest
    again, uploaded_again = store.upload_file(path, timeout=30)
    assert not uploaded_again and again == manifest  # content-addressed: the cluster had the bytes
    assert _fetch(store, manifest, tmp_path / "node-b").read_bytes() == data


def test_bytes_that_do_not_match_their_digest_never_get_a_manifest(store: ArtifactStore) -> None:
    claimed = hashlib.sha256(b"the real file").hexdigest()
    upload = store.begin(claimed, "w.pt", timeout=30)
    upload.add(b"something else")
    with pytest.raises(ArtifactRefused, match="nothing was published"):
        upload.finish()
    assert store.lookup(claimed) is None
    manifest, uploaded = upload_bytes(store, b"the real file", "w.pt", timeout=30)
    assert uploaded and store.lookup(claimed) == manifest  # the same keys again: now complete


def test_a_corrupt_chunk_is_refused_naming_it(store: ArtifactStore, tmp_path: Path) -> None:
    manifest = forge_artifact(store, os.urandom(120_000), corrupt=1)
    with pytest.raises(ArtifactRefused, match=r"chunk 1 is corrupt: its bytes hash to sha256:") as err:
        _fetch(store, manifest, tmp_path / "cache")
    assert "upload the artifact again" in str(err.value)
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))  # nothing half-written stays


def test_a_missing_chunk_is_refused_naming_it(store: ArtifactStore, tmp_path: Path) -> None:
    manifest = forge_artifact(store, os.urandom(120_000), drop=2)
    with pytest.raises(ArtifactRefused, match=r"chunk 2 of 3 not found on .*artifact-chunks"):
        _fetch(store, manifest, tmp_path / "cache")


def test_a_lookup_of_something_never_uploaded_is_none(store: ArtifactStore) -> None:
    assert store.lookup("0" * 64) is None
    assert store.manifests() == {}


def test_an_empty_artifact_is_an_artifact(store: ArtifactStore, tmp_path: Path) -> None:
    manifest, _ = upload_bytes(store, b"", "empty.txt", timeout=30)
    assert manifest.chunks == 0 and _fetch(store, manifest, tmp_path / "c").read_bytes() == b""
