"""Maxwell JSON decoding: single-row messages, ``old``, bootstrap, pk from value or key."""

from __future__ import annotations

import json

import pytest

from sie.connectors.cdc import CdcDecodeError, Op, SkipReason, decode_maxwell
from tests.support.cdc_support import encode, malformed_cases, record, records


def test_insert_keeps_json_types_and_converts_ts_seconds_to_ms():
    (row,) = decode_maxwell(*record("maxwell_insert.json")).rows
    assert (row.source_format, row.database, row.table, row.op) == ("maxwell-json", "shop", "orders", Op.INSERT)
    assert row.pk == {"id": 10001}                     # pk column from the Kafka key "pk.id"
    assert row.after["amount"] == 12.5 and row.after["created_at"] == "2021-01-15 02:12:04"
    assert row.ts_ms == 1610676724000
    assert row.ref == "940752.commit"


def test_update_old_gives_changed_columns_and_before_image():
    first, last = (decode_maxwell(k, v).rows[0] for k, v in records("maxwell_update.json"))
    assert first.op is Op.UPDATE and first.changed_columns == frozenset({"amount", "status"})
    assert first.before["amount"] == 12.5 and first.after["amount"] == 15.0
    assert last.changed_columns == frozenset({"note"})
    # two rows of one transaction: xoffset vs the commit row stay distinct
    assert (first.ref, last.ref) == ("940786.0", "940786.commit")


def test_delete_uses_data_as_before_image():
    (row,) = decode_maxwell(*record("maxwell_delete.json")).rows
    assert row.op is Op.DELETE and row.after is None and row.before["status"] == "PAID"


def test_bootstrap_markers_are_skipped_and_bootstrap_insert_is_a_read():
    start, insert, complete = (decode_maxwell(k, v) for k, v in records("maxwell_bootstrap.json"))
    assert start.skipped is SkipReason.CONTROL_EVENT and complete.skipped is SkipReason.CONTROL_EVENT
    (row,) = insert.rows
    assert row.op is Op.READ and row.pk == {"id": 10002}   # from primary_key_columns


def test_array_key_format_gives_pk_columns():
    _, value = record("maxwell_insert.json")
    (row,) = decode_maxwell(encode(["shop", "orders", [{"id": 10001}]]), value).rows
    assert row.pk == {"id": 10001}


def test_no_key_and_no_pk_columns_leaves_pk_empty():
    _, value = record("maxwell_insert.json")
    assert decode_maxwell(None, value).rows[0].pk == {}


def test_ddl_types_are_skipped():
    doc = {"type": "table-alter", "database": "shop", "table": "orders", "sql": "ALTER TABLE orders ADD note text",
           "ts": 1610676800}
    assert decode_maxwell(None, encode(doc)).skipped is SkipReason.DDL


def test_update_without_old_is_malformed():
    key, value = records("maxwell_update.json")[0]
    doc = json.loads(value)
    del doc["old"]
    with pytest.raises(CdcDecodeError, match="old"):
        decode_maxwell(key, encode(doc))


@pytest.mark.parametrize("case", [c for c in malformed_cases() if c["format"] == "maxwell-json"], ids=lambda c: c["name"])
def test_malformed_events_raise_with_reason(case):
    with pytest.raises(CdcDecodeError) as err:
        decode_maxwell(case["key_bytes"], case["value_bytes"])
    assert err.value.reason.value == case["reason"]


def test_unknown_type_is_malformed():
    _, value = record("maxwell_insert.json")
    doc = json.loads(value)
    doc["type"] = "upsert"
    with pytest.raises(CdcDecodeError) as err:
        decode_maxwell(None, encode(doc))
    assert err.value.reason.value == "malformed_event"
