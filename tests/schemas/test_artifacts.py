"""Artifacts named by content, without Kafka: the spec forms, the policy on URIs and cached copies, the
node's cache (verify-then-rename), downloads (file://, http(s)://, fsspec), and module archives."""

from __future__ import annotations

import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import (
    ArtifactCache,
    ArtifactRefused,
    ArtifactUnavailable,
    download,
    file_sha256,
    safe_uri,
)
from sie.schemas.module_bundle import build_bundle, check_bundle, module_of
from sie.schemas.spec import InvalidSpec, load
from sie.schemas.spec_models import ArtifactRef
from sie.schemas.spec_policy import SpecPolicy

SHA = "ab" * 32


def _torch_doc(artifact: Any, **backend: Any) -> dict[str, Any]:
    return {"name": "m", "version": "1", "backend": {"type": "torch", "artifact": artifact,
                                                      "moduleClass": "models.fraud.model:FraudMLP", **backend},
            "exampleInput": {"x": 1.0}, "inputSchema": {"fields": [{"name": "x", "type": "float"}]}}


# ---------------------------------------------------------------------------------------- spec forms


def test_a_uri_artifact_needs_its_sha256() -> None:
    with pytest.raises(InvalidSpec) as err:
        load(_torch_doc("https://models.example.com/m.safetensors"))
    assert "backend.sha256: required with an artifact URI" in str(err.value)
    spec = load(_torch_doc("https://models.example.com/m.safetensors", sha256=SHA.upper()))
    ref = spec.backend.artifact_ref
    assert ref == ArtifactRef(sha256=SHA, name="m.safetensors", uri="https://models.example.com/m.safetensors")
    assert spec.backend.artifact is None and spec.backend.format == "safetensors"


def test_an_uploaded_artifact_is_a_mapping_by_sha256() -> None:
    spec = load(_torch_doc({"sha256": SHA, "name": "w.safetensors", "size": 12}))
    assert spec.backend.artifact_ref == ArtifactRef(sha256=SHA, name="w.safetensors", size=12)
    with pytest.raises(InvalidSpec) as err:
        load(_torch_doc({"sha256": "xyz", "name": "w.safetensors"}))
    assert "backend.artifact.sha256: must be 64 hex digits" in str(err.value)
    with pytest.raises(InvalidSpec) as err:
        load(_torch_doc({"sha256": SHA}))  # no name, no format: nothing tells the format
    assert "cannot infer the format" in str(err.value)


def test_a_relative_path_without_a_spec_file_says_what_to_do() -> None:
    with pytest.raises(InvalidSpec) as err:
        load(_torch_doc("weights/m.safetensors"))  # e.g. POST /v1/models: there is no file
    text = str(err.value)
    assert "needs a spec file to resolve it against" in text and "sie apply -f" in text
    assert "relative to the spec file)" not in text


def test_a_local_artifact_with_the_wrong_sha256_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "m.safetensors"
    weights.write_bytes(b"weights")
    with pytest.raises(InvalidSpec) as err:
        load(_torch_doc("m.safetensors", sha256=SHA), base_dir=tmp_path)
    assert f"has sha256 {hashlib.sha256(b'weights').hexdigest()}" in str(err.value)
    spec = load(_torch_doc("m.safetensors", sha256=hashlib.sha256(b"weights").hexdigest()), base_dir=tmp_path)
    assert spec.backend.artifact == weights


def test_modules_are_named_by_sha256_for_python_and_torch_only() -> None:
    doc = {"name": "r", "version": "1", "backend": {"type": "python", "callable": "churn:score",
                                                    "modules": {"sha256": SHA, "size": 10}}}
    assert load(doc).backend.modules == ArtifactRef(sha256=SHA, name="modules.zip", size=10)
    doc["backend"] = {"type": "sglang", "modelPath": "/m", "modules": {"sha256": SHA}}
    with pytest.raises(InvalidSpec, match="backend.modules: not used by the sglang backend"):
        load(doc)


# -------------------------------------------------------------------------------------------- policy


