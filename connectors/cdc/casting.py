"""Value casting: source encodings -> Python values -> model input types.

Canonical forms (the same whichever CDC tool produced the row, so one model
works behind canal, Debezium or Maxwell):

* integers -> ``int``; DECIMAL/NUMERIC -> ``float`` (scoring wants floats; a
  DECIMAL(65,30) loses digits beyond double precision, by design);
  FLOAT/DOUBLE -> ``float``; ``tinyint(1)`` and ``bit(1)`` -> ``bool``
  (MySQL's BOOLEAN is tinyint(1); canal ``tinyint1_as_bool=False`` keeps ints;
  Debezium sends tinyint(1) as INT16 unless its own converter is configured,
  and we keep what it sends).
* DATE -> ``"YYYY-MM-DD"``; DATETIME/TIMESTAMP -> zoneless ISO-8601
  ``"YYYY-MM-DDTHH:MM:SS[.ffffff]"`` (canal text and Debezium epoch values are
  both UTC-wall-clock, so they agree); Debezium ``ZonedTimestamp`` keeps its
  ISO string with offset; TIME -> ``"HH:MM:SS[.ffffff]"``.  MySQL zero dates
  (``0000-00-00``) -> None.  Temporal values become epoch milliseconds only
  when a model input field is numeric (see ``coercer``).
* NULL -> None; everything else stays a string.

Two families of casters are compiled once and cached: canal casters from
``mysqlType``/``sqlType`` maps, Debezium casters from the value schema.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, NamedTuple

from sie.connectors.cdc.model import CdcDecodeError, CdcErrorReason
from sie.kernel.untrusted import exception_text, preview

Caster = Callable[[Any], Any]

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1)
_MAX_CACHE = 4096
# What a request can carry: orjson writes integers in [-2**63, 2**64 - 1] (MySQL BIGINT and BIGINT UNSIGNED).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# |scale| of a decimal: PostgreSQL allows -1000..1000 (MySQL 0..30); beyond, 10**scale is a CPU sink.
MAX_DECIMAL_SCALE = 1000
# Everything a caster raises on a value that does not fit its type (casters are pure functions of the value).
CAST_FAILURES = (ValueError, TypeError, ArithmeticError, AttributeError, KeyError, IndexError, binascii.Error)


# --------------------------------------------------------------------------- canal (strings)

def _to_float_text(v: str) -> float:
    f = float(v)
    if f - f == 0.0:  # False for inf and nan ('1e999', 'nan'): orjson would write them as null
        return f
    raise ValueError("not a finite number")


def _to_bool_text(v: str) -> bool:
    if v == "1" or v == "\x01":
        return True
    if v == "0" or v == "\x00" or v == "":
        return False
    return int(v) != 0


# Strict "YYYY-MM-DD[ T]HH:MM:SS" (the form canal and Maxwell send): its ISO text
# and epoch value follow from slicing once the date part is known to be valid,
# so the hot path builds no datetime objects.  Anything else takes the general
# (datetime.fromisoformat) path, which defines the behaviour.
_DATETIME_RE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[ T]([01]\d|2[0-3]):([0-5]\d):([0-5]\d))?", re.ASCII)
_epoch_days: dict[str, int | None] = {}


def _days_since_epoch(day: str) -> int | None:
    """Days since 1970-01-01 of a ``YYYY-MM-DD`` text, None when it is no real date (cached)."""
    try:
        return _epoch_days[day]
    except KeyError:
        pass
    try:
        days: int | None = date.fromisoformat(day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        days = None
    if len(_epoch_days) >= 65536:
        _epoch_days.clear()
    _epoch_days[day] = days
    return days


# the last (text, result) of the strict fast paths: rows written in the same second
# (a busy table's created_at/updated_at) repeat the text, so most rows skip the parse
# (one tuple swapped whole, so a reader never sees a text with another text's result)
# (the initial None matches no text)
_last_datetime_text: list[tuple[str | None, str]] = [(None, "")]
_last_epoch_ms: list[tuple[str | None, int]] = [(None, 0)]


def _to_datetime_text(v: str) -> str | None:
    last = _last_datetime_text[0]
    if v == last[0]:
        return last[1]
    if v.startswith("0000-00-00"):
        return None
    if len(v) == 19:
        m = _DATETIME_RE.fullmatch(v)
        if m is not None and m.group(2) is not None and _days_since_epoch(m.group(1)) is not None:
            text = f"{v[:10]}T{v[11:]}"
            _last_datetime_text[0] = (v, text)
            return text
    return datetime.fromisoformat(v).isoformat()


def _to_date_text(v: str) -> str | None:
    if v.startswith("0000-00-00"):
        return None
    if len(v) == 10 and _DATETIME_RE.fullmatch(v) is not None and _days_since_epoch(v) is not None:
        return v
    return date.fromisoformat(v).isoformat()


_INT_TYPES = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"}
_FLOAT_TYPES = {"decimal", "numeric", "dec", "fixed", "float", "double", "real", "double precision"}
_BASE_RE = re.compile(r"^\s*([a-z ]+?)\s*(?:\((\d+)(?:\s*,\s*\d+)?\))?(?:\s+(?:unsigned|signed|zerofill))*\s*$")

# java.sql.Types -> caster, used when mysqlType is absent for a column.
_SQLTYPE_CASTERS: dict[int, Caster | None] = {
    -7: _to_bool_text, 16: _to_bool_text,           # BIT, BOOLEAN
    -6: int, 5: int, 4: int, -5: int,               # TINYINT SMALLINT INTEGER BIGINT
    6: _to_float_text, 7: _to_float_text, 8: _to_float_text,  # FLOAT REAL DOUBLE
    2: _to_float_text, 3: _to_float_text,           # NUMERIC DECIMAL
    91: _to_date_text, 93: _to_datetime_text,       # DATE TIMESTAMP
}


def canal_caster_for(mysql_type: str | None, sql_type: int | None, tinyint1_as_bool: bool) -> Caster | None:
    """Caster for one canal column (None = keep the string)."""
    if mysql_type:
        m = _BASE_RE.fullmatch(mysql_type.lower())
        if m:
            base, width = m.group(1), m.group(2)
            if base in ("tinyint", "bit") and width == "1":
                if base == "bit" or tinyint1_as_bool:
                    return _to_bool_text
                return int
            if base == "bool" or base == "boolean":
                return _to_bool_text
            if base == "bit":
                return int
            if base in _INT_TYPES:
                return int
            if base in _FLOAT_TYPES:
                return _to_float_text
            if base == "datetime" or base == "timestamp":
                return _to_datetime_text
            if base == "date":
                return _to_date_text
            return None  # char/varchar/text/enum/set/json/binary/time: keep text
    if sql_type is not None:
        return _SQLTYPE_CASTERS.get(sql_type)
    return None


_canal_cache: dict[tuple, dict[str, tuple[str, Caster]]] = {}
# (table, tinyint1_as_bool) -> (mysqlType, sqlType, casters) of the table's last message:
# comparing two small dicts is cheaper than building and hashing the full cache key
_canal_last: dict[tuple[str, bool], tuple[Any, Any, dict[str, tuple[str, Caster]]]] = {}


def canal_casters(
    table: str, mysql_types: dict[str, str] | None, sql_types: dict[str, int] | None, tinyint1_as_bool: bool
) -> dict[str, tuple[str, Caster]]:
    """``{column: (declared type, caster)}`` for the columns that need casting; cached
    by the type maps (canal repeats them in every message)."""
    last = _canal_last.get((table, tinyint1_as_bool))
    if last is not None and last[0] == mysql_types and last[1] == sql_types:
        return last[2]
    _check_type_map(table, "mysqlType", mysql_types, str)
    _check_type_map(table, "sqlType", sql_types, int)
    key = (
        table,
        tuple(mysql_types.items()) if mysql_types else None,
        tuple(sql_types.items()) if sql_types else None,
        tinyint1_as_bool,
    )
    casters = _canal_cache.get(key)
    if casters is None:
        casters = {}
        for col in set(mysql_types or ()) | set(sql_types or ()):
            mt = (mysql_types or {}).get(col)
            st = (sql_types or {}).get(col)
            fn = canal_caster_for(mt, st if isinstance(st, int) else None, tinyint1_as_bool)
            if fn is not None:
                casters[col] = (mt or f"java.sql.Types {st}", fn)
        if len(_canal_cache) >= _MAX_CACHE:
            _canal_cache.clear()
        _canal_cache[key] = casters
    if type(mysql_types) is dict and type(sql_types) in (dict, type(None)):
        if len(_canal_last) >= _MAX_CACHE:
            _canal_last.clear()
        _canal_last[(table, tinyint1_as_bool)] = (mysql_types, sql_types, casters)
    return casters


def _check_type_map(table: str, field: str, types: Any, kind: type) -> None:
    """``mysqlType``/``sqlType``: null or an object of column -> type name (int code); else malformed."""
    if types is None:
        return
    if type(types) is not dict:
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{table}: {field!r} must be an object or null, "
                                                             f"got {preview(types)}")
    for col, declared in types.items():
        if declared is not None and type(declared) is not kind:
            raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{table}.{col}: {field} must be "
                                                                 f"{'a type name' if kind is str else 'an integer'}, "
                                                                 f"got {preview(declared)}")


class _RowPlan(NamedTuple):
    """What ``cast_row`` does for one (casters, projection): the columns to copy
    and the ``(column, declared, caster)`` steps, in the order the generic loop
    would take them (so the first failing column is the same)."""

    casters: dict[str, tuple[str, Caster]]
    columns: tuple[str, ...] | None
    todo: tuple[tuple[str, str, Caster], ...]
    # projection only: every column in order with its (declared, caster) or None
    steps: tuple[tuple[str, tuple[str, Caster] | None], ...] = ()


_plan_cache: dict[tuple[int, frozenset[str] | None], _RowPlan] = {}


def _row_plan(casters: dict[str, tuple[str, Caster]], columns: frozenset[str] | None) -> _RowPlan:
    key = (id(casters), columns)
    plan = _plan_cache.get(key)
    if plan is None or plan.casters is not casters:  # identity check: an id can be reused after a cache clear
        if columns is None:
            plan = _RowPlan(casters, None, tuple((c, d, fn) for c, (d, fn) in casters.items()))
        else:
            cols = tuple(columns)
            plan = _RowPlan(
                casters, cols, tuple((c, *casters[c]) for c in cols if c in casters),
                tuple((c, casters.get(c)) for c in cols),
            )
        if len(_plan_cache) >= _MAX_CACHE:
            _plan_cache.clear()
        _plan_cache[key] = plan
    return plan


def cast_row(
    row: dict[str, Any],
    casters: dict[str, tuple[str, Caster]],
    table: str,
    columns: frozenset[str] | None = None,
) -> dict[str, Any]:
    """A copy of ``row`` (only ``columns`` when given) with casters applied; a
    failure is a ``cast_error`` naming the column."""
    plan = _row_plan(casters, columns)
    if plan.columns is not None:
        # one pass over the projection: the same result and the same first failing column
        out = {}
        for col, cast in plan.steps:
            if col in row:
                v = row[col]
                if cast is not None and v is not None:
                    try:
                        v = cast[1](v)
                    except CAST_FAILURES as exc:
                        raise _cast_error(table, col, v, cast[0], exc) from None
                out[col] = v
        return out
    out = dict(row)
    for col, declared, fn in plan.todo:
        v = out.get(col)
        if v is None:
            continue
        try:
            out[col] = fn(v)
        except CAST_FAILURES as exc:
            raise _cast_error(table, col, v, declared, exc) from None
    return out


def _cast_error(table: str, col: str, v: Any, declared: str, exc: Exception) -> CdcDecodeError:
    return CdcDecodeError(
        CdcErrorReason.CAST_ERROR, f"{table}.{col}: cannot read {preview(v)} as {declared} ({exception_text(exc, 120, with_type=False)})"
    )


_ABSENT = object()


def cast_row_reusing(
    row: dict[str, Any],
    casters: dict[str, tuple[str, Caster]],
    table: str,
    columns: frozenset[str] | None,
    other_raw: dict[str, Any],
    other_cast: dict[str, Any],
) -> dict[str, Any]:
    """``cast_row(row, ...)`` where ``other_cast`` is ``cast_row(other_raw, ...)`` with
    the same casters and columns: a value equal (same type) to the other image's is
    not cast again.  Casters are pure, so the result is the same; an update's
    before image mostly repeats its after image."""
    plan = _row_plan(casters, columns)
    cols = plan.columns
    out = dict(row) if cols is None else {c: row[c] for c in cols if c in row}
    for col, declared, fn in plan.todo:
        v = out.get(col)
        if v is None:
            continue
        o = other_raw.get(col, _ABSENT)
        if type(o) is type(v) and o == v:
            out[col] = other_cast[col]
            continue
        try:
            out[col] = fn(v)
        except CAST_FAILURES as exc:
            raise _cast_error(table, col, v, declared, exc) from None
    return out


# --------------------------------------------------------------------------- Debezium (schema-driven)

def decode_decimal_bytes(b64: str, scale: int) -> float:
    """Debezium ``precise`` decimal: base64 of the big-endian two's-complement
    unscaled integer.  Python's int/int division is correctly rounded."""
    if not -MAX_DECIMAL_SCALE <= scale <= MAX_DECIMAL_SCALE:
        raise ValueError(f"decimal scale {preview(scale)} is outside [-{MAX_DECIMAL_SCALE}, {MAX_DECIMAL_SCALE}]")
    unscaled = int.from_bytes(base64.b64decode(b64, validate=True), "big", signed=True)
    return unscaled / (10**scale) if scale >= 0 else float(unscaled * 10 ** (-scale))


