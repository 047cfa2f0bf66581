"""Connector spec + RowChange -> scoring requests: filtering, mapping, coercion, ids, outcomes."""

from __future__ import annotations

import json
from collections import Counter

import orjson
import pytest

from sie.connectors.cdc import (
    CdcConverter,
    ConnectorSpecError,
    decode_canal,
    decode_debezium,
    load_connector_spec,
    rows_to_requests,
)
from tests.support.cdc_support import (
    ORDER_FIELD_TYPES,
    ORDER_INPUT_SCHEMA,
    encode,
    make_spec,
    malformed_cases,
    record,
    records,
)

CREATED_MS = 1610676724000  # 2021-01-15T02:12:04 read as UTC


def converter(fmt: str, **overrides) -> CdcConverter:
    return CdcConverter(make_spec(fmt, **overrides), ORDER_FIELD_TYPES)


def only_request(outcome):
    assert outcome.error is None, outcome.error
    (req,) = outcome.requests
    return req, orjson.loads(req.value)


def test_canal_insert_becomes_a_typed_request_with_key_id_and_metadata():
    req, value = only_request(converter("canal-json").convert(*record("canal_insert.json")))
    assert req.key == b"shop.orders:10001"
    assert value["id"] == req.request_id and value["id"].startswith("shop.orders:10001:1610676724000.")
    assert value["id"].endswith(":insert")
    assert value["inputs"] == {"amount": 12.5, "customer_id": 501, "currency": "EUR", "is_first_order": True,
                               "created_at_ms": CREATED_MS}
    assert value["metadata"]["cdc"] == {"format": "canal-json", "db": "shop", "table": "orders", "op": "insert",
                                        "pk": {"id": 10001}, "ts_ms": 1610676724000,
                                        "position": "batch=2,es=1610676724000"}


@pytest.mark.parametrize(
    "fmt, name",
    [("canal-json", "canal_insert.json"), ("debezium-json", "debezium_schema_create.json"),
     ("maxwell-json", "maxwell_insert.json")],
)
def test_the_same_row_gives_the_same_inputs_whatever_the_cdc_tool(fmt, name):
    _, value = only_request(converter(fmt).convert(*record(name)))
    assert value["inputs"]["amount"] == 12.5
    assert value["inputs"]["created_at_ms"] == CREATED_MS
    assert value["inputs"]["currency"] == "EUR"
    assert value["inputs"]["is_first_order"] is True   # Debezium/Maxwell int 1 coerced to the model's bool


def test_replay_gives_byte_identical_requests():
    first = converter("debezium-json").convert(*record("debezium_schema_update.json"))
    again = converter("debezium-json").convert(*record("debezium_schema_update.json"))
    assert [(r.key, r.value) for r in first.requests] == [(r.key, r.value) for r in again.requests]
    assert first.requests[0].request_id == "shop.orders:1004:mysql-bin.000003:4540:0:update"


def test_multi_row_message_gives_one_request_per_row_in_order():
    outcome = converter("canal-json").convert(*record("canal_multi_insert.json"))
    assert [r.key for r in outcome.requests] == [b"shop.orders:10002", b"shop.orders:10003", b"shop.orders:10004"]
    nulls = orjson.loads(outcome.requests[1].value)["inputs"]
    assert nulls["amount"] is None and nulls["created_at_ms"] is None   # NULL stays null for the validator
    assert len({r.request_id for r in outcome.requests}) == 3


@pytest.mark.parametrize(
    "fmt, mapped, unmapped",
    [
        ("canal-json", "canal_update_mapped.json", "canal_update_unmapped.json"),
        ("debezium-json", "debezium_schema_update.json", "debezium_schema_update_unmapped.json"),
    ],
)
def test_updates_touching_no_mapped_column_are_skipped_and_counted(fmt, mapped, unmapped):
    conv = converter(fmt)
    _, value = only_request(conv.convert(*record(mapped)))
    assert value["inputs"]["amount"] == 15.0 and value["metadata"]["cdc"]["op"] == "update"
    outcome = conv.convert(*record(unmapped))
    assert outcome.ok and outcome.requests == [] and outcome.skipped == {"unchanged_update": 1}
    assert conv.stats()["skipped.unchanged_update"] == 1


