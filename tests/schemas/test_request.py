"""The request/result/dead-letter contract documents agree with the scorer that implements them."""

from __future__ import annotations

import orjson
import pytest

from sie.schemas.request import (
    DLQ_HEADERS,
    DLQ_REASONS,
    RESERVED_REQUEST_KEYS,
    RESULT_KEYS,
    json_schema,
    request_schema_for,
)
from sie.schemas.spec import FieldSpec, IOSchema


def test_documents_load():
    for name in ("request", "result", "dead-letter"):
        assert json_schema(name)["$schema"].startswith("https://json-schema.org/")
    with pytest.raises(KeyError, match="unknown contract document"):
        json_schema("nope")


def test_result_document_lists_the_result_keys():
    doc = json_schema("result")
    assert tuple(doc["required"]) == RESULT_KEYS
    assert doc["properties"]["status"]["enum"] == ["ok", "expired"]


def test_dead_letter_document_matches_constants():
    doc = json_schema("dead-letter")
    assert tuple(doc["required"]) == DLQ_HEADERS
    assert tuple(doc["properties"]["sie.reason"]["enum"]) == DLQ_REASONS


def test_request_document_reserves_result_keys():
    reserved = {next(iter(a["required"])) for a in json_schema("request")["not"]["anyOf"]}
    assert reserved == RESERVED_REQUEST_KEYS


def test_request_schema_for_a_model():
    io = IOSchema(fields=(FieldSpec(name="amount", type="float", range=(0, 10)),
                          FieldSpec(name="note", type="string", max_length=5, required=False, nullable=True)))
    inputs = request_schema_for(io)["properties"]["inputs"]
    assert inputs["required"] == ["amount"] and inputs["additionalProperties"] is False
    assert inputs["properties"]["amount"] == {"type": "number", "minimum": 0, "maximum": 10}
    assert inputs["properties"]["note"] == {"type": ["string", "null"], "maxLength": 5}
    assert json_schema("request")["properties"]["inputs"] == {"type": "object", "description": inputs["description"]}


def test_scorer_codec_follows_the_contract():
    from sie.schemas.validation import compile_validator
    from sie.streams.scorer import codec as codec_mod
    from sie.streams.scorer.errors import DeadLetterReason

    assert set(codec_mod.RESERVED) == RESERVED_REQUEST_KEYS
    assert {r.value for r in DeadLetterReason} == set(DLQ_REASONS)
    io = IOSchema(fields=(FieldSpec(name="x", type="float"),))
    codec = codec_mod.Codec("m", compile_validator(io), max_request_bytes=1 << 20, max_json_depth=32)
    req = codec.parse("t", 0, 5, None, b'{"id": "r1", "inputs": {"x": 1}, "metadata": {"k": 1}}', None)
    result = orjson.loads(codec.result(req, "1.0", {"y": 0.5}, 1.0, 2.0, 1))
    doc = json_schema("result")
    assert set(doc["required"]) <= set(result)
    assert set(result["source"]) == set(doc["properties"]["source"]["required"])
    assert set(doc["properties"]["timings"]["required"]) <= set(result["timings"])
    from sie.streams.eos.deadletter import dead_letter_headers

    headers = dict(dead_letter_headers(DeadLetterReason.TOO_LARGE.value, "big", "t", 0, 5, [],
                                       codec.dead_letter_tags("1.0")))
    assert tuple(headers) == DLQ_HEADERS