def _variable_scale_decimal(v: dict[str, Any]) -> float:
    return decode_decimal_bytes(v["value"], int(v["scale"]))


def _int64(v: Any) -> int:
    """An epoch number or bit field as int, within 64 bits (Debezium writes longs; a larger value is
    not a time, and its text would be thousands of digits)."""
    n = int(v)
    if INT_MIN <= n <= INT_MAX:
        return n
    raise ValueError("outside the 64-bit integer range")


def _days_to_date(v: int) -> str:
    return date.fromordinal(_EPOCH_ORDINAL + _int64(v)).isoformat()


_day_text: dict[int, str] = {}


def _epoch_day_text(days: int) -> str:
    """``YYYY-MM-DD`` of a day number since 1970-01-01 (cached; out of range raises like ``date``)."""
    text = _day_text.get(days)
    if text is None:
        text = date.fromordinal(_EPOCH_ORDINAL + days).isoformat()
        if len(_day_text) >= 65536:
            _day_text.clear()
        _day_text[days] = text
    return text


def _micros_to_datetime(us: int) -> str:
    """Epoch microseconds -> ``datetime.isoformat()`` text, built without datetime objects."""
    days, rem = divmod(_int64(us), 86_400_000_000)
    day = _epoch_day_text(days)
    secs, micro = divmod(rem, 1_000_000)
    h, secs = divmod(secs, 3600)
    m, s = divmod(secs, 60)
    if micro:
        return f"{day}T{h:02d}:{m:02d}:{s:02d}.{micro:06d}"
    return f"{day}T{h:02d}:{m:02d}:{s:02d}"