def test_artifact_uris_must_come_from_an_allowed_source(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, artifact_sources="https://models.example.com/prod/,s3://models/")
    policy = SpecPolicy.from_settings(settings)
    ok = load(_torch_doc("s3://models/fraud/m.safetensors", sha256=SHA))
    assert policy.check(ok) == []
    for uri in ("https://evil.example.com/m.safetensors", "https://models.example.com/prodx/m.safetensors",
                "https://user:secret@models.example.com/prod/m.safetensors"):
        problems = policy.check(load(_torch_doc(uri, sha256=SHA)))
        assert len(problems) == 1 and problems[0].startswith("spec.backend.artifact.uri: ")
        assert "secret" not in problems[0]
    outside = policy.check(load(_torch_doc("file:///etc/m.safetensors", sha256=SHA)))
    assert "outside this node's model roots" in outside[0]


def test_the_artifact_cache_is_always_a_model_root(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "c", model_roots=str(tmp_path / "only"))
    policy = SpecPolicy.from_settings(settings)
    cached = settings.artifact_cache_dir / "sha256" / SHA / "m.safetensors"
    assert policy.check_path(cached, "spec.backend.artifact") == []
    assert policy.check_path(tmp_path / "c" / "elsewhere", "spec.backend.artifact") != []


@pytest.mark.parametrize("sources", ["https://", "file:///srv/models", "models.example.com"])
def test_artifact_sources_need_a_scheme_and_a_host(sources: str) -> None:
    with pytest.raises(ValueError, match="SIE_ARTIFACT_SOURCES"):
        Settings(artifact_sources=sources)


# --------------------------------------------------------------------------------------------- cache


def test_the_cache_keeps_only_verified_bytes(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, max_bytes=1 << 20)
    data = b"model bytes" * 100
    ref = ArtifactRef(sha256=hashlib.sha256(data).hexdigest(), name="m.pt", size=len(data))
    assert cache.get(ref) is None
    path = cache.put(ref, lambda sink: sink.write(data))
    assert path == cache.path(ref) and path.read_bytes() == data and cache.get(ref) == path
    other = ref.model_copy(update={"name": "same-bytes.pt"})
    assert cache.get(other) == cache.path(other) and cache.path(other).read_bytes() == data  # linked

    bad = ArtifactRef(sha256=SHA, name="bad.pt")
    with pytest.raises(ArtifactRefused, match="do not hash to the sha256 the spec names"):
        cache.put(bad, lambda sink: sink.write(data))
    assert cache.get(bad) is None and list(cache.folder(SHA).iterdir()) == []  # no temporary file left
    with pytest.raises(ArtifactRefused, match="larger than max_artifact_bytes"):
        ArtifactCache(tmp_path, max_bytes=10).put(bad, lambda sink: sink.write(data))


def test_chunks_written_out_of_order_are_hashed_from_the_file(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, max_bytes=1 << 20)
    data = bytes(range(256)) * 10
    ref = ArtifactRef(sha256=hashlib.sha256(data).hexdigest(), name="x.bin")

    def backwards(sink: Any) -> None:
        for start in reversed(range(0, len(data), 1000)):
            sink.seek(start)
            sink.write(data[start:start + 1000])

    assert cache.put(ref, backwards).read_bytes() == data


def test_uris_are_shown_without_credentials_or_query() -> None:
    assert safe_uri("https://user:tok@h.example.com:8443/a/b.pt?X-Amz-Signature=s#f") == "https://h.example.com:8443/a/b.pt"
    assert safe_uri("s3://bucket/key.pt") == "s3://bucket/key.pt"


# ------------------------------------------------------------------------------------------ downloads


@pytest.fixture()
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *_a: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path.startswith("/busy"):
                self.send_error(503)
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _fetch(cache: ArtifactCache, uri: str, data: bytes, name: str = "m.bin") -> Path:
    ref = ArtifactRef(sha256=hashlib.sha256(data).hexdigest(), name=name, uri=uri)
    return cache.put(ref, lambda sink: download(uri, sink, timeout=10))


def test_http_downloads_are_verified_and_errors_say_whether_to_retry(tmp_path: Path, http_root: Any) -> None:
    base, root = http_root
    data = b"w" * 300_000
    (root / "m.bin").write_bytes(data)
    cache = ArtifactCache(tmp_path / "cache", max_bytes=1 << 20)
    assert _fetch(cache, f"{base}/m.bin", data).read_bytes() == data
    with pytest.raises(ArtifactRefused, match="hash to"):
        _fetch(cache, f"{base}/m.bin", b"other bytes")
    with pytest.raises(ArtifactRefused, match="HTTP 404"):
        _fetch(cache, f"{base}/missing.bin", data, name="x.bin")
    with pytest.raises(ArtifactUnavailable, match="HTTP 503; retrying later"):
        _fetch(cache, f"{base}/busy.bin", data, name="y.bin")


