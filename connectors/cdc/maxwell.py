"""Maxwell JSON -> RowChange.

* One row per message: ``data`` is an object; ``type`` is lowercase
  (insert, update, delete, bootstrap-insert; bootstrap-start/-complete are
  markers; database-*/table-* are DDL when ``output_ddl`` is on).
* ``old`` (update only) holds the changed columns' previous values.
* Values are already JSON-typed (numbers, strings); DATETIME arrives as
  ``"YYYY-MM-DD HH:MM:SS"`` text and stays text (no column types are sent);
  numeric model fields turn it into epoch ms during coercion.
* ``ts`` is in SECONDS (``ts_ms`` is used when present).
* Primary key columns: ``primary_key_columns`` (``output_primary_key_columns``),
  else the Kafka key (``{"database","table","pk.<col>":...}`` hash format or
  ``[db, table, [{"col": v}]]`` array format), else the connector spec.
* ``ref``: ``xid.xoffset`` (``xid.commit`` for a transaction's last row), else
  ``position`` (``output_binlog_position``), else ``ts`` plus a row digest.
"""

from __future__ import annotations

import hashlib

import orjson

from sie.connectors.cdc.model import (
    DEFAULT_OPTIONS,
    CdcDecodeError,
    CdcErrorReason,
    DecodeOptions,
    DecodeResult,
    Op,
    RowChange,
    SkipReason,
    check_names,
    load_json,
    load_json_object,
    position_part,
    require,
)
from sie.kernel.untrusted import preview

FORMAT = "maxwell-json"

_ROW_OPS = {"insert": Op.INSERT, "update": Op.UPDATE, "delete": Op.DELETE, "bootstrap-insert": Op.READ}
_CONTROL = {"bootstrap-start", "bootstrap-complete", "heartbeat"}


def _key_pk_columns(key: bytes | None) -> list[str] | None:
    if not key:
        return None
    try:
        doc = load_json(key, "key")
    except CdcDecodeError as exc:
        if exc.reason is CdcErrorReason.INVALID_JSON:
            return None
        raise  # nested too deep: a key Maxwell never writes
    if isinstance(doc, dict):
        cols = [k[3:] for k in doc if k.startswith("pk.")]
        return cols or None
    if isinstance(doc, list) and len(doc) == 3 and isinstance(doc[2], list):
        cols = [c for part in doc[2] if isinstance(part, dict) for c in part]
        return cols or None
    return None


def decode_maxwell(key: bytes | None, value: bytes | None, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Decode one Maxwell message."""
    doc = load_json_object(value)
    kind = require(doc, "type", str, FORMAT)
    op = _ROW_OPS.get(kind)
    if op is None:
        if kind in _CONTROL:
            return DecodeResult(skipped=SkipReason.CONTROL_EVENT)
        if kind.startswith(("table-", "database-")) or "sql" in doc:
            return DecodeResult(skipped=SkipReason.DDL)
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} event has unknown type {preview(kind)}")
    database = require(doc, "database", str, FORMAT)
    table = require(doc, "table", str, FORMAT)
    qualified = f"{database}.{table}"
    data = require(doc, "data", dict, FORMAT)
    old = doc.get("old")
    if op is Op.UPDATE:
        if not isinstance(old, dict):
            raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: update event without an 'old' object")
        before = {**data, **old}
        after, changed = data, frozenset(old)
    elif op is Op.DELETE:
        before, after, changed = data, None, None
    else:
        before, after, changed = None, data, None

    pk_cols = doc.get("primary_key_columns")
    if isinstance(pk_cols, list):
        check_names(pk_cols, "primary_key_columns", qualified)
    else:
        pk_cols = _key_pk_columns(key) or ()
    pk = {c: data.get(c) for c in pk_cols}

    ts_ms = doc.get("ts_ms")
    if not isinstance(ts_ms, int):
        ts = doc.get("ts")
        ts_ms = ts * 1000 if isinstance(ts, int) else None
    # Maxwell writes xoffset on every row of a transaction but the last, which
    # carries "commit": true instead; keep the two distinguishable.
    xid = doc.get("xid")
    offset = position_part(doc["xoffset"], "xoffset", FORMAT) if doc.get("xoffset") is not None else "commit"
    binlog = doc.get("position") if isinstance(doc.get("position"), str) else None
    if xid is not None:
        xid = position_part(xid, "xid", FORMAT)
        ref = f"{xid}.{offset}"
        position = f"{binlog + ',' if binlog else ''}xid={xid}:{offset}"
    elif binlog:
        ref = position = binlog
    else:
        ts = position_part(doc.get("ts"), "ts", FORMAT)
        position = f"ts={ts}"
        ref = f"{ts}.{hashlib.blake2b(orjson.dumps((kind, data, old)), digest_size=6).hexdigest()}"
    return DecodeResult(
        rows=(RowChange(FORMAT, database, table, op, pk, before, after, changed, ts_ms, position, ref),)
    )