def _micros_to_time(us: int) -> str:
    us = _int64(us)
    sign = "-" if us < 0 else ""
    secs, micro = divmod(abs(us), 1_000_000)
    h, secs = divmod(secs, 3600)
    m, s = divmod(secs, 60)
    text = f"{sign}{h:02d}:{m:02d}:{s:02d}"
    return f"{text}.{micro:06d}" if micro else text


def _bits(v: str) -> int:
    raw = base64.b64decode(v, validate=True)
    if len(raw) > 8:  # MySQL BIT(M) has M <= 64
        raise ValueError(f"{len(raw)} bytes is more than 64 bits")
    return int.from_bytes(raw, "little")


_DEBEZIUM_NAMED: dict[str, Caster | None] = {
    "io.debezium.time.Date": _days_to_date,
    "org.apache.kafka.connect.data.Date": _days_to_date,
    "io.debezium.time.Timestamp": lambda v: _micros_to_datetime(_int64(v) * 1000),
    "org.apache.kafka.connect.data.Timestamp": lambda v: _micros_to_datetime(_int64(v) * 1000),
    "io.debezium.time.MicroTimestamp": _micros_to_datetime,
    "io.debezium.time.NanoTimestamp": lambda v: _micros_to_datetime(_int64(v) // 1000),
    "io.debezium.time.ZonedTimestamp": None,  # already ISO-8601 with offset
    "io.debezium.time.Time": lambda v: _micros_to_time(_int64(v) * 1000),
    "org.apache.kafka.connect.data.Time": lambda v: _micros_to_time(_int64(v) * 1000),
    "io.debezium.time.MicroTime": _micros_to_time,
    "io.debezium.time.NanoTime": lambda v: _micros_to_time(_int64(v) // 1000),
    "io.debezium.data.VariableScaleDecimal": _variable_scale_decimal,
    "io.debezium.data.Bits": _bits,
}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"

_debezium_cache: dict[tuple, dict[str, tuple[str, Caster]]] = {}


def debezium_casters(table: str, fields: list[dict[str, Any]]) -> dict[str, tuple[str, Caster]]:
    """Casters for a Debezium row struct's ``fields`` (from the schema wrapper).

    Only semantic types need work (decimals, temporals, bits); plain int/float/
    string/boolean JSON values are already right.  Cached by a fingerprint of
    (column, semantic name, scale) so a schema change gets new casters."""
    key = (table, tuple((f.get("field"), f.get("name"), str(f.get("parameters"))) for f in fields if f.get("name")))
    casters = _debezium_cache.get(key)
    if casters is None:
        casters = {}
        for f in fields:
            name = f.get("name")
            col = f.get("field")
            if not name or not col:
                continue
            if name == _DECIMAL:
                params = f.get("parameters") or {}
                try:
                    scale = int(params.get("scale", "0"))
                    if not -MAX_DECIMAL_SCALE <= scale <= MAX_DECIMAL_SCALE:
                        raise ValueError(scale)
                except (TypeError, ValueError):
                    raise CdcDecodeError(
                        CdcErrorReason.MALFORMED_EVENT,
                        f"{table}.{col}: Decimal schema has a bad scale {preview(params.get('scale'))}",
                    ) from None
                casters[col] = (f"Decimal(scale={scale})", _scaled_decoder(scale))
            elif name in _DEBEZIUM_NAMED:
                fn = _DEBEZIUM_NAMED[name]
                if fn is not None:
                    casters[col] = (name, fn)
        if len(_debezium_cache) >= _MAX_CACHE:
            _debezium_cache.clear()
        _debezium_cache[key] = casters
    return casters


def _scaled_decoder(scale: int) -> Caster:
    def decode(v: Any) -> Any:
        if isinstance(v, (int, float)):  # decimal.handling.mode=double with a stale schema name
            return float(v)
        return decode_decimal_bytes(v, scale)

    return decode


def scale_casters(table: str, columns: dict[str, int]) -> dict[str, tuple[str, Caster]]:
    """Casters from connector config ``decimal_scales`` (schemaless Debezium)."""
    return {col: (f"Decimal(scale={scale}) from decimal_scales", _scaled_decoder(scale)) for col, scale in columns.items()}


# --------------------------------------------------------------------------- model input coercion

_B64_RE = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")


def _fast_epoch_ms(text: str) -> int | None:
    """Epoch ms of a strict zoneless ``YYYY-MM-DD[ T]HH:MM:SS`` or ``YYYY-MM-DD``
    text (read as UTC), None when the text is not of that form or not a real date.
    Equal to ``_temporal_to_epoch_ms`` on those texts (whole seconds: exact)."""
    last = _last_epoch_ms[0]
    if text == last[0]:
        return last[1]
    ms = _parse_epoch_ms(text)
    if ms is not None:
        _last_epoch_ms[0] = (text, ms)
    return ms


def _parse_epoch_ms(text: str) -> int | None:
    m = _DATETIME_RE.fullmatch(text)
    if m is None:
        return None
    days = _days_since_epoch(m.group(1))
    if days is None:
        return None
    _, h, mi, sec = m.groups()
    if h is None:
        return days * 86_400_000
    return days * 86_400_000 + int(h) * 3_600_000 + int(mi) * 60_000 + int(sec) * 1000


def _temporal_to_epoch_ms(text: str) -> int | None:
    """ISO date/datetime text (zoned or not; zoneless read as UTC) -> epoch ms, else None."""
    if len(text) < 10 or text[4] != "-" or text[7] != "-":
        return None
    ms = _fast_epoch_ms(text)
    if ms is not None:
        return ms
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        try:
            d = date.fromisoformat(text)
        except ValueError:
            return None
        dt = datetime(d.year, d.month, d.day)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _text_to_number(v: str, where: str, kind: str) -> float:
    try:
        f = float(v)
    except ValueError:
        pass
    else:
        if f - f == 0.0:
            return f
        raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: {preview(v)} is not a finite number")
    ms = _temporal_to_epoch_ms(v)
    if ms is not None:
        return ms
    if _B64_RE.fullmatch(v) and len(v) >= 4:
        raise CdcDecodeError(
            CdcErrorReason.CAST_ERROR,
            f"{where}: {preview(v)} looks like a Debezium base64 'precise' decimal and its scale is unknown; "
            f"set decimal.handling.mode=string or double on the Debezium connector, keep value schemas "
            f"enabled, or set decimal_scales: {{<db.table.column>: <scale>}} in the connector spec",
        )
    raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: cannot convert {preview(v)} to {kind}")


def _too_large(v: Any, where: str, kind: str) -> CdcDecodeError:
    return CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: {preview(v)} is too large for {kind}")


def _coerce_float(v: Any, where: str) -> Any:
    if v is None or type(v) is float:
        return v
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an integer beyond 1.8e308 (e.g. a 400-digit BIGINT text)
            raise _too_large(v, where, "a float") from None
    if isinstance(v, str):
        if len(v) >= 10 and v[4] == "-" and v[7] == "-":
            ms = _fast_epoch_ms(v)
            if ms is not None:
                return float(ms)
        return float(_text_to_number(v, where, "float"))
    raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: cannot convert {type(v).__name__} to float")


def _coerce_int(v: Any, where: str) -> Any:
    if v is None or type(v) is int:
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, str):
        if len(v) >= 10 and v[4] == "-" and v[7] == "-":
            # a temporal text (int() and float() cannot read it): skip their exceptions
            ms = _fast_epoch_ms(v)
            if ms is not None:
                return ms
        try:
            return _in_int_range(int(v), where)
        except ValueError:  # not an integer text (or beyond 4,300 digits)
            v = _text_to_number(v, where, "int")
            if type(v) is int:
                return v
    if isinstance(v, float) and v.is_integer():
        return _in_int_range(int(v), where)
    raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: cannot convert {preview(v)} to int without losing digits")


def _in_int_range(n: int, where: str) -> int:
    if INT_MIN <= n <= INT_MAX:
        return n
    raise _too_large(n, where, "a 64-bit integer")


def _coerce_bool(v: Any, where: str) -> Any:
    if v is None or type(v) is bool:
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("1", "true", "t", "yes", "y"):
            return True
        if low in ("0", "false", "f", "no", "n"):
            return False
    raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: cannot convert {preview(v)} to bool")


def _coerce_string(v: Any, where: str) -> Any:
    if v is None or type(v) is str:
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if type(v) is int and not INT_MIN <= v <= INT_MAX:  # str() of a huge int is slow, and refused past 4,300 digits
            raise _too_large(v, where, "a string field")
        return str(v)
    raise CdcDecodeError(CdcErrorReason.CAST_ERROR, f"{where}: cannot convert {preview(v)} to string")


COERCERS: dict[str, Callable[[Any, str], Any]] = {
    "float": _coerce_float,
    "int": _coerce_int,
    "bool": _coerce_bool,
    "string": _coerce_string,
}


def coercer(field_type: str | None) -> Callable[[Any, str], Any] | None:
    """Coercer into a model input field type (sie.schemas.spec FieldSpec.type): numbers
    from numeric text, booleans from 0/1, epoch ms from ISO temporal text.
    ``None`` type -> no coercion."""
    if field_type is None:
        return None
    try:
        return COERCERS[field_type]
    except KeyError:
        raise ValueError(f"unknown model field type {field_type!r}; known: {sorted(COERCERS)}") from None
