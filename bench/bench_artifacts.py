"""Artifact distribution through a real broker: upload and fetch rate vs the floors they cannot beat.

For one artifact of --mib MiB (random bytes), in one run on one broker:

A. sha256 of the file (the floor of any digest-checked copy);
B. plain Kafka: the same bytes produced in 512 KiB records (idempotent, acks=all) and consumed back,
   with no hashing, no manifest, no file (the floor of moving them through Kafka at all);
C. ``ArtifactStore.upload_file``: hash, chunks + per-chunk digests, acknowledgements, then the manifest;
D. fetch into a node's cache: manifest lookup (also shown apart), the chunk range, per-chunk and whole-file checks, rename.

Usage: ``python bench/bench_artifacts.py [--mib 64]`` (needs a broker: SIE_BOOTSTRAP_SERVERS, default
127.0.0.1:9092); writes bench/results/artifacts.txt.  Ratios are C/B and D/B of the same run.  Every topic
it creates is under a throwaway prefix and deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from sie.kernel.admin import delete_topics, ensure_topics  # noqa: E402
from sie.kernel.settings import Settings  # noqa: E402
from sie.kernel.topics import TopicSpec, system_topics  # noqa: E402
from sie.schemas.artifact_cache import ArtifactCache, file_sha256  # noqa: E402
from sie.schemas.artifact_store import CHUNK_BYTES, ArtifactStore  # noqa: E402
from sie.schemas.spec_models import ArtifactRef  # noqa: E402

RESULT = ROOT / "bench" / "results" / "artifacts.txt"


def plain_kafka(settings: Settings, data: bytes) -> tuple[float, float]:
    """Seconds to produce (acked) and to consume back ``data`` in CHUNK_BYTES records on a fresh topic."""
    topic = settings.names.model_topics("bench-plain").requests  # a data-path topic under the bench's prefix
    ensure_topics(settings, [TopicSpec(topic, 1, False, "bench")])
    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True,
                                                        "linger.ms": 20}))
    started = time.perf_counter()
    for i in range(0, len(data), CHUNK_BYTES):
        while True:
            try:
                producer.produce(topic, value=data[i:i + CHUNK_BYTES], partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0
    produced = time.perf_counter() - started
    consumer = Consumer(settings.kafka_client_config(**{"group.id": f"bench-{uuid.uuid4().hex[:6]}",
                                                        "enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    got, started = 0, time.perf_counter()
    while got < len(data):
        for msg in consumer.consume(64, 1.0):
            if msg.error() is None:
                got += len(msg.value())
    consumed = time.perf_counter() - started
    consumer.close()
    return produced, consumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings().with_overrides(topic_prefix=prefix, cache_dir=Path(tmp) / "cache")
        topics = [spec.name for spec in system_topics(prefix)] + [settings.names.model_topics("bench-plain").requests]
        ensure_topics(settings, system_topics(prefix))
        try:
            data = os.urandom(args.mib << 20)
            path = Path(tmp) / "weights.safetensors"
            path.write_bytes(data)

            started = time.perf_counter()
            digest = file_sha256(path)
            hashing = time.perf_counter() - started
            produce_s, consume_s = plain_kafka(settings, data)

            store = ArtifactStore(settings)
            started = time.perf_counter()
            manifest, uploaded = store.upload_file(path, timeout=300)
            upload_s = time.perf_counter() - started
            assert uploaded and manifest.sha256 == digest

            cache = ArtifactCache(settings.artifact_cache_dir, settings.max_artifact_bytes)
            ref = ArtifactRef(sha256=digest, name=path.name, size=len(data))
            started = time.perf_counter()
            found = store.lookup(digest)
            lookup_s = time.perf_counter() - started
            assert found is not None
            copy = cache.put(ref, lambda sink: store.fetch(found, sink, timeout=300))
            fetch_s = time.perf_counter() - started
            assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest
        finally:
            delete_topics(settings, topics)

    mib = args.mib
    lines = [
        f"bench_artifacts: {mib} MiB artifact, {manifest.chunks} chunks of {manifest.chunk_size} B "
        f"({platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"broker {settings.bootstrap_servers})",
        f"A sha256 of the file           {hashing:7.2f} s  {mib / hashing:8.1f} MiB/s",
        f"B plain Kafka produce (acked)  {produce_s:7.2f} s  {mib / produce_s:8.1f} MiB/s",
        f"B plain Kafka consume          {consume_s:7.2f} s  {mib / consume_s:8.1f} MiB/s",
        f"C ArtifactStore.upload_file    {upload_s:7.2f} s  {mib / upload_s:8.1f} MiB/s  "
        f"= {upload_s / produce_s:.2f}x plain produce",
        f"D fetch into the node cache    {fetch_s:7.2f} s  {mib / fetch_s:8.1f} MiB/s  "
        f"= {fetch_s / consume_s:.2f}x plain consume (of which manifest lookup {lookup_s:.2f} s)",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
