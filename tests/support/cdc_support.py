"""Shared helpers for the CDC tests: load fixture records as the bytes Kafka would carry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sie.connectors.cdc.config import CdcConnectorSpec, parse_connector_spec
from sie.schemas.spec_models import FieldSpec, IOSchema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cdc"

# model input field -> "string" | "int" | "float" | "bool" (as sie.schemas.spec FieldSpec.type)
ORDER_FIELD_TYPES = {
    "amount": "float",
    "customer_id": "int",
    "currency": "string",
    "is_first_order": "bool",
    "created_at_ms": "int",
}
# the same fields as a model's input schema, with each NULL rule once: amount may be null, is_first_order is
# optional (left out when NULL), the others are required and not nullable (NULL -> null_in_required_field)
ORDER_INPUT_SCHEMA = IOSchema(fields=(
    FieldSpec(name="amount", type="float", nullable=True),
    FieldSpec(name="customer_id", type="int"),
    FieldSpec(name="currency", type="string"),
    FieldSpec(name="is_first_order", type="bool", required=False),
    FieldSpec(name="created_at_ms", type="int"),
))
ORDER_MAPPING = {
    "amount": "amount",
    "customer_id": "customer_id",
    "currency": "currency",
    "is_first_order": "is_first_order",
    "created_at_ms": "created_at",
}


def encode(doc: Any) -> bytes | None:
    return None if doc is None else json.dumps(doc).encode()


def records(name: str) -> list[tuple[bytes | None, bytes | None]]:
    """``[(key, value), ...]`` of a fixture file, encoded like JsonConverter would."""
    out = []
    for rec in json.loads((FIXTURES / name).read_text()):
        value = rec["value_raw"].encode() if "value_raw" in rec else encode(rec["value"])
        out.append((encode(rec["key"]), value))
    return out


def record(name: str) -> tuple[bytes | None, bytes | None]:
    (only,) = records(name)
    return only


def malformed_cases() -> list[dict[str, Any]]:
    cases = json.loads((FIXTURES / "malformed.json").read_text())
    for case in cases:
        case["value_bytes"] = case["value_raw"].encode() if "value_raw" in case else encode(case["value"])
        case["key_bytes"] = encode(case["key"])
    return cases


def make_spec(fmt: str, **overrides: Any) -> CdcConnectorSpec:
    doc = {
        "name": "orders-to-fraud",
        "format": fmt,
        "source_topic": "cdc.shop.orders",
        "model": "fraud-scorer",
        "tables": ["shop.orders"],
        "mapping": dict(ORDER_MAPPING),
        **overrides,
    }
    return parse_connector_spec(doc)
