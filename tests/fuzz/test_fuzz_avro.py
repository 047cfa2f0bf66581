"""Fuzz Avro decoding of every system record (``sie.schemas.avro_codec``).

Property: ``decode`` of any bytes returns a record or raises ``AvroCodecError`` (a ``SieError``) - arbitrary
bytes, bytes behind a valid header (every known writer fingerprint), and valid encodings of generated
records with bytes flipped, inserted, deleted or cut.  Valid records (generated from each schema) round-trip
exactly, and ``encode`` of a wrong record raises ``AvroCodecError`` too.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sie.kernel.errors import SieError
from sie.schemas.avro_codec import HEADER_LEN, MAGIC, RECORDS, AvroCodecError, decode, default_codec, encode
from tests.fuzz.strategies import JSON_VALUES

CODEC = default_codec()
FINGERPRINTS = sorted(CODEC._writers)  # every writer schema the codec reads: current and history


def from_avro(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Valid values of an (expanded) Avro schema."""
    if isinstance(schema, list):
        return st.one_of([from_avro(s, named) for s in schema])
    if isinstance(schema, str):
        primitive = {
            "null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1), "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False), "bytes": st.binary(max_size=8), "string": st.text(max_size=8),
        }
        if schema in primitive:
            return primitive[schema]
        full = schema if "." in schema else f"sie.v1.{schema}"
        return st.deferred(lambda: named[full])
    kind = schema["type"]
    if kind == "record":
        full = f"{schema.get('namespace', 'sie.v1')}.{schema['name']}"
        strategy = st.fixed_dictionaries({f["name"]: from_avro(f["type"], named) for f in schema["fields"]})
        named.setdefault(full, strategy)
        return strategy
    if kind == "enum":
        full = f"{schema.get('namespace', 'sie.v1')}.{schema['name']}"
        strategy = st.sampled_from(schema["symbols"])
        named.setdefault(full, strategy)
        return strategy
    if kind == "array":
        return st.lists(from_avro(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), from_avro(schema["values"], named), max_size=3)
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    return from_avro(kind, named)


VALID = {name: from_avro(CODEC.schema(name), {}) for name in RECORDS}


def check_decode(data: bytes, expected: str | None = None) -> None:
    try:
        record = decode(data, expected)
    except AvroCodecError as exc:
        assert isinstance(exc, SieError) and str(exc)
    else:
        assert isinstance(record, dict)


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut", "varint"]))
        i = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and buf:
            del buf[i]
        elif op == "cut":
            del buf[i:]
        elif op == "varint":  # a huge or negative length/count/block size (zig-zag varint) in the body
            buf[i:i] = draw(st.sampled_from([b"\xff\xff\xff\xff\x0f", b"\x01", b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                                             b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"]))
    return bytes(buf)


@given(data=st.binary(max_size=64))
@example(data=b"")
@example(data=MAGIC)
@example(data=MAGIC + b"\x00" * 8)
def test_arbitrary_bytes(data):
    check_decode(data)


@given(fingerprint=st.sampled_from(FINGERPRINTS), body=st.binary(max_size=64))
@example(fingerprint=FINGERPRINTS[0], body=b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")  # length 2**63 - 1
@example(fingerprint=FINGERPRINTS[0], body=b"\x01")  # a negative length
def test_valid_header_arbitrary_body(fingerprint, body):
    check_decode(MAGIC + fingerprint + body)


@pytest.mark.parametrize("name", RECORDS)
@given(data=st.data())
def test_valid_records_round_trip_and_mutations_fail_cleanly(name, data):
    record = data.draw(VALID[name])
    encoded = encode(name, record)
    assert encoded[:2] == MAGIC and len(encoded) >= HEADER_LEN
    decoded = decode(encoded, name)
    assert _same(decoded, record)
    check_decode(data.draw(mutated_bytes(encoded)), data.draw(st.sampled_from([None, name])))


@given(name=st.sampled_from(RECORDS), record=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5) | JSON_VALUES)
def test_encode_of_a_wrong_record_is_an_avro_codec_error(name, record):
    try:
        data = encode(name, record)
    except AvroCodecError as exc:
        assert str(exc)
    else:
        check_decode(data, name)


def _same(a: Any, b: Any) -> bool:
    """Equality where a float32 field reads back rounded."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-6) or (math.isinf(a) and abs(b) > 3e38)
    return bool(a == b)
