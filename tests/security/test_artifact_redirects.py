"""Hole 9: artifact URI redirects were followed to hosts the source allow-list never checked, and the refusal
showed part of the fetched bytes' hash.  Now a 3xx is refused without following it (nor echoing its Location),
and a refusal never shows the digest or size of what was fetched.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sie.schemas.artifact_cache import ArtifactCache, ArtifactRefused, download
from sie.schemas.spec_models import ArtifactRef
from tests.security.http_stub import StubServer

SECRET = b"internal admin page: token=abc123"


def test_a_redirect_is_refused_not_followed_and_its_location_not_shown(tmp_path: Path):
    target = StubServer(200)
    source = StubServer(302, location=target.url + "/latest/meta-data?sig=SECRET")
    try:
        ref = ArtifactRef(sha256="0" * 64, name="w.safetensors", uri=source.url + "/w.safetensors")
        cache = ArtifactCache(tmp_path, 1 << 20)
        with pytest.raises(ArtifactRefused, match=r"HTTP 302, a redirect; SIE does not follow them") as refused:
            cache.put(ref, lambda sink: download(ref.uri, sink, timeout=10))
        assert source.hits == ["/w.safetensors"] and target.hits == []
        assert "meta-data" not in str(refused.value) and "SECRET" not in str(refused.value)
    finally:
        source.close()
        target.close()


def test_a_digest_mismatch_never_tells_the_digest_or_size_of_what_was_fetched(tmp_path: Path):
    ref = ArtifactRef(sha256="0" * 64, name="w.safetensors", size=5)
    with pytest.raises(ArtifactRefused) as refused:
        ArtifactCache(tmp_path, 1 << 20).put(ref, lambda sink: sink.write(SECRET))
    text = str(refused.value)
    digest = hashlib.sha256(SECRET).hexdigest()
    assert "do not hash to the sha256 the spec names" in text
    assert not any(digest[i:i + 8] in text for i in range(0, 57)) and str(len(SECRET)) not in text
