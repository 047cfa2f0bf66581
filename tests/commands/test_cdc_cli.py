"""CDC items of issue 17: the default request topic honours SIE_TOPIC_PREFIX, Debezium keys are taken from
KEY<TAB>VALUE lines (convert and publish) or derived from primaryKeys (publish), the convert help says what is
true, and connector spec errors use the ModelService spec's wording."""

from __future__ import annotations

import json

import pytest
import yaml

from sie.cli import main
from sie.connectors.cdc import CdcConverter
from sie.connectors.cdc.config import ConnectorSpecError, parse_connector_spec
from tests.support.cdc_support import make_spec, record
from tests.support.helpers import consume_all, unique_topic


def _connector_file(tmp_path, fmt: str = "debezium-json", **extra) -> str:
    doc = {"kind": "CdcConnector", "metadata": {"name": "orders"},
           "spec": {"format": fmt, "sourceTopic": unique_topic("cdc"), "model": "no-such-model",
                    "tables": ["shop.orders"], "mapping": {"amount": "amount", "currency": "currency"}, **extra}}
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


def _debezium_line() -> tuple[bytes, bytes]:
    key, value = record("debezium_plain_create_string_decimal.json")
    return key, value


def test_an_unknown_models_default_request_topic_honours_the_prefix():
    spec = make_spec("canal-json", model="not-applied")
    assert CdcConverter(spec, None, topic_prefix="blue").request_topic == "blue.model.not-applied.requests"


def test_convert_reads_debezium_keys_from_keyed_lines_and_says_why_without_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIE_TOPIC_PREFIX", "blue")
    key, value = _debezium_line()
    events = tmp_path / "events.txt"
    events.write_bytes(value + b"\n")
    connector = _connector_file(tmp_path)
    assert main(["cdc", "convert", "-f", connector, "--file", str(events)]) == 0
    err = capsys.readouterr().err
    assert "dead letter missing_primary_key" in err and "for blue.model.no-such-model.requests" in err
    events.write_bytes(key + b"\t" + value + b"\n")
    assert main(["cdc", "convert", "-f", connector, "--file", str(events), "--keyed"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("shop.orders:") and "dead letters none" in err
    assert main(["cdc", "convert", "--help"]) == 0
    assert "KEY<TAB>VALUE" in capsys.readouterr().out


def test_publish_writes_debezium_keys_from_primary_keys_or_keyed_lines(tmp_path, kafka_settings, monkeypatch, capsys):
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    key, value = _debezium_line()
    events = tmp_path / "events.txt"
    events.write_bytes(value + b"\n")
    with_pk = _connector_file(tmp_path, primaryKeys={"shop.orders": ["id"]})
    assert main(["cdc", "publish", "-f", with_pk, "--file", str(events)]) == 0
    assert "(1 with a key)" in capsys.readouterr().out
    topic = yaml.safe_load(open(with_pk))["spec"]["sourceTopic"]
    (published,) = consume_all(kafka_settings, topic, expected=1)
    assert json.loads(published.key) == json.loads(key)  # {"id": 1004}, what Debezium writes
    without_pk = _connector_file(tmp_path)
    assert main(["cdc", "publish", "-f", without_pk, "--file", str(events)]) == 0
    assert "missing_primary_key unless primaryKeys lists their table" in capsys.readouterr().err


def test_connector_spec_errors_use_the_spec_wording():
    with pytest.raises(ConnectorSpecError) as err:
        parse_connector_spec({"name": "x", "format": "debezium", "sourceTopic": "t", "model": "m",
                              "tables": ["shop.orders"], "primaryKey": {"shop.orders": ["id"]},
                              "skip_unchanged_updates": "yes"})
    msg = str(err.value)
    assert "connector.primaryKey: unknown key; known keys: name, format, sourceTopic" in msg and "primaryKeys" in msg
    assert "connector.format: must be one of canal-json, debezium-json, maxwell-json (got 'debezium')" in msg
    assert "connector.skip_unchanged_updates: must be a boolean (true/false) (got 'yes')" in msg
    assert "Extra inputs" not in msg and "Input should be" not in msg
