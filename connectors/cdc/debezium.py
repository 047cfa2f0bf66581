"""Debezium JSON (JsonConverter, with or without ``schemas.enable``) -> RowChange.

* The value is ``{"schema", "payload"}`` when schemas are enabled, else the
  envelope itself: ``{"before", "after", "source", "op", "ts_ms", "transaction"}``.
* The key (primary key struct, also possibly schema-wrapped) gives the pk
  columns and their order.  A null key = table without a primary key.
* A null value is a tombstone (after a delete, or the middle of a primary-key
  change: delete + tombstone + create); skipped.
* Records that are not row changes on the same or neighbouring topics:
  transaction metadata (``status`` BEGIN/END), heartbeats (only ``ts_ms``),
  schema-change events (``ddl``/``tableChanges``); ``op`` t (truncate) and m
  (logical message).  Each is skipped with its own reason.
* Casting needs the schema: ``precise`` decimals are base64 strings whose
  scale is in the schema; temporal columns are epoch numbers whose unit is
  only in the schema name.  Without a schema, ``decimal_scales`` from the
  connector spec decodes the listed decimal columns, and temporals stay numbers.
* ``ref``/``position``: ``file:pos:row`` (MySQL binlog; ``row`` separates the
  rows of one multi-row event), ``lsn:<n>`` (Postgres), else ``ts:<source.ts_ms>``.
  ``database`` is ``source.schema`` when present (Postgres/SQL Server), else ``source.db``.
"""

from __future__ import annotations

from typing import Any

import orjson

from sie.connectors.cdc.casting import cast_row, cast_row_reusing, debezium_casters, scale_casters
from sie.connectors.cdc.model import (
    DEFAULT_OPTIONS,
    MAX_JSON_DEPTH,
    CdcDecodeError,
    CdcErrorReason,
    DecodeOptions,
    DecodeResult,
    Op,
    RowChange,
    SkipReason,
    check_depth,
    load_json,
    load_json_object,
    position_part,
    require,
)
from sie.kernel.untrusted import preview

FORMAT = "debezium-json"

_OPS = {"c": Op.INSERT, "u": Op.UPDATE, "d": Op.DELETE, "r": Op.READ}
_SKIP_OPS = {"t": SkipReason.TRUNCATE, "m": SkipReason.CONTROL_EVENT}


def _unwrap(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(payload, schema) for a schema-wrapped document, else (doc, None)."""
    if "payload" in doc and "schema" in doc and len(doc) == 2:
        payload = doc["payload"]
        schema = doc["schema"] if isinstance(doc["schema"], dict) else None
        return payload, schema
    return doc, None


def _key_pk(key: bytes | None) -> dict[str, Any] | None:
    """Primary key struct from the record key; None when absent or unreadable
    (e.g. a StringConverter key): the pk then comes from the connector spec."""
    if not key:
        return None
    try:
        doc = load_json(key, "key")
    except CdcDecodeError as exc:
        if exc.reason is CdcErrorReason.INVALID_JSON:
            return None
        raise  # nested too deep: a key no converter writes
    if isinstance(doc, dict):
        payload, _ = _unwrap(doc)
        if isinstance(payload, dict):
            return payload
    return None


def _row_fields(schema: dict[str, Any] | None, which: str) -> list[dict[str, Any]] | None:
    """The value schema's row struct fields (``before``/``after``), checked for the shape casting reads."""
    if schema is None:
        return None
    top = schema.get("fields")
    if top is None:
        return None
    _check_struct_fields(top, "schema.fields")
    for f in top:
        if f.get("field") == which and f.get("fields") is not None:
            fields = f["fields"]
            _check_struct_fields(fields, f"schema.fields[{which}].fields")
            return fields
    return None


def _check_struct_fields(fields: Any, path: str) -> None:
    """Connect struct fields: an array of objects with a string ``field``, an optional string ``name``
    and optional object ``parameters`` (``malformed_event`` otherwise)."""
    if type(fields) is not list:
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} {path} must be an array, got {preview(fields)}")
    for i, f in enumerate(fields):
        if type(f) is not dict:
            problem = f"must be an object, got {preview(f)}"
        elif type(f.get("field")) is not str:
            problem = f"'field' must be a string, got {preview(f.get('field'))}"
        elif f.get("name") is not None and type(f["name"]) is not str:
            problem = f"'name' must be a string, got {preview(f['name'])}"
        elif f.get("parameters") is not None and type(f["parameters"]) is not dict:
            problem = f"'parameters' must be an object, got {preview(f['parameters'])}"
        else:
            continue
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} {path}[{i}]: {problem}")


