"""Every Kafka client of the product is configured in ``sie.kernel.clients`` and made through its
``KafkaClients`` factories (so a unit test can hand out fakes, and a config such as ``message.max.bytes`` or
``client.id`` cannot drift in one writer).  Checked on the syntax tree of the product code, so a docstring
that shows ``Consumer(...)`` does not count; and the writers that used to drift, checked by what they ask for.

Every librdkafka property is set there too (issue 39): product code is scanned for string keys it sets (dict
keys, ``config["k"] = ``, ``setdefault("k", ...)``); a key is a librdkafka property when librdkafka itself
accepts its name (a client built with it does not fail with "No such configuration property")."""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from sie.kernel.settings import Settings
from tests.fakes.kafka_clients import FakeConsumer, FakeProducer, fake_clients

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["sie", "streams", "control", "connectors", "workers", "schemas", "infra", "k8s"]
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


HOME = "sie/kernel/clients.py"
#: files that may set such keys, and why (an allow-list: nothing else may)
ALLOWED = {
    # the broker's own server.properties for its TLS listener (ssl.keystore.location, ...): a broker, not a client
    "infra/kafka/security.py": "broker properties",
    # Settings.kafka_client_config: the connection and security properties its fields name (bootstrap.servers,
    # sasl.*, ssl.*), the base every builder in clients.py starts from.  It stays with the fields: settings must
    # not import the clients module, or the pure placement engine (which reads Settings) would import Kafka
    "sie/kernel/settings.py": "the connection base of every client",
}
#: librdkafka properties without a dot (every other one has one)
_PLAIN = frozenset({"acks", "debug", "retries", "log_level"})
_CANDIDATE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+")


@cache
def _is_librdkafka_property(name: str) -> bool:
    if name not in _PLAIN and not _CANDIDATE.fullmatch(name):
        return False
    try:
        Producer({name: "\0", "log_level": 0})
    except (KafkaException, ValueError, TypeError) as exc:
        return "No such configuration property" not in str(exc)
    return True


def _keys_set(tree: ast.AST) -> list[ast.Constant]:
    found: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found += node.keys
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            found.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault" \
                and node.args:
            found.append(node.args[0])
    return [k for k in found if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _product_files() -> list[Path]:
    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
                  .values())
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)


def test_the_probe_tells_librdkafka_properties_from_other_strings() -> None:
    assert _is_librdkafka_property("fetch.wait.max.ms") and _is_librdkafka_property("acks")
    assert not _is_librdkafka_property("fetch.wait.maximum") and not _is_librdkafka_property("model.version")


def test_librdkafka_properties_are_set_only_in_sie_kernel_clients() -> None:
    outside: list[str] = []
    homes = 0
    for path in _product_files():
        where = path.relative_to(ROOT).as_posix()
        keys = [k for k in _keys_set(ast.parse(path.read_text(), where)) if _is_librdkafka_property(k.value)]
        if where == HOME:
            homes += len(keys)
        elif where not in ALLOWED:
            outside += [f"{where}:{k.lineno}: {k.value!r}" for k in keys]
    assert homes > 20, "the scan no longer finds the keys sie/kernel/clients.py sets"
    assert not outside, ("librdkafka properties set outside sie/kernel/clients.py (give the role a named config "
                         "builder there):\n" + "\n".join(outside))


def test_the_roles_moved_into_named_builders_ask_for_what_they_did() -> None:
    from sie.kernel.clients import (
        REPLAY_FETCH_WAIT_MS,
        idempotent_producer_config,
        leader_producer_config,
        quiet_admin_config,
        state_reader_config,
    )

    settings = _settings()
    leader = leader_producer_config(settings, "t.control.leader", transaction_timeout_ms=20_000)
    assert (leader["transactional.id"], leader["compression.type"], leader["transaction.timeout.ms"]) == (
        "t.control.leader", "lz4", 20_000)
    writer = idempotent_producer_config(settings, "t.writer.specs", linger_ms=0, message_timeout_s=2.5)
    assert (writer["linger.ms"], writer["message.timeout.ms"], writer["acks"]) == (0, 2500, "all")
    assert "message.timeout.ms" not in idempotent_producer_config(settings, "t.writer.x")
    reader = state_reader_config(settings, "g", "c", fetch_wait_ms=REPLAY_FETCH_WAIT_MS)
    assert reader["fetch.wait.max.ms"] == 50 and "fetch.wait.max.ms" not in state_reader_config(settings, "g", "c")
    assert quiet_admin_config(settings)["log_level"] == 4
    assert quiet_admin_config(settings, log_level=7)["log_level"] == 7


def test_every_client_factory_returns_a_typed_protocol_not_any() -> None:
    """mypy checks the calls made on the clients only where the factories say what they return (issue 39)."""
    import typing

    from sie.kernel.clients import KafkaClients
    from sie.kernel.consumer import KafkaConsumer
    from sie.kernel.kafka_types import KafkaAdmin, KafkaProducer

    hints = typing.get_type_hints(KafkaClients)
    returns = {name: typing.get_args(hints[name])[1] for name in ("consumer", "producer", "admin")}
    assert returns == {"consumer": KafkaConsumer, "producer": KafkaProducer, "admin": KafkaAdmin}
