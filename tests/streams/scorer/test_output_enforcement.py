"""spec.outputSchema is enforced at run time: an output that breaks it is a dead letter ``output_violation``
(naming the model and the field), never an ``ok`` result (issue 17: logits returned as probabilities)."""

from __future__ import annotations

import orjson
import pytest

from sie.schemas.spec import load
from sie.schemas.spec_models import IOSchema
from sie.schemas.validation import compile_output_check
from tests.streams.scorer.test_scorer_unit import by_topic, req, run_fake
from tests.support.scorer_fixtures import echo_spec_doc


def ranged_spec(output_fields=None, unknown: str | None = None):
    doc = echo_spec_doc()
    schema = {"type": "json", "fields": output_fields or [{"name": "y", "type": "float", "range": [0, 100]}]}
    if unknown:
        schema["unknownFields"] = unknown
    doc["spec"]["outputSchema"] = schema
    return load(doc)


class Returns:
    """A backend returning fixed outputs per row (whatever the model would have said)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def infer(self, rows):
        return [self.fn(r) for r in rows]


def test_out_of_range_output_is_dead_lettered_output_violation_not_ok():
    spec = ranged_spec()
    values = [req(i, x=x) for i, x in enumerate([10.0, 60.0, 49.0, -0.0825])]  # y = 2x: 20, 120, 98, -0.165
    summary, visible, *_rest = run_fake(values, spec=spec, backend=Returns(lambda r: {"y": r["x"] * 2.0}))
    results = [orjson.loads(v) for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert [(r["id"], r["status"], r["outputs"]) for r in results] == [("r0", "ok", {"y": 20.0}),
                                                                      ("r2", "ok", {"y": 98.0})]
    dlq = by_topic(visible, spec.topics.dead_letters)
    assert [dict(h)["sie.reason"] for *_x, h in dlq] == [b"output_violation", b"output_violation"]
    details = [dict(h)["sie.detail"].decode() for *_x, h in dlq]
    assert details[0] == f"model {spec.name} 1.0.0: outputs.y: out of range [0, 100] (got 120.0)"
    assert "(got -0.165)" in details[1]
    assert [v for _t, v, _k, _h in dlq] == [values[1], values[3]]  # the request, byte for byte: redrivable
    assert summary.results == 2 and summary.dead_letters == 2


@pytest.mark.parametrize("output, detail", [
    ({"y": "high"}, "outputs.y: must be a number (got 'high')"),
    ({}, "outputs.y: required field missing"),
    ({"y": 1.0, "logits": [0.2]}, "outputs.logits: unknown field (declared: y)"),
    ({"y": float("nan")}, "outputs.y: must be a finite number"),
])
def test_wrong_type_missing_or_undeclared_output_fields_are_violations(output, detail):
    spec = ranged_spec()
    _summary, visible, *_rest = run_fake([req(1)], spec=spec, backend=Returns(lambda r: dict(output)))
    assert by_topic(visible, spec.topics.results) == []
    (dead,) = by_topic(visible, spec.topics.dead_letters)
    headers = dict(dead[3])
    assert headers["sie.reason"] == b"output_violation" and detail in headers["sie.detail"].decode()
    assert headers["sie.model"] == spec.name.encode() and headers["sie.version"] == b"1.0.0"


def test_int_output_for_a_float_field_is_accepted_as_float_and_ignored_fields_dropped():
    spec = ranged_spec(unknown="ignore")
    _summary, visible, *_rest = run_fake([req(1)], spec=spec, backend=Returns(lambda r: {"y": 3, "debug": 1}))
    (result,) = [orjson.loads(v) for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert result["outputs"] == {"y": 3.0} and result["status"] == "ok"


def test_a_spec_without_output_schema_costs_nothing_and_passes_outputs_through():
    assert compile_output_check(IOSchema(fields=(), unknown_fields="allow")) is None
    check = compile_output_check(IOSchema(fields=(), unknown_fields="reject"))
    assert check is not None and check({}) == {}