def _classify_non_row(payload: dict[str, Any]) -> SkipReason | None:
    if "status" in payload and "event_count" in payload or payload.get("status") in ("BEGIN", "END"):
        return SkipReason.TRANSACTION_MARKER
    if "ddl" in payload or "tableChanges" in payload or "databaseName" in payload:
        return SkipReason.DDL
    if set(payload) <= {"ts_ms", "serverName"}:
        return SkipReason.HEARTBEAT
    return None


def decode_debezium(key: bytes | None, value: bytes | None, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Decode one Debezium record (key and value as produced by JsonConverter)."""
    if value is None or value == b"":
        return DecodeResult(skipped=SkipReason.TOMBSTONE)
    cached = _split_cached(value)
    if cached is not None:
        entry, payload = cached
        schema: dict[str, Any] | None = entry.schema
    else:
        entry = None
        doc = load_json_object(value)
        payload, schema = _unwrap(doc)
        if schema is not None and type(value) is bytes:
            _remember_schema(value, doc)
    if payload is None:
        return DecodeResult(skipped=SkipReason.TOMBSTONE)
    if not isinstance(payload, dict):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} payload must be an object")
    code = payload.get("op")
    if code is None:
        skip = _classify_non_row(payload)
        if skip is not None:
            return DecodeResult(skipped=skip)
        hint = (
            " (looks like a flattened row: the ExtractNewRecordState SMT is on; format debezium-json needs the envelope)"
            if "before" not in payload and "after" not in payload
            else ""
        )
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} event has no 'op'{hint}")
    if not isinstance(code, str):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} event 'op' must be a string, got {preview(code)}")
    op = _OPS.get(code)
    if op is None:
        skip = _SKIP_OPS.get(code)
        if skip is not None:
            return DecodeResult(skipped=skip)
        raise CdcDecodeError(
            CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} event has unknown op {preview(code)} (expected c, u, d, r, t or m)"
        )

    source = require(payload, "source", dict, FORMAT)
    database = source.get("schema") or source.get("db")
    table = source.get("table")
    if not isinstance(database, str) or not isinstance(table, str):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} source must name 'db' (or 'schema') and 'table'")
    qualified = f"{database}.{table}"
    before_raw = payload.get("before")
    after_raw = payload.get("after")
    if op is Op.DELETE:
        if not isinstance(before_raw, dict):
            raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: delete event without a 'before' image")
    elif not isinstance(after_raw, dict):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: {op.value} event without an 'after' image")
    if before_raw is not None and not isinstance(before_raw, dict):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: 'before' must be an object or null")
    if after_raw is not None and not isinstance(after_raw, dict):  # a delete's 'after' (others checked above)
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: 'after' must be an object or null")

    which = "after" if after_raw is not None else "before"
    casters = entry.casters.get((qualified, which)) if entry is not None else None
    if casters is None:
        fields = _row_fields(schema, which)
        if fields is not None:
            casters = debezium_casters(qualified, fields)
            if entry is not None:
                entry.casters[(qualified, which)] = casters
        else:
            casters = _configured_scales(qualified, options.decimal_scales)
    columns = options.columns
    key_pk = _key_pk(key)
    if columns is not None and key_pk:
        columns = columns.union(key_pk)
    after = cast_row(after_raw, casters, qualified, columns) if after_raw is not None else None
    if before_raw is None:
        before = None
    elif after is not None:
        before = cast_row_reusing(before_raw, casters, qualified, columns, after_raw, after)  # type: ignore[arg-type]
    else:
        before = cast_row(before_raw, casters, qualified, columns)

    changed = None
    if op is Op.UPDATE and before_raw is not None and after_raw is not None:
        changed = frozenset(
            [c for c, v in after_raw.items() if before_raw.get(c, _MISSING) != v]
            + [c for c in before_raw if c not in after_raw]
        )

    image = before if op is Op.DELETE else after
    if key_pk is not None:
        pk = {c: image.get(c, v) for c, v in key_pk.items()}  # type: ignore[union-attr]
    else:
        pk = {}

    ts = source.get("ts_ms")
    if type(ts) is not int:
        ts = payload.get("ts_ms")
    ts_ms = ts if type(ts) is int else None
    file, pos = source.get("file"), source.get("pos")
    if file is not None and pos is not None:
        row_no = source.get("row", 0)
        if type(file) is str and type(pos) is int and type(row_no) is int:  # what Debezium writes
            position = f"{file}:{pos}:{row_no}"
        else:
            position = (f"{position_part(file, 'source.file', FORMAT)}:{position_part(pos, 'source.pos', FORMAT)}:"
                        f"{position_part(row_no, 'source.row', FORMAT)}")
    elif source.get("lsn") is not None:
        position = f"lsn:{position_part(source['lsn'], 'source.lsn', FORMAT)}"
    else:
        position = f"ts:{ts_ms}"
    return DecodeResult(
        rows=(RowChange(FORMAT, database, table, op, pk, before, after, changed, ts_ms, position, position),)
    )


_MISSING = object()
_scale_cache: dict[tuple, dict] = {}


def _configured_scales(qualified: str, decimal_scales: dict[str, int]) -> dict:
    if not decimal_scales:
        return {}
    cache_key = (qualified, tuple(decimal_scales.items()))
    casters = _scale_cache.get(cache_key)
    if casters is None:
        prefix = qualified + "."
        cols = {k[len(prefix):]: s for k, s in decimal_scales.items() if k.startswith(prefix)}
        casters = scale_casters(qualified, cols)
        if len(_scale_cache) >= 4096:
            _scale_cache.clear()
        _scale_cache[cache_key] = casters
    return casters


# --------------------------------------------------------------------------- schema cache
#
# With ``schemas.enable`` every value repeats its table's schema (~4 KB), byte for
# byte, before the payload: ``{"schema":<S>,"payload":<P>}``.  Parsing S again for
# every record and walking it for casters is most of the per-record cost, so the
# bytes up to and including ``"payload":`` are remembered once verified, and a
# record starting with them has only its payload parsed.  Equivalence: when
# ``prefix + b"null}"`` parses to ``{"schema": S, "payload": None}``, then
# ``prefix + P + b"}"`` parses to ``{"schema": S, "payload": P}`` for any JSON
# text P, which is exactly what the full parse would give.


class _SchemaEntry:
    """A verified schema prefix, its parsed schema and the casters derived from it."""

    __slots__ = ("prefix", "schema", "casters")

    def __init__(self, prefix: bytes, schema: dict[str, Any]) -> None:
        self.prefix = prefix
        self.schema = schema
        self.casters: dict[tuple[str, str], dict] = {}


_PAYLOAD_KEY = b'"payload"'
_MAX_SCHEMAS = 256
# bytes before the first b'"payload"' -> entry (None: seen, not cacheable)
_schemas: dict[bytes, _SchemaEntry | None] = {}
_last_schema: list[_SchemaEntry | None] = [None]


def _split_cached(value: bytes | None) -> tuple[_SchemaEntry, Any] | None:
    """(entry, parsed payload) when ``value`` starts with a known schema prefix, else None
    (the caller then parses the whole value)."""
    if type(value) is not bytes or value[-1:] != b"}":
        return None
    entry = _last_schema[0]
    if entry is None or not value.startswith(entry.prefix):
        i = value.find(_PAYLOAD_KEY)
        if i < 0:
            return None
        entry = _schemas.get(value[:i])
        if entry is None or not value.startswith(entry.prefix):
            return None
        _last_schema[0] = entry
    body = memoryview(value)[len(entry.prefix):-1]
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(payload) is dict:
        # the wrapper adds one level; the payload's opening brackets bound its depth (check_depth's pre-check)
        opening = value.count(b"{", len(entry.prefix)) + value.count(b"[", len(entry.prefix))
        if opening > MAX_JSON_DEPTH - 1:
            check_depth(value, {"payload": payload})
    return entry, payload


def _remember_schema(value: bytes, doc: dict[str, Any]) -> None:
    """After a full parse of a schema-wrapped value, remember its verified schema prefix."""
    i = value.find(_PAYLOAD_KEY)
    if i < 0:
        return
    head = value[:i]
    if head in _schemas:
        return
    entry = None
    expected = {"schema": doc["schema"], "payload": None}
    start = i
    for _ in range(4):  # the schema itself may contain '"payload"'; try a few occurrences
        colon = value.find(b":", start + len(_PAYLOAD_KEY))
        if colon >= 0 and not value[start + len(_PAYLOAD_KEY):colon].strip():
            prefix = value[: colon + 1]
            try:
                ok = orjson.loads(prefix + b"null}") == expected
            except orjson.JSONDecodeError:
                ok = False
            if ok:
                entry = _SchemaEntry(prefix, doc["schema"])
                break
        start = value.find(_PAYLOAD_KEY, start + 1)
        if start < 0:
            break
    if len(_schemas) >= _MAX_SCHEMAS:
        _schemas.clear()
        _last_schema[0] = None
    _schemas[head] = entry
