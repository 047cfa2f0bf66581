"""Per-message validation: JSON type rules, required/nullable, bounds, unknown-field policies."""

from __future__ import annotations

import json
import math

import pytest

from sie.schemas.spec import FieldSpec, IOSchema
from sie.schemas.validation import SchemaViolation, compile_validator


def _schema(*fields: FieldSpec, unknown: str = "reject") -> IOSchema:
    return IOSchema(fields=fields, unknown_fields=unknown)  # type: ignore[arg-type]


FRAUD = _schema(
    FieldSpec(name="amount", type="float", range=(0, 1000)),
    FieldSpec(name="count", type="int", range=(0, 10), required=False),
    FieldSpec(name="country", type="string", max_length=2),
    FieldSpec(name="is_new", type="bool", required=False),
    FieldSpec(name="note", type="string", nullable=True, required=False),
)


def _violation(validate, payload) -> SchemaViolation:
    with pytest.raises(SchemaViolation) as exc:
        validate(payload)
    return exc.value


def test_valid_payload_is_cleaned():
    validate = compile_validator(FRAUD)
    clean = validate({"amount": 12, "count": 3, "country": "DE", "is_new": False, "note": None})
    assert clean == {"amount": 12.0, "count": 3, "country": "DE", "is_new": False, "note": None}
    assert type(clean["amount"]) is float  # ints accepted for float fields, converted


def test_optional_fields_may_be_absent():
    assert compile_validator(FRAUD)({"amount": 1.5, "country": "FR"}) == {"amount": 1.5, "country": "FR"}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"amount": "abc", "country": "DE"}, "inputs.amount: must be a number (got 'abc')"),
        ({"amount": True, "country": "DE"}, "inputs.amount: must be a number (got True)"),
        ({"amount": 1, "count": True, "country": "DE"}, "inputs.count: must be an integer (got True)"),
        ({"amount": 1, "count": 2.0, "country": "DE"}, "inputs.count: must be an integer (got 2.0)"),
        ({"amount": 1, "country": 49}, "inputs.country: must be a string (got 49)"),
        ({"amount": 1, "country": "DE", "is_new": 1}, "inputs.is_new: must be a boolean (got 1)"),
        ({"amount": math.nan, "country": "DE"}, "inputs.amount: must be a finite number (NaN/Infinity not allowed) (got nan)"),
        ({"amount": math.inf, "country": "DE"}, "inputs.amount: must be a finite number (NaN/Infinity not allowed) (got inf)"),
        ({"amount": 1000.5, "country": "DE"}, "inputs.amount: out of range [0, 1000] (got 1000.5)"),
        ({"amount": -1, "country": "DE"}, "inputs.amount: out of range [0, 1000] (got -1)"),
        ({"amount": 1, "count": 11, "country": "DE"}, "inputs.count: out of range [0, 10] (got 11)"),
        ({"amount": 1, "country": "DEU"}, "inputs.country: longer than max_length 2 (3 characters) (got 'DEU')"),
        ({"country": "DE"}, "inputs.amount: required field missing"),
        ({"amount": None, "country": "DE"}, "inputs.amount: must not be null (got None)"),
        ({"amount": 1, "country": "DE", "extra": 5}, "inputs.extra: unknown field (declared: amount, count, country, is_new, note) (got 5)"),
        ([1, 2], "inputs: must be a JSON object (got [1, 2])"),
        ("text", "inputs: must be a JSON object (got 'text')"),
        ({"amount": 10**400, "country": "DE"}, None),
    ],
)
def test_violations_name_field_and_value(payload, message):
    exc = _violation(compile_validator(FRAUD), payload)
    if message is not None:
        assert str(exc) == message
    assert exc.dlq_reason == "schema_violation"


def test_violation_fields():
    exc = _violation(compile_validator(FRAUD), {"amount": "abc", "country": "DE"})
    assert (exc.field, exc.reason, exc.value) == ("amount", "must be a number", "abc")


def test_long_values_are_truncated_in_message():
    exc = _violation(compile_validator(FRAUD), {"amount": "x" * 1000, "country": "DE"})
    assert len(str(exc)) < 120 and str(exc).endswith("...)")


def test_boundaries_are_inclusive():
    validate = compile_validator(FRAUD)
    assert validate({"amount": 0, "count": 10, "country": "DE"})["count"] == 10
    assert validate({"amount": 1000.0, "country": ""})["amount"] == 1000.0


def test_unknown_field_policies():
    fields = (FieldSpec(name="a", type="int"),)
    assert compile_validator(_schema(*fields, unknown="ignore"))({"a": 1, "b": 2}) == {"a": 1}
    assert compile_validator(_schema(*fields, unknown="allow"))({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(SchemaViolation, match=r"inputs.b: unknown field"):
        compile_validator(_schema(*fields, unknown="reject"))({"a": 1, "b": 2})


def test_empty_allow_schema_passes_everything_through():
    assert compile_validator(_schema(unknown="allow"))({"text": "hi", "n": 1}) == {"text": "hi", "n": 1}


def test_output_prefix():
    validate = compile_validator(_schema(FieldSpec(name="score", type="float", range=(0, 1))), prefix="outputs")
    with pytest.raises(SchemaViolation, match=r"^outputs.score: out of range \[0, 1\] \(got 1.5\)$"):
        validate({"score": 1.5})


def test_json_decoded_input():
    payload = json.loads('{"amount": 5, "country": "DE", "note": null}')
    assert compile_validator(FRAUD)(payload) == {"amount": 5.0, "country": "DE", "note": None}


def test_field_order_preserved_in_clean_output():
    validate = compile_validator(FRAUD)
    clean = validate({"country": "DE", "note": "n", "amount": 3})
    assert list(clean) == ["amount", "country", "note"]
