"""Schema compatibility matrix: each change, in each direction, compatible or named as a break."""

from __future__ import annotations

import pytest

from sie.schemas.compat import Break, check_compatibility, check_spec_compatibility
from sie.schemas.spec import FieldSpec, IOSchema, load
from tests.schemas.test_spec import ARTICLE


def S(*fields: FieldSpec, unknown: str = "reject") -> IOSchema:
    return IOSchema(fields=fields, unknown_fields=unknown)  # type: ignore[arg-type]


def F(name: str = "x", type: str = "float", **kw) -> FieldSpec:
    return FieldSpec(name=name, type=type, **kw)  # type: ignore[arg-type]


BASE = S(F("text", "string", max_length=100), F("amount", range=(0, 10)), F("note", "string", required=False))

# (description, old, new, expected input break codes, expected output break codes)
MATRIX = [
    ("identical", BASE, BASE, [], []),
    ("new optional field", BASE, S(*BASE.fields, F("extra", required=False)), [], []),
    ("new required field", BASE, S(*BASE.fields, F("extra")), ["required_added"], []),
    ("required field removed", BASE, S(*BASE.fields[1:]), ["field_removed"], ["field_removed"]),
    ("optional field removed", BASE, S(*BASE.fields[:2]), ["field_removed"], ["field_removed"]),
    ("field removed, unknown ignored", BASE, S(*BASE.fields[1:], unknown="ignore"), [], ["field_removed"]),
    ("type changed string -> int", S(F("t", "string")), S(F("t", "int")), ["type_changed"], ["type_changed"]),
    ("type int -> float", S(F("t", "int")), S(F("t", "float")), [], ["type_changed"]),
    ("type float -> int", S(F("t", "float")), S(F("t", "int")), ["type_changed"], []),
    ("range widened", S(F(range=(0, 1))), S(F(range=(-1, 2))), [], ["range_widened"]),
    ("range removed", S(F(range=(0, 1))), S(F()), [], ["range_widened"]),
    ("range narrowed", S(F(range=(0, 10))), S(F(range=(0, 5))), ["range_narrowed"], []),
    ("range added", S(F()), S(F(range=(0, 5))), ["range_narrowed"], []),
    ("range shifted", S(F(range=(0, 10))), S(F(range=(5, 15))), ["range_narrowed"], ["range_widened"]),
    ("max_length reduced", S(F("s", "string", max_length=10)), S(F("s", "string", max_length=5)), ["max_length_reduced"], []),
    ("max_length increased", S(F("s", "string", max_length=5)), S(F("s", "string", max_length=10)), [], ["max_length_increased"]),
    ("max_length added", S(F("s", "string")), S(F("s", "string", max_length=10)), ["max_length_reduced"], []),
    ("optional -> required", S(F(required=False)), S(F()), ["now_required"], []),
    ("required -> optional", S(F()), S(F(required=False)), [], ["now_optional"]),
    ("nullable removed", S(F(nullable=True)), S(F()), ["nullable_changed"], []),
    ("nullable added", S(F()), S(F(nullable=True)), [], ["nullable_changed"]),
    ("unknown ignore -> reject", S(F(), unknown="ignore"), S(F()), ["unknown_fields_rejected"], []),
    ("unknown reject -> ignore", S(F()), S(F(), unknown="ignore"), [], []),
    ("no schema -> schema with optional field", S(unknown="allow"), S(F(required=False), unknown="allow"), [], []),
]


@pytest.mark.parametrize(("desc", "old", "new", "inp", "out"), MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(desc, old, new, inp, out):
    assert [b.change for b in check_compatibility(old, new, "input")] == inp
    assert [b.change for b in check_compatibility(old, new, "output")] == out


def test_break_text_names_field_and_change():
    (b,) = check_compatibility(S(F("text", "string")), S(F("text", "int")), kind="input")
    assert str(b) == "inputs.text: type changed string -> int"
    assert b == Break("inputs.text", "type_changed", "type changed string -> int")
    (b,) = check_compatibility(S(F("score", range=(0, 1))), S(F("score", range=(0, 2))), kind="output")
    assert str(b) == "outputs.score: range widened [0, 1] -> [0, 2]"
    (b,) = check_compatibility(S(F("a", range=(0, 10))), S(F("a", range=(0, 5))), kind="input")
    assert str(b) == "inputs.a: range narrowed [0, 10] -> [0, 5]"


def test_several_breaks_listed_together():
    old = S(F("a", "string"), F("b", range=(0, 10)))
    new = S(F("a", "int"), F("b", range=(0, 5)), F("c"))
    assert [str(b) for b in check_compatibility(old, new)] == [
        "inputs.a: type changed string -> int",
        "inputs.b: range narrowed [0, 10] -> [0, 5]",
        "inputs.c: new required field",
    ]


def test_bad_kind():
    with pytest.raises(ValueError, match="kind must be"):
        check_compatibility(BASE, BASE, kind="both")  # type: ignore[arg-type]


def test_spec_level_check_on_article_spec():
    old = load(ARTICLE / "model-spec.yaml")
    assert check_spec_compatibility(old, old) == []
    doc = old.to_document()
    doc["output_schema"]["fields"][0]["range"] = [0.0, 100.0]
    doc["input_schema"]["fields"][0]["max_length"] = 1024
    new = type(old).from_document(doc)
    assert [str(b) for b in check_spec_compatibility(old, new)] == [
        "inputs.text: max_length reduced 4096 -> 1024",
        "outputs.score: range widened [0, 1] -> [0, 100]",
    ]