def test_file_uris(tmp_path: Path) -> None:
    data = b"safetensors bytes"
    local = tmp_path / "models" / "m.safetensors"
    local.parent.mkdir()
    local.write_bytes(data)
    cache = ArtifactCache(tmp_path / "cache", max_bytes=1 << 20)
    assert _fetch(cache, local.as_uri(), data).read_bytes() == data
    with pytest.raises(ArtifactRefused, match="no such file"):
        _fetch(cache, (tmp_path / "nope").as_uri(), data, name="n.bin")


def test_fsspec_uris(tmp_path: Path) -> None:
    # fsspec is optional (not in [project] dependencies): the cache imports it only for object-store schemes and
    # refuses them with "needs fsspec" when it is absent, so this test is the one that may skip.
    fsspec = pytest.importorskip("fsspec", reason="fsspec not installed: object-store artifact URIs are optional")
    data = b"safetensors bytes"
    cache = ArtifactCache(tmp_path / "cache", max_bytes=1 << 20)
    with fsspec.open("memory://bucket/m.safetensors", "wb") as f:  # an object store without a network
        f.write(data)
    assert _fetch(cache, "memory://bucket/m.safetensors", data, name="mem.bin").read_bytes() == data
    with pytest.raises(ArtifactRefused, match="not found"):
        _fetch(cache, "memory://bucket/absent", data, name="a.bin")


# ----------------------------------------------------------------------------------- module archives


def _package(root: Path) -> None:
    (root / "acme" / "models" / "churn").mkdir(parents=True)
    (root / "acme" / "other").mkdir()
    (root / "acme" / "__init__.py").write_text("")
    (root / "acme" / "models" / "__init__.py").write_text("")
    (root / "acme" / "models" / "churn" / "__init__.py").write_text("")
    (root / "acme" / "models" / "churn" / "rules.py").write_text("def score(xs):\n    return xs\n")
    (root / "acme" / "models" / "churn" / "__main__.py").write_text("raise SystemExit\n")
    (root / "acme" / "models" / "churn" / "weights.bin").write_bytes(b"\0")
    (root / "acme" / "other" / "secret.py").write_text("X = 1\n")


class _Backend:
    callable = "acme.models.churn.rules:score"
    module_class = None


def test_an_archive_holds_the_allowed_subtree_deterministically(tmp_path: Path) -> None:
    _package(tmp_path)
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    built = build_bundle(_Backend(), [spec_dir, *spec_dir.parents], ["acme.models"])
    assert built is not None
    data, names = built
    assert names == ["acme/__init__.py", "acme/models/__init__.py", "acme/models/churn/__init__.py",
                     "acme/models/churn/rules.py"]  # no data, no __main__, nothing outside acme.models
    again = build_bundle(_Backend(), [spec_dir, *spec_dir.parents], ["acme.models"])
    assert again is not None and again[0] == data  # same sources, same sha256: nothing uploaded twice
    path = tmp_path / "m.zip"
    path.write_bytes(data)
    assert check_bundle(path, ["acme.models"]) == []
    assert check_bundle(path, ["acme.models.churn.rules"]) == []  # packages above an allowed module may come
    narrower = check_bundle(path, ["acme.models.fraud"])  # a node that allows another package only
    assert [p.split("'")[1] for p in narrower] == ["acme.models.churn", "acme.models.churn.rules"]
    assert build_bundle(_Backend(), [tmp_path / "nowhere"], ["acme.models"]) is None  # an installed package


def test_a_node_refuses_archives_holding_anything_else(tmp_path: Path) -> None:
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("acme/models/ok.py", "")
        archive.writestr("sitecustomize.py", "import os\n")
        archive.writestr("../escape.py", "")
        archive.writestr("acme/models/native.so", b"\x7fELF")
    problems = check_bundle(path, ["acme.models"])
    assert any("'sitecustomize'" in p for p in problems)
    assert any("'../escape.py'" in p for p in problems) and any("native.so" in p for p in problems)
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    assert "not a zip archive" in check_bundle(tmp_path / "junk.zip", ["acme.models"])[0]
    assert module_of("a/b/__init__.py") == ("a.b", True) and module_of("/abs.py") is None


def test_file_sha256_reads_in_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * (3 << 20))
    assert file_sha256(path) == hashlib.sha256(b"x" * (3 << 20)).hexdigest()
