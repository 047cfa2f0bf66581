"""Debezium JSON decoding: envelope with and without the schema wrapper, tombstones,
non-row records, base64 decimals and epoch temporals."""

from __future__ import annotations

import base64
import json

import pytest

from sie.connectors.cdc import CdcDecodeError, DecodeOptions, Op, SkipReason, decode_debezium
from sie.connectors.cdc.casting import decode_decimal_bytes
from tests.support.cdc_support import encode, malformed_cases, record, records


def test_create_with_schema_decodes_decimal_and_temporals_from_schema_names():
    (row,) = decode_debezium(*record("debezium_schema_create.json")).rows
    assert (row.source_format, row.database, row.table, row.op) == ("debezium-json", "shop", "orders", Op.INSERT)
    assert row.pk == {"id": 1004}
    a = row.after
    assert a["amount"] == 12.5                              # base64 "BOI=" with scale 2 from the schema
    assert a["created_at"] == "2021-01-15T02:12:04"         # io.debezium.time.Timestamp (epoch ms)
    assert a["ship_date"] == "2021-01-18"                   # io.debezium.time.Date (epoch days)
    assert a["updated_at"] == "2021-01-15T02:12:04Z"        # ZonedTimestamp kept as ISO text
    assert a["is_first_order"] == 1                         # Debezium sends tinyint(1) as INT16
    assert row.ts_ms == 1610676724000                       # source.ts_ms, not the processing ts_ms
    assert row.position == "mysql-bin.000003:4132:0"


def test_schema_and_schemaless_records_agree_except_for_schema_only_knowledge():
    (wrapped,) = decode_debezium(*record("debezium_schema_update.json")).rows
    (plain,) = decode_debezium(*record("debezium_plain_update.json")).rows
    assert wrapped.pk == plain.pk and wrapped.position == plain.position
    assert wrapped.changed_columns == plain.changed_columns == frozenset({"amount", "status"})
    assert plain.after["amount"] == "Bdw="                   # no schema: scale unknown, left alone
    assert plain.after["created_at"] == 1610676724000        # no schema: epoch number stays a number


def test_decimal_scales_config_decodes_schemaless_precise_decimals():
    options = DecodeOptions(decimal_scales={"shop.orders.amount": 2})
    (row,) = decode_debezium(*record("debezium_plain_update.json"), options).rows
    assert row.after["amount"] == 15.0 and row.before["amount"] == 12.5


def test_update_changed_columns_are_computed_from_before_and_after():
    (row,) = decode_debezium(*record("debezium_schema_update_unmapped.json")).rows
    assert row.changed_columns == frozenset({"note"})
    assert row.before["note"] is None and row.after["note"] == "gift wrap"


def test_update_without_before_image_has_unknown_changed_columns():
    key, value = record("debezium_plain_update.json")
    doc = json.loads(value)
    doc["before"] = None  # e.g. Postgres REPLICA IDENTITY DEFAULT
    (row,) = decode_debezium(key, encode(doc)).rows
    assert row.changed_columns is None


def test_delete_then_tombstone():
    (delete, tomb) = records("debezium_schema_delete.json")
    (row,) = decode_debezium(*delete).rows
    assert row.op is Op.DELETE and row.after is None and row.before["note"] == "gift wrap"
    assert decode_debezium(*tomb).skipped is SkipReason.TOMBSTONE
    assert decode_debezium(b'{"id": 1}', b"").skipped is SkipReason.TOMBSTONE


def test_snapshot_read_is_op_read():
    (row,) = decode_debezium(*record("debezium_schema_read.json")).rows
    assert row.op is Op.READ and row.pk == {"id": 1001} and row.after["amount"] == 12.5


def test_primary_key_change_is_delete_tombstone_create_with_old_and_new_keys():
    results = [decode_debezium(k, v) for k, v in records("debezium_pk_change.json")]
    assert results[0].rows[0].op is Op.DELETE and results[0].rows[0].pk == {"id": 1004}
    assert results[1].skipped is SkipReason.TOMBSTONE
    assert results[2].rows[0].op is Op.INSERT and results[2].rows[0].pk == {"id": 2004}


