"""A node's copies of artifacts, by content: fetched once, verified by sha256, kept under the artifact cache.

WHY content addressing: a spec names an artifact by its sha256 (``ArtifactRef``), so a copy is either
exactly the file that was applied or it is refused; where it came from (the cluster's artifacts topic,
``file://``, ``http(s)://``, an object store through fsspec) does not change what is loaded.  Layout::

    <SIE_CACHE_DIR>/artifacts/sha256/<hex>/<name>

A download is written to a temporary file in that folder, hashed while it is written, and renamed into
place only when the digest matches: a file under its final name was verified (whoever can write the cache
already owns the node).  The cache folder is a model root of every node (``SpecPolicy``).

Errors say whether trying again can help: ``ArtifactUnavailable`` (a broker, server or network that did
not answer: retry with backoff) or ``ArtifactRefused`` (wrong bytes, a missing chunk, a source this node
does not allow: the same try gives the same answer).  Messages never show a URI's credentials or query, nor the
digest or size of bytes fetched from it; HTTP redirects are never followed (the allow-list names the URI fetched).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

from sie.kernel.errors import SieError

#: bytes read at a time while hashing or copying
BLOCK = 1 << 20


class ArtifactError(SieError):
    """An artifact could not be made available on this node."""


class ArtifactUnavailable(ArtifactError):
    """Transient: the source did not answer (broker, HTTP 5xx, timeout); trying again later may work."""


class ArtifactRefused(ArtifactError):
    """Permanent for these bytes: digest mismatch, missing or corrupt chunk, too large, source not allowed."""


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in blocks (bounded memory whatever its size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def safe_uri(uri: str) -> str:
    """``uri`` without user info, query or fragment: what a message may show (a presigned URL's signature,
    ``https://user:token@host/``, are secrets)."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:  # unparseable, or a port out of range: show no part of it
        return "<unparseable uri>"
    host = parts.hostname or ""
    if port:
        host += f":{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class HashingWriter:
    """A binary sink that hashes and counts what goes through it, refusing more than ``limit`` bytes."""

    def __init__(self, sink: BinaryIO, limit: int, what: str) -> None:
        self._sink = sink
        self._limit = limit
        self._what = what
        self.digest = hashlib.sha256()
        self.size = 0
        #: a write went anywhere but the end: ``digest`` is not the file's, hash the file instead
        self.positioned = False

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self._limit:
            raise ArtifactRefused(f"{self._what}: larger than max_artifact_bytes {self._limit}; raise "
                                  "SIE_MAX_ARTIFACT_BYTES on every node if it is meant to be this large")
        self.digest.update(data)
        self._sink.write(data)
        return len(data)

    def seek(self, offset: int) -> None:
        """Positioned writes (chunks arriving by index): out of order, the digest is computed from the file."""
        if offset != self._sink.tell():
            self.positioned = True
        self._sink.seek(offset)


class ArtifactCache:
    """Verified copies of artifacts on this node (see the module docstring)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def folder(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def path(self, ref: Any) -> Path:
        """Where the verified copy of ``ref`` (an ``ArtifactRef``) lives on this node (it may not yet)."""
        return self.folder(ref.sha256) / ref.name

    def get(self, ref: Any) -> Path | None:
        """The verified copy, or None.  A copy under another name (same bytes) is linked to this name."""
        target = self.path(ref)
        if target.is_file():
            return target
        folder = self.folder(ref.sha256)
        if folder.is_dir():
            for other in folder.iterdir():
                if other.is_file() and not other.name.startswith("."):
                    try:
                        os.link(other, target)
                    except FileExistsError:
                        pass
                    except OSError:
                        return None
                    return target
        return None

    def put(self, ref: Any, fill: Callable[[HashingWriter], None]) -> Path:
        """Run ``fill`` into a temporary file, verify its sha256 (and size, when ``ref`` has one), rename it
        into place.  Raises ``ArtifactRefused`` on a mismatch (the temporary file is removed)."""
        folder = self.folder(ref.sha256)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{ref.name}.{uuid.uuid4().hex[:8]}.part"
        try:
            with open(tmp, "wb") as f:
                writer = HashingWriter(f, self.max_bytes, ref.label)
                fill(writer)
                f.flush()
                os.fsync(f.fileno())
            actual = file_sha256(tmp) if writer.positioned else writer.digest.hexdigest()
            size = tmp.stat().st_size
            # never the digest or the size of what was fetched: from a URI that would tell whoever wrote the spec
            # something about a resource they may not read (an internal server's answer)
            if actual != ref.sha256:
                raise ArtifactRefused(f"{ref.label}: the bytes fetched do not hash to the sha256 the spec names; "
                                      "refused (re-upload it with sie apply, or fix the spec)")
            if ref.size is not None and size != ref.size:
                raise ArtifactRefused(f"{ref.label}: the bytes fetched are not the {ref.size} bytes the spec says")
            os.chmod(tmp, 0o444)
            os.replace(tmp, self.path(ref))
        finally:
            tmp.unlink(missing_ok=True)
        return self.path(ref)


# ------------------------------------------------------------------------------------------- URIs


def download(uri: str, sink: HashingWriter, timeout: float = 60.0) -> None:
    """Copy the bytes at ``uri`` into ``sink``: ``file://`` from this node's disk, ``http(s)://`` with httpx,
    any other scheme with fsspec (``s3://`` needs s3fs, ``gs://`` gcsfs ...).  The caller checked that the
    source is allowed and verifies the digest."""
    scheme = urlsplit(uri).scheme
    shown = safe_uri(uri)
    if scheme == "file":
        path = Path(urlsplit(uri).path)
        try:
            with open(path, "rb") as f:
                _copy(f, sink)
        except FileNotFoundError:
            raise ArtifactRefused(f"{shown}: no such file on this node") from None
        except OSError as exc:
            raise ArtifactUnavailable(f"{shown}: cannot read it ({exc.strerror or exc})") from None
        return
    if scheme in ("http", "https"):
        _download_http(uri, shown, sink, timeout)
        return
    try:
        import fsspec
    except ImportError:
        raise ArtifactRefused(f"{shown}: {scheme}:// needs fsspec on this node (pip install fsspec and the "
                              f"filesystem's package, e.g. s3fs for s3://)") from None
    try:
        with fsspec.open(uri, "rb") as f:
            _copy(f, sink)
    except ArtifactError:
        raise
    except (ImportError, ValueError) as exc:  # unknown protocol, or its package missing
        raise ArtifactRefused(f"{shown}: fsspec cannot open {scheme}:// here ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    except FileNotFoundError:
        raise ArtifactRefused(f"{shown}: not found") from None
    except Exception as exc:  # network, credentials, throttling: the store may answer later
        raise ArtifactUnavailable(f"{shown}: download failed ({type(exc).__name__})") from None


def _download_http(uri: str, shown: str, sink: HashingWriter, timeout: float) -> None:
    import httpx

    try:
        # no redirect is followed: SIE_ARTIFACT_SOURCES allowed this URI, not wherever its server points
        with httpx.stream("GET", uri, timeout=timeout, follow_redirects=False) as response:
            if response.is_redirect:
                raise ArtifactRefused(f"{shown}: HTTP {response.status_code}, a redirect; SIE does not follow them "
                                      "(name the final URL in the spec, under SIE_ARTIFACT_SOURCES)")
            if response.status_code >= 500 or response.status_code == 429:
                raise ArtifactUnavailable(f"{shown}: HTTP {response.status_code}; retrying later")
            if response.status_code >= 400:
                raise ArtifactRefused(f"{shown}: HTTP {response.status_code}")
            for block in response.iter_bytes(BLOCK):
                sink.write(block)
    except httpx.HTTPError as exc:
        raise ArtifactUnavailable(f"{shown}: download failed ({type(exc).__name__})") from None


def _copy(source: Any, sink: HashingWriter) -> None:
    for block in iter(lambda: source.read(BLOCK), b""):
        sink.write(block)


def refs_of(spec_doc: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """``(field, ref document)`` for each artifact reference of a ModelService document."""
    backend = spec_doc.get("backend") or {}
    for field in ("artifact_ref", "modules"):
        ref = backend.get(field)
        if isinstance(ref, dict):
            yield field, ref
