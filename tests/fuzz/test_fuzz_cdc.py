"""Fuzz the CDC conversion path: the three decoders and the conversion to requests.

Property: every record (key, value) yields rows/skips, or a ``CdcDecodeError`` with a known reason and a
detail; ``CdcConverter.convert`` never raises and never needs its last line of defence
(``conversion_error`` means an unforeseen failure: a bug).  Every request it writes is accepted by the
scorer's own request codec for the model's input schema (so nothing is silently turned into something the
scorer rejects, e.g. ``1e999`` into ``null``), and converting the same record twice gives the same bytes.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sie.connectors.cdc import CdcConverter, CdcDecodeError, CdcErrorReason, rows_to_requests
from sie.schemas.validation import compile_validator
from sie.streams.scorer.codec import Codec, Request
from tests.fuzz.strategies import JSON_VALUES, deep, mutated, to_json
from tests.support.cdc_support import ORDER_FIELD_TYPES, ORDER_INPUT_SCHEMA, make_spec, records

FORMATS = ("canal-json", "debezium-json", "maxwell-json")
FIXTURES = {
    "canal-json": ("canal_insert.json", "canal_multi_insert.json", "canal_update_mapped.json",
                   "canal_update_multi.json", "canal_delete.json", "canal_ddl_alter.json"),
    "debezium-json": ("debezium_schema_create.json", "debezium_schema_update.json", "debezium_schema_delete.json",
                      "debezium_plain_create.json", "debezium_plain_update.json", "debezium_pk_change.json",
                      "debezium_transaction.json", "debezium_heartbeat.json"),
    "maxwell-json": ("maxwell_insert.json", "maxwell_update.json", "maxwell_delete.json", "maxwell_bootstrap.json"),
}
# (key doc or None, value doc) of every valid fixture record with a value, per format
SEEDS = {
    fmt: [(orjson.loads(k) if k else None, orjson.loads(v)) for name in names for k, v in records(name) if v]
    for fmt, names in FIXTURES.items()
}
SCORER = Codec("orders", compile_validator(ORDER_INPUT_SCHEMA), max_request_bytes=1 << 20, max_json_depth=64)
ALL_OPS = ["insert", "update", "delete"]


class Subject:
    """One converter configuration and how to call ``rows_to_requests`` the same way."""

    def __init__(self, fmt: str, model: dict[str, Any], **spec: Any) -> None:
        self.spec = make_spec(fmt, operations=ALL_OPS, **spec)
        self.model = model
        self.converter = CdcConverter(self.spec, **model)
        self.typed = "input_schema" in model


def subjects(fmt: str) -> list[Subject]:
    scales = {"decimal_scales": {"shop.orders.amount": 2}} if fmt == "debezium-json" else {}
    return [
        Subject(fmt, {"input_schema": ORDER_INPUT_SCHEMA}, **scales),  # types + NULL rules
        Subject(fmt, {"field_types": ORDER_FIELD_TYPES}),              # types only
        Subject(fmt, {}, mapping=None, primary_keys={"shop.orders": ["id"]}),  # every column, uncast
    ]


SUBJECTS = {fmt: subjects(fmt) for fmt in FORMATS}


def _check_error(exc: CdcDecodeError) -> None:
    assert isinstance(exc.reason, CdcErrorReason)
    assert exc.reason is not CdcErrorReason.CONVERSION_ERROR, exc.detail
    assert isinstance(exc.detail, str) and exc.detail


def check_record(fmt: str, key: bytes | None, value: bytes | None) -> None:
    """The fuzz property for one source record, for every converter configuration."""
    for s in SUBJECTS[fmt]:
        try:  # decoder and request building called directly: an unexpected exception surfaces with its traceback
            result = s.converter.decode(key, value)
        except CdcDecodeError as exc:
            _check_error(exc)
        else:
            assert (result.skipped is None) == bool(result.rows)
            try:
                rows_to_requests(result.rows, s.spec, **s.model)
            except CdcDecodeError as exc:
                _check_error(exc)

        outcome = s.converter.convert(key, value)
        if outcome.error is not None:
            _check_error(outcome.error)
            assert outcome.requests == []
        for req in outcome.requests:
            doc = orjson.loads(req.value)
            assert isinstance(doc, dict) and isinstance(doc["inputs"], dict) and doc["id"] == req.request_id
            assert req.key.startswith(b"shop.orders:")
            if s.typed:
                parsed = SCORER.parse("t", 0, 0, req.key, req.value, None)
                assert isinstance(parsed, Request), (parsed, req.value[:300])
        again = s.converter.convert(key, value)
        assert [(r.key, r.value) for r in again.requests] == [(r.key, r.value) for r in outcome.requests]
        assert (again.error and again.error.as_dict()) == (outcome.error and outcome.error.as_dict())


def _encode_key(doc: Any) -> bytes | None:
    return None if doc is None else to_json(doc)


# --------------------------------------------------------------------------- arbitrary input

@pytest.mark.parametrize("fmt", FORMATS)
@given(key=st.none() | st.binary(max_size=40), value=st.none() | st.binary(max_size=200))
def test_arbitrary_bytes(fmt, key, value):
    check_record(fmt, key, value)


@pytest.mark.parametrize("fmt", FORMATS)
@given(key=st.none() | JSON_VALUES, value=JSON_VALUES)
def test_arbitrary_json(fmt, key, value):
    check_record(fmt, _encode_key(key), to_json(value))


# --------------------------------------------------------------------------- valid events, mutated

@st.composite
def mutated_event(draw: st.DrawFn, fmt: str) -> tuple[bytes | None, bytes]:
    key, value = draw(st.sampled_from(SEEDS[fmt]))
    value = draw(mutated(value))
    if key is not None and draw(st.integers(0, 3)) == 0:
        key = draw(mutated(key))
    return _encode_key(key), to_json(value)


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_mutated_valid_events(fmt, data):
    key, value = data.draw(mutated_event(fmt))
    check_record(fmt, key, value)


# --------------------------------------------------------------------------- found examples, kept
# Each of these crashed the stage (or silently changed a value) before the fix; the test names the cause.

def _canal(**row_overrides: Any) -> dict:
    doc = copy.deepcopy(SEEDS["canal-json"][0][1])
    doc["data"][0].update(row_overrides)
    return doc


def _maxwell(**row_overrides: Any) -> dict:
    doc = copy.deepcopy(SEEDS["maxwell-json"][0][1])
    doc["data"].update(row_overrides)
    return doc


def _debezium(**row_overrides: Any) -> tuple[dict, dict]:
    key, doc = copy.deepcopy(SEEDS["debezium-json"][0])
    doc["payload"]["after"].update(row_overrides)
    return key, doc


def _after_fields(doc: dict) -> list[dict]:
    (row,) = [f for f in doc["schema"]["fields"] if f["field"] == "after"]
    return row["fields"]


def _outcome(fmt: str, key: Any, value: Any, subject: int = 0):
    check_record(fmt, _encode_key(key), to_json(value))
    return SUBJECTS[fmt][subject].converter.convert(_encode_key(key), to_json(value))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("where", ["value", "column", "position"])
def test_json_nested_1000_levels_is_malformed_not_recursion_error(fmt, where):
    """RecursionError when formatted (str of the nested list in an error message or position)."""
    key, doc = copy.deepcopy(SEEDS[fmt][0])
    if where == "value":
        doc = {"x": deep(1000)}
    elif where == "column":
        (doc["data"][0] if fmt == "canal-json" else doc["payload"]["after"] if fmt == "debezium-json"
         else doc["data"])["amount"] = deep(1000)
    else:
        doc[{"canal-json": "id", "maxwell-json": "xid", "debezium-json": "payload"}[fmt]] = deep(1000, as_object=True)
    outcome = _outcome(fmt, key, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT
    assert "nested" in outcome.error.detail


@pytest.mark.parametrize("fmt", FORMATS)
def test_key_nested_1000_levels_is_malformed(fmt):
    key, doc = SEEDS[fmt][0]
    outcome = _outcome(fmt, deep(1000, as_object=True), doc)
    if fmt == "canal-json":  # canal ignores the key
        assert outcome.error is None
    else:
        assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT


def test_400_digit_bigint_into_a_float_field_is_a_cast_error_not_overflow_error():
    doc = _canal(amount="9" * 400)
    doc["mysqlType"]["amount"] = "bigint(20)"
    outcome = _outcome("canal-json", None, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.CAST_ERROR
    assert "amount" in outcome.error.detail and "digits" in outcome.error.detail


@pytest.mark.parametrize("text", ["1e999", "-1e999", "nan", "inf"])
def test_non_finite_decimal_text_is_a_cast_error_not_a_silent_null(text):
    """float('1e999') is inf, which orjson writes as null: the request changed value without a word."""
    outcome = _outcome("canal-json", None, _canal(amount=text))
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.CAST_ERROR
    assert "amount" in outcome.error.detail


@pytest.mark.parametrize("text", ["9" * 400, "1e999", "nan"])
def test_non_finite_or_huge_text_into_numeric_model_fields_is_a_cast_error(text):
    """A varchar column mapped to float/int model inputs: the coercers, not the source casters."""
    doc = _canal(currency="EUR", customer_id=text)
    doc["mysqlType"]["customer_id"] = "varchar(500)"
    doc["data"][0]["amount"] = text
    doc["mysqlType"]["amount"] = "varchar(500)"
    outcome = _outcome("canal-json", None, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.CAST_ERROR


def test_integer_beyond_64_bits_without_a_model_type_is_a_cast_error():
    doc = _canal(amount="9" * 30)
    doc["mysqlType"]["amount"] = "bigint(20)"
    outcome = _outcome("canal-json", None, doc, subject=2)  # every column, uncast: orjson cannot write it
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.CAST_ERROR
    assert "amount" in outcome.error.detail


@pytest.mark.parametrize("scale", ["999999999", "-999999999"])
def test_absurd_decimal_scale_is_refused_before_computing_ten_to_its_power(scale):
    key, doc = _debezium()
    for f in _after_fields(doc):
        if f["field"] == "amount":
            f["parameters"]["scale"] = scale
    outcome = _outcome("debezium-json", key, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT


@pytest.mark.parametrize("value", [[1], {"a": 1}])
def test_primary_key_that_is_an_object_or_array_is_malformed(value):
    outcome = _outcome("maxwell-json", None, _maxwell(id=value) | {"primary_key_columns": ["id"]})
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT


@pytest.mark.parametrize("field, value", [("pkNames", [["id"]]), ("mysqlType", {"amount": ["decimal"]}),
                                          ("sqlType", {"amount": [3]}), ("mysqlType", "decimal"),
                                          ("id", {"batch": 1}), ("es", [1])])
def test_canal_type_maps_names_and_positions_of_the_wrong_shape_are_malformed(field, value):
    doc = _canal()
    doc[field] = value
    outcome = _outcome("canal-json", None, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT
    assert field in outcome.error.detail


@pytest.mark.parametrize("mutation", ["fields_not_array", "field_not_object", "name_not_string", "params_not_object"])
def test_debezium_schema_of_the_wrong_shape_is_malformed(mutation):
    key, doc = _debezium()
    (row,) = [f for f in doc["schema"]["fields"] if f["field"] == "after"]
    (amount,) = [f for f in row["fields"] if f["field"] == "amount"]
    if mutation == "fields_not_array":
        row["fields"] = "id,amount"
    elif mutation == "field_not_object":
        row["fields"][0] = "id"
    elif mutation == "name_not_string":
        amount["name"] = ["Decimal"]
    else:
        amount["parameters"] = ["scale", 2]
    outcome = _outcome("debezium-json", key, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT


@given(value=JSON_VALUES)
@example(value={"value": "AQID"})  # VariableScaleDecimal without a scale: KeyError
@example(value={"value": "AQID", "scale": "9" * 100})
@example(value="9" * 400)
def test_debezium_semantic_types_on_any_value(value):
    """Every Debezium semantic type's caster, fed any JSON value."""
    from sie.connectors.cdc.casting import _DEBEZIUM_NAMED

    key, doc = _debezium()
    fields = _after_fields(doc)
    for i, name in enumerate(sorted(n for n in _DEBEZIUM_NAMED if _DEBEZIUM_NAMED[n] is not None)):
        fields.append({"type": "int64", "optional": True, "name": name, "field": f"c{i}"})
        doc["payload"]["after"][f"c{i}"] = value
    check_record("debezium-json", _encode_key(key), to_json(doc))


@pytest.mark.parametrize("after", [[], "x", 5])
def test_debezium_delete_whose_after_is_not_an_object_is_malformed(after):
    """Found by test_mutated_valid_events: AttributeError ('list' has no .get) casting the after image."""
    (key, doc) = [(k, v) for k, v in SEEDS["debezium-json"] if v.get("payload", {}).get("op") == "d"][0]
    doc = copy.deepcopy(doc)
    doc["payload"]["after"] = after
    outcome = _outcome("debezium-json", key, doc)
    assert outcome.error is not None and outcome.error.reason is CdcErrorReason.MALFORMED_EVENT
    assert "'after'" in outcome.error.detail
