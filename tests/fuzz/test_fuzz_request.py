"""Fuzz the scorer's request decoding and validation (``Codec.parse`` with a compiled input validator).

Property: every record value yields a ``Request`` whose inputs the schema accepts, or a ``Poison`` with a
dead-letter reason and a detail; ``compile_validator(schema)(payload)`` returns a clean dict or raises
``SchemaViolation`` naming the field - never another exception, whatever the schema and the payload.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from sie.schemas.spec_models import FieldSpec, IOSchema
from sie.schemas.validation import SchemaViolation, compile_validator
from sie.streams.scorer.codec import Codec, Poison, Request
from sie.streams.scorer.errors import DeadLetterReason
from tests.fuzz.strategies import JSON_VALUES, SCALARS, deep, to_json

NAMES = st.sampled_from(["amount", "hour", "text", "flag", "id", "inputs", "a'b", 'q"', "\\", ""]) | st.text(max_size=6)
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def ranges(draw: st.DrawFn) -> tuple[float, float] | None:
    if draw(st.booleans()):
        return None
    lo, hi = sorted([draw(FINITE | st.sampled_from([-math.inf, math.inf])), draw(FINITE)])
    return (lo, hi)


FIELDS = st.builds(
    FieldSpec,
    name=NAMES,
    type=st.sampled_from(["string", "int", "float", "bool"]),
    required=st.booleans(),
    nullable=st.booleans(),
    max_length=st.none() | st.integers(1, 50),  # the spec reader: max_length >= 1 (and the model: ge=1)
    range=ranges(),
)
SCHEMAS = st.builds(
    IOSchema,
    fields=st.lists(FIELDS, max_size=5, unique_by=lambda f: f.name).map(tuple),
    unknown_fields=st.sampled_from(["reject", "ignore", "allow"]),
)
ORDER = IOSchema(fields=(
    FieldSpec(name="amount", type="float", range=(0, 1_000_000)),
    FieldSpec(name="hour", type="int", range=(0, 23)),
    FieldSpec(name="text", type="string", max_length=16, required=False, nullable=True),
    FieldSpec(name="flag", type="bool"),
))


def codec(schema: IOSchema) -> Codec:
    return Codec("m", compile_validator(schema), max_request_bytes=64 * 1024, max_json_depth=64)


ORDER_CODEC = codec(ORDER)


def check(c: Codec, value: bytes | None, schema: IOSchema) -> None:
    verdict = c.parse("sie.model.m.requests", 3, 17, b"k", value, 1)
    if isinstance(verdict, Poison):
        assert isinstance(verdict.reason, DeadLetterReason)
        # bounded (the dead-letter header cuts it to 500 characters; the message itself must not grow with the input)
        assert isinstance(verdict.detail, str) and verdict.detail and len(verdict.detail) < 1000
        return
    assert isinstance(verdict, Request)
    assert isinstance(verdict.id, str) and verdict.id
    assert isinstance(verdict.inputs, dict)
    declared = {f.name: f for f in schema.fields}
    for f in schema.fields:
        if f.required:
            assert f.name in verdict.inputs
    for name, v in verdict.inputs.items():
        f = declared.get(name)
        if f is None:
            assert schema.unknown_fields == "allow"
        elif v is None:
            assert f.nullable
        elif f.type == "float":
            assert type(v) is float and math.isfinite(v)


@st.composite
def request_docs(draw: st.DrawFn, schema: IOSchema) -> Any:
    """Mostly request-shaped documents: the schema's fields (and others) with any values."""
    names = [f.name for f in schema.fields] + ["extra"]
    inputs = draw(st.dictionaries(st.sampled_from(names) | st.text(max_size=4), JSON_VALUES, max_size=6))
    doc: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        doc["id"] = draw(SCALARS | JSON_VALUES)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["metadata", "model", "status", "x"]))] = draw(JSON_VALUES)
    if draw(st.integers(0, 9)) == 0:
        doc["inputs"] = draw(st.sampled_from([deep(70), deep(1000), deep(70, True), None, [], "x"]))
    return doc


@given(value=st.none() | st.binary(max_size=300))
@example(value=b"")
@example(value=b"\xff\xfe")
@example(value=b'{"inputs": {"amount": NaN}}')
@example(value=b'{"inputs": {"amount": 1e999}}')
@example(value=b'{"inputs": {"hour": 99999999999999999999999}}')
def test_arbitrary_bytes(value):
    check(ORDER_CODEC, value, ORDER)


@given(doc=JSON_VALUES)
def test_arbitrary_json(doc):
    check(ORDER_CODEC, to_json(doc), ORDER)


@given(doc=request_docs(ORDER))
def test_request_shaped_documents(doc):
    check(ORDER_CODEC, to_json(doc), ORDER)


@given(case=SCHEMAS.flatmap(lambda schema: st.tuples(st.just(schema), request_docs(schema))))
def test_any_schema_any_request(case):
    schema, doc = case
    check(codec(schema), to_json(doc), schema)


@given(schema=SCHEMAS, payload=JSON_VALUES | st.dictionaries(NAMES, JSON_VALUES | SCALARS, max_size=6))
@example(schema=ORDER, payload={"amount": 2**70, "hour": 1, "flag": True})  # int -> float overflow? (no: 1.2e21)
@example(schema=ORDER, payload={"amount": 10**400, "hour": 1, "flag": True})  # OverflowError is a violation
def test_compiled_validator_raises_only_schema_violation(schema, payload):
    validate = compile_validator(schema)
    try:
        out = validate(payload)
    except SchemaViolation as exc:
        assert str(exc) and len(str(exc)) < 1000
    else:
        assert isinstance(out, dict)