def test_unchanged_updates_are_scored_when_the_option_is_off():
    conv = converter("canal-json", skip_unchanged_updates=False)
    assert len(conv.convert(*record("canal_update_unmapped.json")).requests) == 1


def test_maxwell_update_rows_filtered_per_row():
    conv = converter("maxwell-json")
    outcomes = [conv.convert(k, v) for k, v in records("maxwell_update.json")]
    assert [len(o.requests) for o in outcomes] == [1, 0]


def test_partial_skip_inside_a_multi_row_update():
    outcome = converter("canal-json", mapping={"amount": "amount"}).convert(*record("canal_update_multi.json"))
    assert [r.key for r in outcome.requests] == [b"shop.orders:10004"]
    assert outcome.skipped == {"unchanged_update": 1}


def test_deletes_are_skipped_by_default_and_use_the_before_image_when_enabled():
    assert converter("canal-json").convert(*record("canal_delete.json")).skipped == {"operation_not_selected": 1}
    conv = converter("debezium-json", operations=["insert", "update", "delete"])
    delete, tomb = records("debezium_schema_delete.json")
    _, value = only_request(conv.convert(*delete))
    assert value["inputs"]["amount"] == 15.0 and value["id"].endswith(":delete")
    assert conv.convert(*tomb).skipped == {"tombstone": 1}


def test_snapshot_reads_follow_insert_and_say_read():
    _, value = only_request(converter("debezium-json").convert(*record("debezium_schema_read.json")))
    assert value["metadata"]["cdc"]["op"] == "read"
    outcome = converter("debezium-json", operations=["update"]).convert(*record("debezium_schema_read.json"))
    assert outcome.skipped == {"operation_not_selected": 1}


def test_table_globs_select_tables():
    assert converter("canal-json", tables=["shop.ord*"]).convert(*record("canal_insert.json")).requests
    outcome = converter("canal-json", tables=["billing.*", "shop.refunds"]).convert(*record("canal_insert.json"))
    assert outcome.skipped == {"table_not_selected": 1}


def test_missing_mapped_column_is_a_schema_mismatch_naming_the_column():
    conv = CdcConverter(make_spec("canal-json", mapping={"amount": "total_amount"}), {"amount": "float"})
    outcome = conv.convert(*record("canal_insert.json"))
    assert outcome.error.reason.value == "schema_mismatch"
    assert "'total_amount'" in outcome.error.detail and "orders-to-fraud" in outcome.error.detail
    assert conv.stats()["errors.schema_mismatch"] == 1


def test_schemaless_base64_decimal_is_dead_lettered_with_the_fix():
    outcome = converter("debezium-json").convert(*record("debezium_plain_create.json"))
    assert outcome.error.reason.value == "cast_error"
    assert "decimal.handling.mode" in outcome.error.detail and "decimal_scales" in outcome.error.detail
    fixed = converter("debezium-json", decimal_scales={"shop.orders.amount": 2})
    _, value = only_request(fixed.convert(*record("debezium_plain_create.json")))
    assert value["inputs"]["amount"] == 12.5 and value["inputs"]["created_at_ms"] == CREATED_MS


def test_string_decimal_mode_passes_through_and_is_coerced():
    _, value = only_request(converter("debezium-json").convert(*record("debezium_plain_create_string_decimal.json")))
    assert value["inputs"]["amount"] == 99.95


def test_missing_primary_key_is_dead_lettered_unless_configured():
    _, value = record("debezium_plain_create_string_decimal.json")
    outcome = converter("debezium-json").convert(None, value)
    assert outcome.error.reason.value == "missing_primary_key" and "primary_keys" in outcome.error.detail
    conv = converter("debezium-json", primary_keys={"shop.orders": ["customer_id", "id"]})
    req, _ = only_request(conv.convert(None, value))
    assert req.key == b"shop.orders:customer_id=505,id=1005"


