"""Hypothesis strategies shared by the fuzz suite: JSON values, hostile scalars, and mutations of valid
documents (replace, delete, or bury a value under up to ~1,100 levels of nesting).

Nesting deeper than orjson (255) or Python's ``json`` (~1,000) can write is produced as text: a mutation
puts a ``DEEP`` placeholder string in the document and ``to_json`` swaps it for ``[[[...]]]``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
from hypothesis import strategies as st

INT64 = st.integers(-(2**63), 2**64 - 1)  # what a JSON parser (orjson) hands over
# Texts that have broken casters before, or look like something a caster special-cases.
HOSTILE_TEXT = st.builds(lambda sign, n: sign + "9" * n, st.sampled_from(["", "-"]), st.sampled_from([30, 400, 5000])) | st.sampled_from([
    "", " ", "0", "1", "-1", "1.5", "12,50", "nan", "NaN", "inf", "-Infinity", "1e999", "-1e999", "1e308",
    "0x10", "1_000", "true", "null",
    "2021-01-15 02:12:04", "2021-01-15", "2021-02-30 00:00:00", "0000-00-00 00:00:00", "9999-12-31T23:59:59Z",
    "2021-01-15T02:12:04+25:00", "AQID", "AQIDBA==", "////////////", "=", "\x00", "\x01",
    "decimal(10,2)", "tinyint(1)", "bigint(20) unsigned", "datetime", "bit(1)", "varchar(", "decimal(999999999,2)",
])
SCALARS = (
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | HOSTILE_TEXT
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=10,
)

_DEEP_RE = re.compile(rb'"@@deep:(\d+):(\d)@@"')


def deep(depth: int, as_object: bool = False) -> str:
    """A placeholder that ``to_json`` turns into ``depth`` nested arrays (or objects)."""
    return f"@@deep:{depth}:{int(as_object)}@@"


def _expand(m: re.Match[bytes]) -> bytes:
    depth, obj = int(m.group(1)), m.group(2) == b"1"
    if obj:
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth + b"]" * depth


def to_json(doc: Any) -> bytes:
    """JSON bytes of ``doc`` with every ``deep()`` placeholder expanded."""
    return _DEEP_RE.sub(_expand, orjson.dumps(doc))


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _delete(doc: Any, path: tuple) -> Any:
    if not path:
        return doc
    node = doc
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return doc


# mostly ordinary JSON; one replacement in eight buries the value under 1..1,100 levels
REPLACEMENTS = st.integers(0, 7).flatmap(
    lambda n: st.builds(deep, st.integers(1, 1100), st.booleans()) if n == 0 else JSON_VALUES
)


@st.composite
def mutated(draw: st.DrawFn, doc: Any, max_mutations: int = 3) -> Any:
    """``doc`` with 1..max_mutations random edits: replace a value, delete a key/item, or bury it deep."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(_paths(doc)))
        if path and draw(st.integers(0, 4)) == 0:
            doc = _delete(doc, path)
        else:
            doc = _set(doc, path, draw(REPLACEMENTS))
    return doc
