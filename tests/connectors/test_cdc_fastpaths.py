"""The CDC hot-path shortcuts (slice-built datetime text, cached epoch days, the
Debezium schema-prefix cache, before images reusing after casts) must give exactly
what the general paths give: request ids and bytes may never change."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime

import orjson
import pytest

from sie.connectors.cdc import CdcConverter, casting, decode_debezium
from sie.connectors.cdc.debezium import _schemas
from tests.support.cdc_support import ORDER_FIELD_TYPES, make_spec, records


def _general_datetime_text(v: str) -> str | None:
    return None if v.startswith("0000-00-00") else datetime.fromisoformat(v).isoformat()


def _general_epoch_ms(text: str) -> int | None:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        try:
            d = date.fromisoformat(text)
        except ValueError:
            return None
        dt = datetime(d.year, d.month, d.day)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ValueError as exc:
        return ("error", str(exc))


TEXTS = [
    f"{y}-{m}-{d}{sep}{h}:{mi}:{s}"
    for y, m, d, sep, h, mi, s in itertools.product(
        ["2021", "1969", "0001", "9999", "2000"], ["01", "02", "13"], ["28", "29", "31", "00"],
        [" ", "T"], ["00", "23", "24"], ["59", "60"], ["00", "59", "60"],
    )
] + ["2021-01-15", "2021-02-30", "2021-01-15 02:12:04.5", "2021-01-15 02:12:04+01:00", "2021-1-15 02:12:04"]


@pytest.mark.parametrize("text", list(dict.fromkeys(TEXTS[::7] + TEXTS[-5:])))
def test_canal_datetime_text_and_epoch_ms_equal_the_general_parse(text):
    assert _outcome(casting._to_datetime_text, text) == _outcome(_general_datetime_text, text)
    assert casting._temporal_to_epoch_ms(text) == _general_epoch_ms(text)


@pytest.mark.parametrize("us", [0, -1, 1, 1_610_676_724_123_456, 1_610_676_724_000_000, -62_135_596_800_000_000,
                                253_402_300_799_999_999])
def test_debezium_micro_timestamps_equal_datetime_isoformat(us):
    days, rem = divmod(us, 86_400_000_000)
    d = date.fromordinal(date(1970, 1, 1).toordinal() + days)
    secs, micro = divmod(rem, 1_000_000)
    expected = datetime(d.year, d.month, d.day, secs // 3600, secs // 60 % 60, secs % 60, micro).isoformat()
    assert casting._micros_to_datetime(us) == expected


def test_debezium_schema_prefix_cache_gives_the_same_requests_for_every_encoding():
    """Pretty, compact, reordered and trailing-newline encodings of the same record:
    the first two hit the cache, the others take the full parse; all agree."""
    key, value = records("debezium_schema_update.json")[0]
    doc = orjson.loads(value)
    encodings = [
        value,
        orjson.dumps(doc),
        orjson.dumps(doc),  # second time: served from the cache
        orjson.dumps({"payload": doc["payload"], "schema": doc["schema"]}),
        orjson.dumps(doc) + b"\n",
    ]
    _schemas.clear()
    conv = CdcConverter(make_spec("debezium-json", operations=["insert", "update", "delete"]), ORDER_FIELD_TYPES)
    outs = [[(r.key, r.value) for r in conv.convert(key, v).requests] for v in encodings]
    assert outs[0] and all(o == outs[0] for o in outs)
    assert any(e is not None for e in _schemas.values())  # the cache was really used
    # a cached prefix followed by a broken payload is still a clean dead letter
    bad = conv.convert(key, orjson.dumps(doc)[:-2] + b"}")
    assert bad.error is not None and bad.error.reason.value == "invalid_json"


def test_debezium_before_image_reuse_equals_casting_both_images():
    key, value = records("debezium_schema_update.json")[0]
    doc = orjson.loads(value)
    doc["payload"]["before"]["amount"] = doc["payload"]["after"]["amount"]
    (row,) = decode_debezium(key, orjson.dumps(doc)).rows
    schema_fields = next(f["fields"] for f in doc["schema"]["fields"] if f["field"] == "before")
    casters = casting.debezium_casters("shop.orders", schema_fields)
    assert row.before == casting.cast_row(doc["payload"]["before"], casters, "shop.orders")
    assert row.after == casting.cast_row(doc["payload"]["after"], casters, "shop.orders")


def test_the_last_value_memos_never_answer_for_another_text():
    """A fresh process (empty memo) and a warm one agree, including on texts that fail."""
    for text in ["", "2021-01-15 02:12:04", "", "x", "2021-01-15 02:12:04", "2021-01-15 02:12:05"]:
        assert _outcome(casting._to_datetime_text, text) == _outcome(_general_datetime_text, text)
        if len(text) >= 10:
            assert casting._temporal_to_epoch_ms(text) == _general_epoch_ms(text)
    casting._last_datetime_text[0] = (None, "")
    casting._last_epoch_ms[0] = (None, 0)
    assert _outcome(casting._to_datetime_text, "") == _outcome(_general_datetime_text, "")
    assert casting._fast_epoch_ms("") is None