def test_model_coercion_failures_are_cast_errors():
    conv = CdcConverter(make_spec("canal-json", mapping={"amount": "status"}), {"amount": "float"})
    outcome = conv.convert(*record("canal_insert.json"))
    assert outcome.error.reason.value == "cast_error" and "inputs.amount" in outcome.error.detail


def test_without_mapping_the_models_fields_are_taken_by_name():
    conv = CdcConverter(make_spec("canal-json", mapping=None), {"amount": "float", "status": "string"})
    _, value = only_request(conv.convert(*record("canal_insert.json")))
    assert value["inputs"] == {"amount": 12.5, "status": "NEW"}


def test_without_mapping_or_model_types_every_column_is_sent():
    conv = CdcConverter(make_spec("canal-json", mapping=None))
    _, value = only_request(conv.convert(*record("canal_insert.json")))
    assert value["inputs"]["note"] is None and value["inputs"]["created_at"] == "2021-01-15T02:12:04"
    assert conv.request_topic == "sie.model.fraud-scorer.requests"


def test_mapping_to_an_unknown_model_field_is_rejected_at_construction():
    with pytest.raises(ConnectorSpecError, match="no input field"):
        CdcConverter(make_spec("canal-json", mapping={"amout": "amount"}), ORDER_FIELD_TYPES)


def test_custom_id_template():
    conv = converter("debezium-json", id_template="{connector}/{db}.{table}/{pk}@{position}")
    req, _ = only_request(conv.convert(*record("debezium_schema_create.json")))
    assert req.request_id == "orders-to-fraud/shop.orders/1004@mysql-bin.000003:4132:0"


def test_pk_text_escapes_separators():
    key, value = record("debezium_plain_create_string_decimal.json")
    conv = converter("debezium-json")
    (row,) = decode_debezium(encode({"code": "a:b,c=d%"}), value).rows
    row = row._replace(after={**row.after, "code": "a:b,c=d%"})
    (req,) = rows_to_requests([row], conv.spec, ORDER_FIELD_TYPES)
    assert req.key == b"shop.orders:a%3Ab%2Cc%3Dd%25"


def test_rows_to_requests_raises_on_bad_rows():
    rows = decode_canal(*record("canal_insert.json")).rows
    spec = make_spec("canal-json", mapping={"x": "missing_col"})
    with pytest.raises(Exception) as err:
        rows_to_requests(rows, spec)
    assert err.value.reason.value == "schema_mismatch"


def test_every_malformed_fixture_becomes_an_error_outcome_never_an_exception():
    for case in malformed_cases():
        conv = converter(case["format"])
        outcome = conv.convert(case["key_bytes"], case["value_bytes"])
        assert outcome.error is not None and outcome.error.reason.value == case["reason"], case["name"]
        assert outcome.requests == []


def test_unexpected_shapes_deep_inside_are_malformed_not_crashes():
    doc = json.loads(record("canal_insert.json")[1])
    doc["mysqlType"] = ["not", "a", "map"]
    outcome = converter("canal-json").convert(None, encode(doc))
    assert outcome.error is not None and outcome.error.reason.value == "malformed_event"


def _canal_insert(**row) -> bytes:
    doc = json.loads(record("canal_insert.json")[1])
    doc["data"][0].update(row)
    return encode(doc)


def test_sql_null_follows_the_models_input_schema():
    """nullable -> null; optional (not required) -> left out; required and not nullable -> a dead letter
    in the stage, naming the field, the column and the row, with the row's coordinates."""
    conv = CdcConverter(make_spec("canal-json"), input_schema=ORDER_INPUT_SCHEMA)
    _req, value = only_request(conv.convert(None, _canal_insert(amount=None, is_first_order=None)))
    assert value["inputs"] == {"amount": None, "customer_id": 501, "currency": "EUR", "created_at_ms": CREATED_MS}

    outcome = conv.convert(None, _canal_insert(created_at="0000-00-00 00:00:00"))  # MySQL zero date reads as NULL
    assert outcome.requests == [] and outcome.error.reason.value == "null_in_required_field"
    assert "inputs.created_at_ms" in outcome.error.detail and "shop.orders.created_at" in outcome.error.detail
    assert outcome.error.coordinates == {"db": "shop", "table": "orders", "op": "insert", "pk": "10001",
                                         "position": "batch=2,es=1610676724000"}