@pytest.mark.parametrize(
    "name, reason",
    [
        ("debezium_transaction.json", SkipReason.TRANSACTION_MARKER),
        ("debezium_heartbeat.json", SkipReason.HEARTBEAT),
        ("debezium_schema_change.json", SkipReason.DDL),
    ],
)
def test_non_row_records_are_skipped_with_their_reason(name, reason):
    for key, value in records(name):
        assert decode_debezium(key, value).skipped is reason


@pytest.mark.parametrize("op, reason", [("t", SkipReason.TRUNCATE), ("m", SkipReason.CONTROL_EVENT)])
def test_truncate_and_message_ops_are_skipped(op, reason):
    key, value = record("debezium_plain_create.json")
    doc = json.loads(value)
    doc.update(op=op, after=None)
    assert decode_debezium(key, encode(doc)).skipped is reason


def test_missing_or_unreadable_key_leaves_pk_empty_for_the_converter_to_resolve():
    _, value = record("debezium_plain_create.json")
    assert decode_debezium(None, value).rows[0].pk == {}
    assert decode_debezium(b"Struct{id=1004}", value).rows[0].pk == {}


def test_composite_key_keeps_key_field_order():
    key, value = record("debezium_plain_create.json")
    (row,) = decode_debezium(encode({"customer_id": 504, "id": 1004}), value).rows
    assert list(row.pk.items()) == [("customer_id", 504), ("id", 1004)]


def test_postgres_source_uses_schema_and_lsn():
    key, value = record("debezium_plain_create.json")
    doc = json.loads(value)
    doc["source"] = {"connector": "postgresql", "db": "shopdb", "schema": "public", "table": "orders",
                     "ts_ms": 5, "lsn": 24023128}
    (row,) = decode_debezium(key, encode(doc)).rows
    assert (row.database, row.position, row.ts_ms) == ("public", "lsn:24023128", 5)


@pytest.mark.parametrize(
    "value, scale, expected",
    [("BOI=", 2, 12.5), ("nQ==", 2, -0.99), ("AA==", 0, 0.0), (base64.b64encode((10**20).to_bytes(9, "big")).decode(), 2, 1e18)],
)
def test_precise_decimal_is_big_endian_twos_complement(value, scale, expected):
    assert decode_decimal_bytes(value, scale) == pytest.approx(expected)


def test_micro_and_nano_timestamps_and_times():
    schema = {"type": "struct", "fields": [
        {"type": "struct", "field": "after", "fields": [
            {"type": "int64", "field": "us", "name": "io.debezium.time.MicroTimestamp"},
            {"type": "int64", "field": "ns", "name": "io.debezium.time.NanoTimestamp"},
            {"type": "int64", "field": "t", "name": "io.debezium.time.MicroTime"},
            {"type": "struct", "field": "v", "name": "io.debezium.data.VariableScaleDecimal"}]}]}
    payload = {"op": "c", "before": None, "source": {"db": "d", "table": "t", "ts_ms": 1},
               "after": {"us": 1610676724123456, "ns": 1610676724123456789, "t": 45296000001,
                         "v": {"scale": 3, "value": "MDk="}}}
    (row,) = decode_debezium(b'{"id":1}', encode({"schema": schema, "payload": payload})).rows
    assert row.after["us"] == "2021-01-15T02:12:04.123456"
    assert row.after["ns"] == "2021-01-15T02:12:04.123456"
    assert row.after["t"] == "12:34:56.000001"
    assert row.after["v"] == 12.345


def test_bad_base64_decimal_is_a_cast_error_naming_the_column():
    key, value = record("debezium_schema_create.json")
    doc = json.loads(value)
    doc["payload"]["after"]["amount"] = "not*base64"
    with pytest.raises(CdcDecodeError) as err:
        decode_debezium(key, encode(doc))
    assert err.value.reason.value == "cast_error" and "shop.orders.amount" in err.value.detail


@pytest.mark.parametrize(
    "case", [c for c in malformed_cases() if c["format"] == "debezium-json"], ids=lambda c: c["name"]
)
def test_malformed_events_raise_with_reason(case):
    with pytest.raises(CdcDecodeError) as err:
        decode_debezium(case["key_bytes"], case["value_bytes"])
    assert err.value.reason.value == case["reason"]


def test_flattened_record_error_explains_the_smt():
    (case,) = [c for c in malformed_cases() if c["name"] == "debezium_flattened"]
    with pytest.raises(CdcDecodeError, match="ExtractNewRecordState"):
        decode_debezium(case["key_bytes"], case["value_bytes"])
