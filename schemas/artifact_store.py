"""Artifacts on Kafka itself: content-addressed, chunked, sha256-verified, so a cluster needs nothing but Kafka.

Two compacted system topics (``sie.kernel.topics``):

* ``<p>.artifact-chunks``: the bytes, in chunks of at most 512 KiB (well under ``max_record_bytes``), key
  ``sha256:<hex>/<index>``, header ``sie.sha256`` = the chunk's own digest.  Every chunk of one artifact goes
  to the same partition (chosen by its digest), one after another: a contiguous range;
* ``<p>.artifacts``: one ``ArtifactManifest`` per artifact, key ``sha256:<hex>``: size, chunk size and count,
  and the partition and offsets of that range.

Upload order makes a manifest never visible before its chunks: every chunk is produced with an idempotent
producer (acks=all) and acknowledged, THEN the manifest is written.  A reader looks the manifest up first,
so it can only find an artifact whose chunks are all on the broker.  An upload that fails half-way (or
whose bytes do not hash to the digest it claimed) leaves chunks without a manifest: nobody reads them, and
uploading the same content again writes the same keys, which compaction then keeps one of.  (A transaction
per artifact would give the same guarantee but hold back the last stable offset of its partition for as
long as a multi-gigabyte upload takes, and bound uploads by the broker's transaction timeout.)

Fetching reads exactly the manifest's range of one partition, checks each chunk against its header digest
(a corrupt chunk is refused naming its index), and the cache (``sie.schemas.artifact_cache``) checks the
whole file against the sha256 the spec names.  Nothing is ever unpickled or executed here.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sie.kernel.clients import REPLAY_FETCH_WAIT_MS, KafkaClients, idempotent_producer_config, state_reader_config
from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import BLOCK, ArtifactRefused, ArtifactUnavailable, HashingWriter, file_sha256

log = logging.getLogger(__name__)

RECORD = "ArtifactManifest"
#: the largest chunk; smaller when max_record_bytes is set lower (a chunk must fit a record with room to spare)
CHUNK_BYTES = 512 * 1024
DIGEST_HEADER = "sie.sha256"


#: the smallest chunk an upload writes (``chunk_size_for`` with the smallest ``max_record_bytes``, 64 KiB, is 48 KiB)
MIN_CHUNK_BYTES = 16 * 1024
#: no artifact has more chunks than this, whatever its manifest says (8 GiB in 16 KiB chunks)
MAX_CHUNKS = (8 << 30) // MIN_CHUNK_BYTES
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def chunk_size_for(settings: Settings) -> int:
    return min(CHUNK_BYTES, settings.max_record_bytes - 16 * 1024)


@dataclass(frozen=True)
class Manifest:
    """Where an artifact's chunks are (the ``ArtifactManifest`` record)."""

    sha256: str
    name: str
    size: int
    chunk_size: int
    chunks: int
    chunk_partition: int
    first_offset: int
    last_offset: int
    created_ms: int

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any], max_bytes: int, key_digest: str | None = None) -> Manifest:
        """The manifest of a record, checked in full BEFORE anything is sized by it (``ArtifactRefused`` naming the
        field otherwise): a record written by whoever may write the manifests topic must not make a fetching
        agent allocate ``chunks`` of anything (``2**31-1`` chunks was a MemoryError on every node)."""
        try:
            manifest = cls(**{k: record[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise ArtifactRefused(f"manifest: not an {RECORD} record ({type(exc).__name__}: {exc})") from None
        problem = manifest.problem(max_bytes, key_digest)
        if problem is not None:
            raise ArtifactRefused(f"manifest sha256:{str(manifest.sha256)[:12]}: {problem}")
        return manifest

    def problem(self, max_bytes: int, key_digest: str | None = None) -> str | None:
        """Why this manifest cannot be the one of an artifact a node may fetch, or None.  Every number is checked
        against the others: ``chunks`` must be exactly ``ceil(size / chunk_size)`` (never above ``MAX_CHUNKS``),
        the offsets must hold that many records, the size must be one this node accepts."""
        ints = {k: getattr(self, k) for k in ("size", "chunk_size", "chunks", "chunk_partition", "first_offset",
                                               "last_offset", "created_ms")}
        wrong = [k for k, v in ints.items() if not isinstance(v, int) or isinstance(v, bool)]
        if wrong:
            return f"{', '.join(wrong)} must be whole numbers"
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            return "sha256 must be 64 lowercase hex digits"
        if key_digest is not None and key_digest != self.sha256:
            return f"its key names sha256:{key_digest[:12]}, its record sha256:{self.sha256[:12]}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            return "name must be a plain file name"
        if not 0 <= self.size <= max_bytes:
            return f"size {self.size} is not between 0 and max_artifact_bytes {max_bytes} (SIE_MAX_ARTIFACT_BYTES)"
        if not MIN_CHUNK_BYTES <= self.chunk_size <= CHUNK_BYTES:
            return f"chunk_size {self.chunk_size} is not between {MIN_CHUNK_BYTES} and {CHUNK_BYTES}"
        expected = -(-self.size // self.chunk_size)
        if self.chunks != expected or self.chunks > MAX_CHUNKS:
            return f"chunks {self.chunks} is not ceil(size / chunk_size) = {expected} (at most {MAX_CHUNKS})"
        if self.chunk_partition < 0 or self.first_offset < -1 or self.last_offset < self.first_offset:
            return "chunk_partition, first_offset and last_offset must be a partition and an offset range"
        if self.chunks and (self.first_offset < 0 or self.last_offset - self.first_offset + 1 < self.chunks):
            return (f"offsets {self.first_offset}..{self.last_offset} cannot hold {self.chunks} chunks")
        return None

    def to_json(self) -> dict[str, Any]:
        """What the API shows (``GET /v1/artifacts/sha256:<hex>``)."""
        return {**self.to_record(), "ref": f"sha256:{self.sha256}"}


def _topic_partitions(consumer: Any, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise ArtifactUnavailable(f"topic {topic!r} not found: run `sie topics ensure` (as an administrator)")
    return sorted(info.partitions)


class ArtifactStore:
    """Upload, look up and fetch artifacts on one cluster's artifact topics (see the module docstring).

    ``group_id``: the group id the readers carry (never joined, never committed); it must be one the
    principal may Read (``<p>.agent.<node>`` for an agent, ``<p>.control.state`` for the control plane).
    """

    def __init__(self, settings: Settings, group_id: str | None = None, clients: KafkaClients | None = None) -> None:
        self.settings = settings
        names = settings.names
        self.manifest_topic = names.system_topic("artifacts")
        self.chunk_topic = names.system_topic("artifact-chunks")
        self._group = group_id or names.control_state_group
        self._clients = clients or KafkaClients()
        self.chunk_size = chunk_size_for(settings)
        #: sha256 -> why its latest manifest record was refused (filled by ``manifests``)
        self.invalid: dict[str, str] = {}

    # -- look up -------------------------------------------------------------------------------------
    def manifests(self, timeout: float = 30.0) -> dict[str, Manifest]:
        """Every artifact on the cluster by sha256: the manifests topic replayed to its end."""
        from sie.kernel.errors import KafkaUnavailable
        from sie.kernel.replay import read_to_end
        from sie.schemas.avro_codec import decode

        names = self.settings.names
        consumer = self._clients.consumer(state_reader_config(
            self.settings, self._group, names.artifact_client_id("lookup"), fetch_wait_ms=REPLAY_FETCH_WAIT_MS))
        found: dict[str, Manifest] = {}
        invalid: dict[str, str] = {}

        def on_record(msg: Any) -> None:
            key = (msg.key() or b"").decode("utf-8", "replace")
            digest = key.removeprefix("sha256:")
            value = msg.value()
            if value is None:
                found.pop(digest, None)
                invalid.pop(digest, None)
                return
            try:
                found[digest] = Manifest.from_record(decode(value, expected=RECORD),
                                                     self.settings.max_artifact_bytes, key_digest=digest)
                invalid.pop(digest, None)
            except Exception as exc:  # one unreadable record never hides the others
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                found.pop(digest, None)  # the latest record of the key is the manifest: it is not usable
                invalid[digest] = reason
                log.warning("%s[%d]@%d: invalid manifest skipped: %r", msg.topic(), msg.partition(),
                            msg.offset(), reason)

        try:
            partitions = _topic_partitions(consumer, self.manifest_topic)
            # to the ends the partitions have now, by position (sie.kernel.replay): a transient refusal of the
            # ends is retried, a broker that does not deliver them in time is ArtifactUnavailable
            read_to_end(consumer, self.manifest_topic, on_record, timeout_s=timeout, partitions=partitions)
        except KafkaUnavailable as exc:
            raise ArtifactUnavailable(str(exc)) from None
        finally:
            consumer.close()
        self.invalid = invalid
        return found

    def lookup(self, sha256: str, timeout: float = 30.0) -> Manifest | None:
        """The manifest of ``sha256``, or None when it was never (completely) uploaded or its latest manifest
        record is invalid (``invalid`` says why; an upload of the same bytes writes a valid one)."""
        return self.manifests(timeout).get(sha256)

    def require(self, sha256: str, label: str, timeout: float = 30.0) -> Manifest:
        """The manifest of ``sha256`` for a fetch, else ``ArtifactRefused`` naming why (not uploaded, or refused)."""
        found = self.lookup(sha256, timeout)
        if found is not None:
            return found
        if sha256 in self.invalid:
            raise ArtifactRefused(f"artifact {label}: its manifest on {self.manifest_topic} is refused "
                                  f"({self.invalid[sha256]}); upload the artifact again (sie apply -f SPEC)")
        raise ArtifactRefused(f"artifact {label} is not on the cluster's artifacts topic ({self.manifest_topic}); "
                              "upload it (sie apply -f SPEC)")

    # -- upload --------------------------------------------------------------------------------------
    def begin(self, sha256: str, name: str, timeout: float = 60.0) -> ArtifactUpload:
        """An upload of the artifact whose bytes must hash to ``sha256`` (feed it with ``add``, then ``finish``)."""
        return ArtifactUpload(self, sha256, name, timeout)

    def upload_file(self, path: Path, name: str | None = None, timeout: float = 60.0) -> tuple[Manifest, bool]:
        """Upload a local file unless the cluster already has its bytes; returns (manifest, uploaded)."""
        digest = file_sha256(path)
        existing = self.lookup(digest, timeout)
        if existing is not None:
            return existing, False
        upload = self.begin(digest, name or path.name, timeout)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(BLOCK), b""):
                upload.add(block)
        return upload.finish(), True

    def partition_of(self, sha256: str, partitions: int) -> int:
        return int(sha256[:8], 16) % partitions

    # -- fetch ---------------------------------------------------------------------------------------
    def fetch(self, manifest: Manifest, sink: HashingWriter, timeout: float = 300.0) -> None:
        """Write the artifact's bytes into ``sink`` (chunk ``i`` at ``i * chunk_size``).  Raises
        ``ArtifactRefused`` for a corrupt or missing chunk, ``ArtifactUnavailable`` when the broker does not
        deliver the range in time.  The caller verifies the whole file's sha256."""
        from confluent_kafka import TopicPartition

        from sie.kernel.errors import KafkaUnavailable
        from sie.kernel.replay import ReadProgress, watermarks

        m = manifest
        problem = m.problem(self.settings.max_artifact_bytes)
        if problem is not None:  # whoever built it, nothing is sized by an unchecked manifest
            raise ArtifactRefused(f"manifest sha256:{str(m.sha256)[:12]}: {problem}")
        label = f"sha256:{m.sha256[:12]} ({m.name})"
        if m.chunks == 0:
            return
        prefix = f"sha256:{m.sha256}/"
        names = self.settings.names
        consumer = self._clients.consumer(state_reader_config(
            self.settings, self._group, names.artifact_client_id("fetch"), fetch_wait_ms=REPLAY_FETCH_WAIT_MS))
        received: set[int] = set()
        key = (self.chunk_topic, m.chunk_partition)
        try:
            consumer.assign([TopicPartition(self.chunk_topic, m.chunk_partition, m.first_offset)])
            deadline = time.monotonic() + timeout
            try:  # the range ends at the manifest's last offset, or where the partition ends now if before it
                _low, high = watermarks(consumer, [key], timeout_s=min(timeout, 30.0))[key]
            except KafkaUnavailable as exc:
                raise ArtifactUnavailable(f"{label}: {exc}") from None
            progress = ReadProgress({key: min(m.last_offset + 1, high)}, {key: m.first_offset})
            while True:  # read when the position reaches the range's end (sie.kernel.replay's rule)
                progress.check_positions(consumer)
                if progress.done:
                    break
                if time.monotonic() > deadline:
                    raise ArtifactUnavailable(f"{label}: chunks not read within {timeout:g}s "
                                              f"({len(received)} of {m.chunks})")
                for msg in consumer.consume(num_messages=64, timeout=0.5):
                    error = msg.error()
                    if error is not None and error.fatal():
                        raise ArtifactUnavailable(f"{label}: {error.str()}")
                    if not progress.see(msg) or msg.offset() > m.last_offset:
                        continue  # an event, or past the range
                    chunk_key = (msg.key() or b"").decode("utf-8", "replace")
                    if chunk_key.startswith(prefix) and msg.value() is not None:
                        self._write_chunk(m, label, chunk_key[len(prefix):], msg, sink, received)
        finally:
            consumer.close()
        if len(received) < m.chunks:  # received holds only real chunks: bounded by what the broker delivered
            first = list(itertools.islice((i for i in range(m.chunks) if i not in received), 5))
            left = m.chunks - len(received)
            shown = ", ".join(map(str, first)) + (f" and {left - len(first)} more" if left > len(first) else "")
            raise ArtifactRefused(f"{label}: chunk {shown} of {m.chunks} not found on {self.chunk_topic}"
                                  f"[{m.chunk_partition}] between offsets {m.first_offset} and {m.last_offset}; "
                                  "upload it again (sie apply)")

    def _write_chunk(self, m: Manifest, label: str, index_text: str, msg: Any, sink: HashingWriter,
                     received: set[int]) -> None:
        if not index_text.isdigit() or int(index_text) >= m.chunks:
            raise ArtifactRefused(f"{label}: a chunk keyed {index_text[:20]!r} does not belong to a "
                                  f"{m.chunks}-chunk artifact; refused")
        index = int(index_text)
        data = msg.value()
        headers = dict(msg.headers() or ())
        declared = headers.get(DIGEST_HEADER)
        declared_hex = declared.decode("ascii", "replace") if isinstance(declared, bytes) else None
        actual = hashlib.sha256(data).hexdigest()
        if declared_hex != actual:
            raise ArtifactRefused(f"{label}: chunk {index} is corrupt: its bytes hash to sha256:{actual[:12]}, "
                                  f"its record says {('sha256:' + declared_hex[:12]) if declared_hex else 'nothing'}; "
                                  "refused (upload the artifact again)")
        expected_len = m.chunk_size if index < m.chunks - 1 else m.size - m.chunk_size * (m.chunks - 1)
        if len(data) != expected_len:
            raise ArtifactRefused(f"{label}: chunk {index} has {len(data)} bytes, the manifest says {expected_len}")
        sink.seek(index * m.chunk_size)
        sink.write(data)
        received.add(index)


class ArtifactUpload:
    """One artifact being uploaded: chunks as the bytes come (bounded memory), the manifest at ``finish``."""

    def __init__(self, store: ArtifactStore, sha256: str, name: str, timeout: float) -> None:
        self._store = store
        self.sha256 = sha256
        self.name = name
        self._timeout = timeout
        settings = store.settings
        self._producer = store._clients.producer(idempotent_producer_config(
            settings, settings.names.artifact_client_id("upload"), linger_ms=20, message_timeout_s=timeout))
        partitions = _topic_partitions(self._producer, store.chunk_topic)
        self.partition = store.partition_of(sha256, len(partitions))
        self._buffer = bytearray()
        self._digest = hashlib.sha256()
        self.size = 0
        self._index = 0
        self._offsets: list[int] = []
        self._errors: list[str] = []
        self._limit = settings.max_artifact_bytes

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(err.str() if hasattr(err, "str") else str(err))
        else:
            self._offsets.append(msg.offset())

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self._limit:
            raise ArtifactRefused(f"artifact {self.name}: larger than max_artifact_bytes {self._limit} "
                                  "(SIE_MAX_ARTIFACT_BYTES)")
        self._digest.update(data)
        self._buffer.extend(data)
        size = self._store.chunk_size
        while len(self._buffer) >= size:
            self._emit(bytes(self._buffer[:size]))
            del self._buffer[:size]
        if self._errors:
            raise ArtifactUnavailable(f"artifact {self.name}: a chunk was not written ({self._errors[0]})")

    def _emit(self, chunk: bytes) -> None:
        names = self._store.settings.names
        key = names.artifact_chunk_key(self.sha256, self._index).encode()
        headers = [(DIGEST_HEADER, hashlib.sha256(chunk).hexdigest().encode()), ("sie.index", str(self._index).encode())]
        while True:
            try:
                self._producer.produce(self._store.chunk_topic, value=chunk, key=key, partition=self.partition,
                                       headers=headers, on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)
        self._producer.poll(0)
        self._index += 1

    def finish(self) -> Manifest:
        """Write the last chunk, wait for every acknowledgement, then the manifest.  Raises
        ``ArtifactRefused`` (and writes no manifest) if the bytes do not hash to the claimed sha256."""
        from sie.schemas.avro_codec import encode

        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()
        left = self._producer.flush(self._timeout)
        if left or self._errors or len(self._offsets) != self._index:
            raise ArtifactUnavailable(f"artifact {self.name}: {self._index - len(self._offsets)} chunk(s) not "
                                      f"acknowledged within {self._timeout:g}s"
                                      + (f" ({self._errors[0]})" if self._errors else "")
                                      + "; check the broker and upload again")
        actual = self._digest.hexdigest()
        if actual != self.sha256:
            raise ArtifactRefused(f"artifact {self.name}: the bytes sent hash to sha256:{actual}, not the "
                                  f"sha256:{self.sha256} named for them; nothing was published")
        manifest = Manifest(self.sha256, self.name, self.size, self._store.chunk_size, self._index, self.partition,
                            min(self._offsets, default=-1), max(self._offsets, default=-1), int(time.time() * 1000))
        errors: list[str] = []
        self._producer.produce(
            self._store.manifest_topic, key=self._store.settings.names.artifact_key(self.sha256).encode(),
            value=encode(RECORD, manifest.to_record()),
            on_delivery=lambda err, _m: errors.append(str(err)) if err is not None else None)
        if self._producer.flush(self._timeout) or errors:
            raise ArtifactUnavailable(f"artifact {self.name}: its manifest was not acknowledged"
                                      + (f" ({errors[0]})" if errors else "") + "; upload it again")
        log.info("artifact sha256:%s (%s): %d bytes in %d chunks on %s[%d]", self.sha256[:12], self.name, self.size,
                 self._index, self._store.chunk_topic, self.partition)
        return manifest


class KnownArtifacts:
    """The manifests one process has looked up (the control plane's API): a digest found once stays found
    (its bytes can never change), a miss reads the manifests topic again (it may have been uploaded since,
    through another control-plane instance)."""

    def __init__(self, store: ArtifactStore) -> None:
        import threading

        self.store = store
        self._known: dict[str, Manifest] = {}
        self._lock = threading.Lock()

    def known(self, sha256: str, timeout: float = 15.0) -> Manifest | None:
        with self._lock:
            found = self._known.get(sha256)
        if found is None:
            found = self.store.lookup(sha256, timeout)
            if found is not None:
                self.remember(found)
        return found

    def remember(self, manifest: Manifest) -> None:
        with self._lock:
            self._known[manifest.sha256] = manifest


def upload_bytes(store: ArtifactStore, data: bytes, name: str, timeout: float = 60.0) -> tuple[Manifest, bool]:
    """Upload in-memory bytes (a module archive) unless the cluster has them; returns (manifest, uploaded)."""
    digest = hashlib.sha256(data).hexdigest()
    existing = store.lookup(digest, timeout)
    if existing is not None:
        return existing, False
    upload = store.begin(digest, name, timeout)
    for start in range(0, len(data), BLOCK):
        upload.add(data[start:start + BLOCK])
    return upload.finish(), True
