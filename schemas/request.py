"""The data-path contract as data: JSON Schema documents of requests, results and dead letters.

The scorer (``streams/scorer/codec.py``) implements this contract on the hot
path; these documents describe it for producers and consumers in other
languages and let tests check the scorer against it.  ``request_schema_for``
narrows the generic request schema to one model's ``inputs`` (what a
producer should send to that model).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from sie.schemas.spec_models import FieldSpec, IOSchema

JSON_DIR = Path(__file__).resolve().parent / "json"
DOCUMENTS = ("request", "result", "dead-letter")

DLQ_REASONS = ("invalid_json", "schema_violation", "too_large", "expired", "inference_error", "result_too_large",
               "output_violation")
RESULT_STATUSES = ("ok", "expired")
RESULT_KEYS = ("id", "model", "version", "status", "outputs", "source", "timings")
RESERVED_REQUEST_KEYS = frozenset({"model", "version", "status", "outputs", "source", "timings", "error"})
H_REASON = "sie.reason"
H_DETAIL = "sie.detail"
H_SOURCE_TOPIC = "sie.source.topic"
H_SOURCE_PARTITION = "sie.source.partition"
H_SOURCE_OFFSET = "sie.source.offset"
H_MODEL = "sie.model"
H_VERSION = "sie.version"
DLQ_HEADERS = (H_REASON, H_DETAIL, H_SOURCE_TOPIC, H_SOURCE_PARTITION, H_SOURCE_OFFSET, H_MODEL, H_VERSION)

_JSON_TYPES = {"string": "string", "int": "integer", "float": "number", "bool": "boolean"}


@cache
def json_schema(name: str) -> dict[str, Any]:
    """``request``, ``result`` or ``dead-letter`` JSON Schema (draft 2020-12) as a dict (do not mutate)."""
    if name not in DOCUMENTS:
        raise KeyError(f"unknown contract document {name!r}; known: {', '.join(DOCUMENTS)}")
    return json.loads((JSON_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


def field_json_schema(field: FieldSpec) -> dict[str, Any]:
    """One IOSchema field as JSON Schema (the same rules ``sie.schemas.validation`` enforces)."""
    out: dict[str, Any] = {"type": [_JSON_TYPES[field.type], "null"] if field.nullable else _JSON_TYPES[field.type]}
    if field.max_length is not None:
        out["maxLength"] = field.max_length
    if field.range is not None:
        out["minimum"], out["maximum"] = field.range
    if field.description:
        out["description"] = field.description
    return out


def io_json_schema(io: IOSchema) -> dict[str, Any]:
    """An IOSchema as a JSON Schema object (``unknown_fields: reject`` -> ``additionalProperties: false``)."""
    return {
        "type": "object",
        "properties": {f.name: field_json_schema(f) for f in io.fields},
        "required": [f.name for f in io.fields if f.required],
        "additionalProperties": io.unknown_fields != "reject",
    }


def request_schema_for(input_schema: IOSchema) -> dict[str, Any]:
    """The request JSON Schema with ``inputs`` narrowed to one model's input schema."""
    doc = json.loads(json.dumps(json_schema("request")))
    doc["properties"]["inputs"] = {**doc["properties"]["inputs"], **io_json_schema(input_schema)}
    return doc
