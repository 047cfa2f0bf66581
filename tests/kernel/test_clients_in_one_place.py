"""Every Kafka client of the product is configured in ``sie.kernel.clients`` and made through its
``KafkaClients`` factories (so a unit test can hand out fakes, and a config such as ``message.max.bytes`` or
``client.id`` cannot drift in one writer).  Checked on the syntax tree of the product code, so a docstring
that shows ``Consumer(...)`` does not count; and the writers that used to drift, checked by what they ask for."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from sie.kernel.settings import Settings
from tests.fakes.kafka_clients import FakeConsumer, FakeProducer, fake_clients

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["sie", "streams", "connectors", "workers", "schemas", "infra", "k8s"]
CLIENT_CLASSES = {"Producer", "Consumer", "AdminClient", "DeserializingConsumer", "SerializingProducer"}


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("confluent_kafka"):
            out += [f"imports {a.name}" for a in node.names if a.name in CLIENT_CLASSES]
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in CLIENT_CLASSES:
                out.append(f"calls {name}(")
        elif isinstance(node, ast.Dict):
            out += ["configures bootstrap.servers" for k in node.keys
                    if isinstance(k, ast.Constant) and k.value == "bootstrap.servers"]
    return [f"{path.relative_to(ROOT)}:{v}" for v in out]


def test_no_kafka_client_is_configured_or_made_outside_the_kernel():
    files = [f for d in PRODUCT for f in (ROOT / d).rglob("*.py") if (ROOT / d).is_dir()]
    assert len(files) > 100  # the product was found
    outside = [v for f in files if not f.is_relative_to(ROOT / "sie" / "kernel") for v in _violations(f)]
    assert outside == [], "make clients through sie.kernel.clients (a role config + KafkaClients), not here"


def _settings() -> Settings:
    return Settings(bootstrap_servers="127.0.0.1:1", topic_prefix="t")


def test_the_request_producer_is_an_idempotent_writer_with_a_client_id_and_the_record_size_limit():
    from sie.connectors.producer import RequestProducer

    settings = _settings()
    made = fake_clients(producer=FakeProducer())
    RequestProducer(settings, "t.model.m.requests", clients=made.clients)
    (config,) = made.of("producer")
    assert config["client.id"] == "t.writer.requests"
    assert config["message.max.bytes"] == settings.max_record_bytes
    assert (config["enable.idempotence"], config["acks"], config["compression.type"]) == (True, "all", "lz4")


def test_the_result_collector_reads_committed_results_in_a_prefixed_throwaway_group():
    from sie.connectors.results import ResultCollector

    consumer: Any = FakeConsumer(partitions={"t.model.m.results": 1})
    made = fake_clients(consumer=consumer)
    ResultCollector(_settings(), "t.model.m.results", clients=made.clients)
    (config,) = made.of("consumer")
    assert config["group.id"].startswith("t.reader.results.")
    assert (config["client.id"], config["isolation.level"], config["enable.auto.commit"]) == (
        "t.reader.results", "read_committed", False)