def test_without_the_schema_null_is_passed_on():
    _req, value = only_request(converter("canal-json").convert(None, _canal_insert(customer_id=None)))
    assert value["inputs"]["customer_id"] is None


def test_field_types_and_input_schema_are_alternatives():
    with pytest.raises(ValueError, match="not both"):
        CdcConverter(make_spec("canal-json"), ORDER_FIELD_TYPES, input_schema=ORDER_INPUT_SCHEMA)


def test_row_level_errors_carry_the_rows_coordinates_and_record_level_ones_do_not():
    conv = converter("canal-json", mapping={"amount": "missing_col"})
    outcome = conv.convert(*record("canal_insert.json"))
    assert outcome.error.reason.value == "schema_mismatch"
    assert outcome.error.coordinates["pk"] == "10001" and outcome.error.coordinates["table"] == "orders"
    assert converter("canal-json").convert(None, b"[]").error.coordinates == {}


def test_an_unforeseen_exception_is_a_conversion_error_outcome(monkeypatch):
    conv = converter("canal-json")
    monkeypatch.setattr(conv, "_decode", lambda *_: (_ for _ in ()).throw(RecursionError("deep")))
    outcome = conv.convert(None, b"{}")
    assert outcome.requests == [] and outcome.error.reason.value == "conversion_error"
    assert outcome.error.detail == "unexpected RecursionError: deep"
    assert conv.stats()["errors.conversion_error"] == 1


def test_stats_count_every_outcome():
    conv = converter("canal-json")
    for name in ("canal_insert.json", "canal_multi_insert.json", "canal_ddl_alter.json", "canal_update_unmapped.json"):
        conv.convert(*record(name))
    conv.convert(None, b"not json")
    assert conv.stats() == Counter(
        records=5, records_converted=2, records_skipped=2, records_failed=1, requests=4,
        **{"skipped.ddl": 1, "skipped.unchanged_update": 1, "errors.invalid_json": 1},
    )


# ----------------------------------------------------------------------------- connector spec

def test_load_connector_spec_from_yaml_accepts_camel_case_and_k8s_wrapper(tmp_path):
    path = tmp_path / "orders.yaml"
    path.write_text(
        "kind: CdcConnector\nmetadata: {name: orders-to-fraud}\nspec:\n  format: canal-json\n"
        "  sourceTopic: canal.shop.orders\n  model: fraud-scorer\n  tables: ['shop.*']\n"
        "  operations: [insert, update, delete]\n  mapping: {amount: amount}\n  skipUnchangedUpdates: false\n"
    )
    spec = load_connector_spec(path)
    assert (spec.name, spec.source_topic, spec.operations, spec.skip_unchanged_updates) == (
        "orders-to-fraud", "canal.shop.orders", ["insert", "update", "delete"], False)


def test_spec_errors_list_every_field_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: x\nformat: canal\nsource_topic: t\nmodel: m\ntables: [orders]\noperations: [insert, upsert]\n"
        "decimal_scales: {orders.amount: 2}\nid_template: '{db}:{ts_ms}'\nbogus: 1\n"
    )
    with pytest.raises(ConnectorSpecError) as err:
        load_connector_spec(path)
    msg = str(err.value)
    for needle in ("connector.format", "connector.tables", "connector.operations[1]", "connector.decimal_scales",
                   "connector.id_template", "connector.bogus", str(path)):
        assert needle in msg, needle


def test_spec_is_strict_about_types():
    with pytest.raises(ConnectorSpecError, match="connector.skip_unchanged_updates"):
        make_spec("canal-json", skip_unchanged_updates="yes")


def test_unreadable_spec_file_names_the_path(tmp_path):
    with pytest.raises(ConnectorSpecError, match="cannot read"):
        load_connector_spec(tmp_path / "missing.yaml")
