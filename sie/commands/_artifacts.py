"""What ``sie apply`` uploads: a spec's artifact and its own Python package, so that every node can fetch them.

A spec read from a file on this machine may name a local artifact (``backend.artifact``) and code next to
the spec (``moduleClass``/``callable``); nodes have neither.  ``for_cluster`` uploads both (the package as
a deterministic zip, ``sie.schemas.module_bundle``) and returns the spec naming them by sha256
(``artifactRef``, ``modules``), the form the specs topic carries.  Uploads go to Kafka directly
(``KafkaUploader``) or through a control plane (``ApiUploader``, ``PUT /v1/artifacts/sha256:<hex>``);
either skips bytes the cluster already has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import click

from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import BLOCK, file_sha256


class Uploader(Protocol):
    def upload(self, sha256: str, name: str, size: int, chunks: Any) -> bool:
        """Make the bytes available on the cluster; False when it had them already."""


class KafkaUploader:
    """Straight onto the artifact topics (needs Kafka credentials that may write them)."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        from sie.kernel.admin import ensure_topics
        from sie.kernel.topics import system_topics
        from sie.schemas.artifact_store import ArtifactStore

        self.store = ArtifactStore(settings)
        self.timeout = timeout
        wanted = {self.store.manifest_topic, self.store.chunk_topic}  # like the specs topic: made if missing
        ensure_topics(settings, [t for t in system_topics(settings.topic_prefix) if t.name in wanted])

    def upload(self, sha256: str, name: str, size: int, chunks: Any) -> bool:
        if self.store.lookup(sha256, self.timeout) is not None:
            return False
        upload = self.store.begin(sha256, name, self.timeout)
        for block in chunks():
            upload.add(block)
        upload.finish()
        return True


class ApiUploader:
    """Through a control plane (an operator token): ``GET`` says whether it has them, ``PUT`` streams them."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def upload(self, sha256: str, name: str, size: int, chunks: Any) -> bool:
        path = f"/v1/artifacts/sha256:{sha256}"
        if self.api.find(path) is not None:
            return False
        self.api.upload(path, chunks(), params={"name": name})
        return True


def _file_blocks(path: Path) -> Any:
    def blocks() -> Iterator[bytes]:
        with open(path, "rb") as f:
            yield from iter(lambda: f.read(BLOCK), b"")
    return blocks


def upload_problems(spec: Any, spec_file: Path, settings: Settings) -> list[str]:
    """Why ``spec``'s local artifact may not leave this machine (``SpecPolicy.check_upload``), one line each."""
    from sie.schemas.spec_policy import SpecPolicy

    backend = spec.backend
    if backend.artifact is None or backend.artifact_ref is not None:
        return []
    folder = Path(spec_file).resolve().parent
    policy = SpecPolicy.from_settings(settings, extra_roots=[folder])
    return [f"{spec.name}: {p}" for p in policy.check_upload(backend.artifact, folder, backend.format)]


def for_cluster(spec: Any, spec_file: Path, settings: Settings, uploader: Uploader) -> Any:
    """``spec`` with its local artifact and its own modules uploaded and named by sha256 (see module docstring)."""
    from sie.schemas.module_bundle import build_bundle
    from sie.schemas.spec_models import ArtifactRef

    backend = spec.backend
    changes: dict[str, Any] = {}
    if backend.artifact is not None and backend.artifact_ref is None:
        problems = upload_problems(spec, spec_file, settings)
        if problems:  # before a byte is read: only model artifact files under the spec's folder or a model root
            raise click.ClickException("; ".join(problems))
        path = Path(backend.artifact)
        size = path.stat().st_size
        if size > settings.max_artifact_bytes:
            raise click.ClickException(f"{spec.name}: {path} is {size} bytes, more than max_artifact_bytes "
                                       f"{settings.max_artifact_bytes}; serve it from a URI with sha256 instead")
        digest = file_sha256(path)
        uploaded = uploader.upload(digest, path.name, size, _file_blocks(path))
        changes["artifact_ref"] = ArtifactRef(sha256=digest, name=path.name, size=size)
        changes["artifact"] = None
        click.echo(f"  artifact {path.name}: sha256:{digest[:12]} ({size} bytes, "
                   f"{'uploaded' if uploaded else 'already on the cluster'})")
    folder = Path(spec_file).resolve().parent
    try:
        bundle = build_bundle(backend, [folder, *folder.parents], settings.allowed_modules)
    except ValueError as exc:
        raise click.ClickException(f"{spec.name}: {exc}") from None
    if bundle is not None and backend.modules is None:
        data, names = bundle
        digest = hashlib.sha256(data).hexdigest()
        uploaded = uploader.upload(digest, "modules.zip", len(data), lambda: iter([data]))
        changes["modules"] = ArtifactRef(sha256=digest, name="modules.zip", size=len(data))
        click.echo(f"  modules ({len(names)} files: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): "
                   f"sha256:{digest[:12]} ({'uploaded' if uploaded else 'already on the cluster'})")
    if not changes:
        return spec
    return spec.model_copy(update={"backend": backend.model_copy(update=changes)})


def document_for_api(doc: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The YAML document as the API should get it: artifact and modules by sha256 (from ``spec``, the same
    document after ``for_cluster``), no path of this machine in it."""
    backend = (doc.get("spec") or {}).get("backend") if "kind" in doc else doc.get("backend")
    if not isinstance(backend, dict):
        return doc
    for key in ("sha256", "artifactSha256", "artifact_sha256"):
        backend.pop(key, None)
    ref = spec.backend.artifact_ref
    if ref is not None:
        backend["artifact"] = ref.model_dump(exclude_none=True)
    elif spec.backend.artifact is not None:
        backend["artifact"] = str(spec.backend.artifact)  # --no-upload: this machine's absolute path, as before
    if spec.backend.modules is not None:
        backend["modules"] = spec.backend.modules.model_dump(exclude_none=True)
    return doc
