"""Canal flatMessage (``canal.mq.flatMessage=true``) -> RowChange.

Traps handled here (see docs in connectors/cdc/__init__.py):
* ``data`` is an ARRAY: a multi-row statement gives several rows in one message;
  ``old`` is aligned with it by index and holds only the changed columns.
* every value is a string (or null); ``mysqlType``/``sqlType`` say how to cast.
* ``isDdl`` is not trusted alone: ``type`` decides (only INSERT/UPDATE/DELETE carry rows).
* ``id`` is a batch id shared by several messages, and ``es`` has second
  precision, so neither identifies a change.  The replay-stable ``ref`` is
  ``<es>.<digest>`` where the digest covers the op and the raw row (and its
  ``old``), so a replay or a canal duplicate yields the same request id while
  two different changes of one row in the same second do not collide.
"""

from __future__ import annotations

from hashlib import blake2b

from orjson import dumps

from sie.connectors.cdc.casting import canal_casters, cast_row
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
    load_json_object,
    position_part,
    require,
)
from sie.kernel.untrusted import preview

FORMAT = "canal-json"

_ROW_OPS = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE}
_NON_ROW = {
    **dict.fromkeys(
        ("CREATE", "ALTER", "ERASE", "QUERY", "TRUNCATE", "RENAME", "CINDEX", "DINDEX"), SkipReason.DDL
    ),
    "MHEARTBEAT": SkipReason.HEARTBEAT,
    "GTID": SkipReason.TRANSACTION_MARKER,
    "XACOMMIT": SkipReason.TRANSACTION_MARKER,
    "XAROLLBACK": SkipReason.TRANSACTION_MARKER,
}


def decode_canal(key: bytes | None, value: bytes | None, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Decode one canal flatMessage.  The Kafka key is ignored (canal sends null)."""
    doc = load_json_object(value)
    get = doc.get
    kind = get("type")
    if type(kind) is not str:
        kind = require(doc, "type", str, FORMAT)
    op = _ROW_OPS.get(kind) or _ROW_OPS.get(kind.upper())
    if op is None:
        skip = _NON_ROW.get(kind.upper())
        if skip is None:
            if get("isDdl") is True:
                return DecodeResult(skipped=SkipReason.DDL)
            raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{FORMAT} event has unknown type {preview(kind)}")
        return DecodeResult(skipped=skip)

    database = get("database")
    if type(database) is not str:
        database = require(doc, "database", str, FORMAT)
    table = get("table")
    if type(table) is not str:
        table = require(doc, "table", str, FORMAT)
    qualified = f"{database}.{table}"
    data = get("data")
    if type(data) is not list:
        data = require(doc, "data", list, FORMAT)
    if not data:
        return DecodeResult(skipped=SkipReason.EMPTY)
    old = get("old")
    is_update = op is Op.UPDATE
    if is_update:
        if not isinstance(old, list) or len(old) != len(data):
            got = "missing" if old is None else (f"{len(old)} entries" if isinstance(old, list) else type(old).__name__)
            raise CdcDecodeError(
                CdcErrorReason.MALFORMED_EVENT,
                f"{qualified}: UPDATE 'old' must be an array aligned with 'data' ({len(data)} rows), got {got}",
            )
    pk_names = get("pkNames")
    if pk_names is None:  # MINIMAL row image or no key: the converter asks for `primary_keys` (missing_primary_key)
        pk_names = []
    elif type(pk_names) is not list or (len(pk_names) != 1 or type(pk_names[0]) is not str):
        pk_names = check_names(pk_names, "pkNames", qualified)
    casters = canal_casters(qualified, get("mysqlType"), get("sqlType"), options.tinyint1_as_bool)
    es = get("es")
    ts_ms = es if type(es) is int else None
    gtid = get("gtid")
    batch = get("id")
    # canal writes ints here (and a gtid string): the common case skips position_part's checks
    es_text = str(es) if type(es) is int else position_part(es, "es", FORMAT)
    batch_text = str(batch) if type(batch) is int else position_part(batch, "id", FORMAT)
    position = f"batch={batch_text},es={es_text}"
    if gtid:
        position += f",gtid={gtid if type(gtid) is str else position_part(gtid, 'gtid', FORMAT)}"

    columns = options.columns
    if columns is not None and pk_names:
        columns = _with_pk(columns, pk_names)

    rows = []
    for i, raw in enumerate(data):
        if type(raw) is not dict:
            raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: data[{i}] is not an object")
        image = cast_row(raw, casters, qualified, columns)
        raw_old = None
        if is_update:
            raw_old = old[i]  # type: ignore[index]
            if not isinstance(raw_old, dict):
                raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{qualified}: old[{i}] is not an object")
            changed = frozenset(raw_old)
            # the before image: cast only the changed columns, reuse the rest of the after image
            before = {**image, **cast_row(raw_old, casters, qualified, columns if columns is not None else changed)}
            after = image
        elif op is Op.DELETE:
            before, after, changed = image, None, None
        else:
            before, after, changed = None, image, None
        if len(pk_names) == 1:
            pk_name = pk_names[0]
            pk = {pk_name: image.get(pk_name)}
        else:
            pk = {name: image.get(name) for name in pk_names}
        digest = blake2b(dumps((kind, raw, raw_old)), digest_size=6).hexdigest()
        rows.append(
            RowChange(FORMAT, database, table, op, pk, before, after, changed, ts_ms, position, f"{es_text}.{digest}")
        )
    return DecodeResult(tuple(rows))


_pk_columns: dict[tuple[frozenset[str], tuple[str, ...]], frozenset[str]] = {}


def _with_pk(columns: frozenset[str], pk_names: list[str]) -> frozenset[str]:
    """``columns | pk_names``, cached (a table's pk names repeat in every message)."""
    key = (columns, tuple(pk_names))  # the names are strings (checked by the decoder): hashable
    try:
        return _pk_columns[key]
    except KeyError:
        pass
    merged = columns.union(pk_names)
    if len(_pk_columns) >= 4096:
        _pk_columns.clear()
    _pk_columns[key] = merged
    return merged
