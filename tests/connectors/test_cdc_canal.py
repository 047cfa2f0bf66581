"""Canal flatMessage decoding: arrays of rows, aligned ``old``, string casting, DDL by ``type``."""

from __future__ import annotations

import json

import pytest

from sie.connectors.cdc import CdcDecodeError, DecodeOptions, Op, SkipReason, decode_canal
from tests.support.cdc_support import encode, malformed_cases, record


def test_insert_casts_every_string_by_mysql_type():
    (row,) = decode_canal(*record("canal_insert.json")).rows
    assert (row.source_format, row.database, row.table, row.op) == ("canal-json", "shop", "orders", Op.INSERT)
    assert row.pk == {"id": 10001}
    assert row.before is None and row.changed_columns is None
    a = row.after
    assert a["id"] == 10001 and type(a["id"]) is int
    assert a["amount"] == 12.5 and type(a["amount"]) is float          # decimal(10,2) -> float
    assert a["is_first_order"] is True                                 # tinyint(1) -> bool
    assert a["created_at"] == "2021-01-15T02:12:04"                    # datetime -> zoneless ISO
    assert a["ship_date"] == "2021-01-18"
    assert a["currency"] == "EUR" and a["note"] is None
    assert row.ts_ms == 1610676724000
    assert "batch=2" in row.position and "es=1610676724000" in row.position


def test_multi_row_statement_gives_one_row_change_per_row_with_nulls_kept():
    rows = decode_canal(*record("canal_multi_insert.json")).rows
    assert [r.pk["id"] for r in rows] == [10002, 10003, 10004]
    assert rows[0].after["is_first_order"] is False
    nulls = rows[1].after
    assert nulls["amount"] is None and nulls["created_at"] is None and nulls["is_first_order"] is None
    assert nulls["ship_date"] is None                                  # MySQL zero date -> None
    assert rows[2].after["amount"] == -1234.56
    assert len({r.ref for r in rows}) == 3                             # same es, distinct refs


def test_update_before_image_is_after_overlaid_with_old_and_changed_columns_are_old_keys():
    (row,) = decode_canal(*record("canal_update_mapped.json")).rows
    assert row.op is Op.UPDATE
    assert row.changed_columns == frozenset({"amount", "status"})
    assert row.after["amount"] == 15.0 and row.after["status"] == "PAID"
    assert row.before["amount"] == 12.5 and row.before["status"] == "NEW"
    assert row.before["customer_id"] == row.after["customer_id"] == 501


def test_multi_row_update_aligns_old_by_index():
    rows = decode_canal(*record("canal_update_multi.json")).rows
    assert [r.changed_columns for r in rows] == [frozenset({"status"}), frozenset({"status", "amount"})]
    assert rows[1].before["amount"] == -1000.0 and rows[1].after["amount"] == -1234.56
    assert rows[0].before["amount"] == 0.99


def test_old_key_with_null_means_previous_value_was_null():
    (row,) = decode_canal(*record("canal_update_unmapped.json")).rows
    assert row.changed_columns == frozenset({"note"})
    assert row.before["note"] is None and row.after["note"] == "gift wrap"


def test_delete_uses_data_as_before_image():
    (row,) = decode_canal(*record("canal_delete.json")).rows
    assert row.op is Op.DELETE and row.after is None
    assert row.before["id"] == 10001 and row.image is row.before


def test_ddl_is_skipped_by_type():
    assert decode_canal(*record("canal_ddl_alter.json")).skipped is SkipReason.DDL


def test_ddl_type_wins_over_a_wrong_is_ddl_flag():
    doc = json.loads(record("canal_ddl_alter.json")[1])
    doc["isDdl"] = False  # some canal versions send QUERY/TRUNCATE with isDdl false
    doc["type"] = "TRUNCATE"
    assert decode_canal(None, encode(doc)).skipped is SkipReason.DDL


def test_row_type_is_decoded_even_if_is_ddl_is_true():
    doc = json.loads(record("canal_insert.json")[1])
    doc["isDdl"] = True
    assert decode_canal(None, encode(doc)).rows[0].op is Op.INSERT


@pytest.mark.parametrize("kind, reason", [("MHEARTBEAT", SkipReason.HEARTBEAT), ("GTID", SkipReason.TRANSACTION_MARKER)])
def test_non_row_types_are_skipped_with_their_reason(kind, reason):
    doc = {"data": None, "database": "", "table": "", "id": 9, "isDdl": False, "type": kind, "es": 1, "ts": 2}
    assert decode_canal(None, encode(doc)).skipped is reason


def test_unknown_type_is_malformed():
    doc = json.loads(record("canal_insert.json")[1])
    doc["type"] = "UPSERT"
    with pytest.raises(CdcDecodeError) as err:
        decode_canal(None, encode(doc))
    assert err.value.reason.value == "malformed_event" and "UPSERT" in err.value.detail


def test_empty_data_array_is_skipped_not_failed():
    doc = json.loads(record("canal_insert.json")[1])
    doc["data"] = []
    assert decode_canal(None, encode(doc)).skipped is SkipReason.EMPTY


def test_tinyint1_as_bool_can_be_turned_off():
    (row,) = decode_canal(*record("canal_insert.json"), DecodeOptions(tinyint1_as_bool=False)).rows
    assert row.after["is_first_order"] == 1 and type(row.after["is_first_order"]) is int


def test_sql_type_is_used_when_mysql_type_is_absent():
    doc = json.loads(record("canal_insert.json")[1])
    doc["mysqlType"] = None
    (row,) = decode_canal(None, encode(doc)).rows
    assert row.after["amount"] == 12.5 and row.after["id"] == 10001
    assert row.after["created_at"] == "2021-01-15T02:12:04"


def test_unsigned_bit_and_other_declared_types():
    doc = json.loads(record("canal_insert.json")[1])
    doc["mysqlType"].update({"id": "bigint(20) unsigned", "customer_id": "bit(1)", "currency": "enum('EUR','USD')"})
    (row,) = decode_canal(None, encode(doc)).rows
    assert row.after["id"] == 10001
    assert row.after["customer_id"] is True  # bit(1) '501' -> nonzero
    assert row.after["currency"] == "EUR"


def test_replayed_bytes_give_identical_refs_and_changed_content_gives_a_new_ref():
    key, value = record("canal_update_mapped.json")
    first = decode_canal(key, value).rows[0]
    assert decode_canal(key, value).rows[0].ref == first.ref
    doc = json.loads(value)
    doc["ts"] += 5000  # a canal duplicate (re-sent later): same change, same ref
    doc["id"] = 99
    assert decode_canal(None, encode(doc)).rows[0].ref == first.ref
    doc["data"][0]["amount"] = "16.00"  # a different change in the same second
    assert decode_canal(None, encode(doc)).rows[0].ref != first.ref


@pytest.mark.parametrize("case", [c for c in malformed_cases() if c["format"] == "canal-json"], ids=lambda c: c["name"])
def test_malformed_events_raise_with_reason(case):
    with pytest.raises(CdcDecodeError) as err:
        decode_canal(case["key_bytes"], case["value_bytes"])
    assert err.value.reason.value == case["reason"]
    assert str(err.value).startswith(case["reason"] + ": ")


def test_cast_error_names_table_column_and_declared_type():
    (case,) = [c for c in malformed_cases() if c["name"] == "canal_bad_decimal"]
    with pytest.raises(CdcDecodeError) as err:
        decode_canal(None, case["value_bytes"])
    assert "shop.orders.amount" in err.value.detail and "decimal(10,2)" in err.value.detail
