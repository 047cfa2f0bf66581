"""The format-neutral vocabulary every CDC decoder produces.

Canal, Debezium and Maxwell describe the same thing (a row changed in a MySQL
table) in three JSON dialects.  Each decoder turns its dialect into
``RowChange`` records so filtering, mapping and request building are written
once.  A decoder has exactly three outcomes, mirroring what the Kafka stage
must do with the source record:

* rows         -> convert and produce scoring requests;
* skipped      -> a legitimate non-row event (DDL, tombstone, heartbeat,
                  transaction marker): commit past it and count it;
* CdcDecodeError(reason, detail) -> poison input: dead-letter it with the
                  reason, never retry, never crash.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

import orjson

from sie.kernel.untrusted import json_text_depth_exceeds, preview

# Deeper nesting is ``malformed_event``: a CDC event is 3-6 levels deep (a JSON column adds its own) and
# the scorer rejects requests nested deeper than its ``max_json_depth`` (64) anyway.  Bounding depth at
# parse time is what makes every later ``==``, ``str`` and ``orjson.dumps`` on event values safe.
MAX_JSON_DEPTH = 64


class Op(str, Enum):
    """Row operation.  ``READ`` is a snapshot/bootstrap row (Debezium ``r``,
    Maxwell ``bootstrap-insert``); the converter treats it as an insert."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    READ = "read"


class SkipReason(str, Enum):
    """Why a record or row produced no request.  Values are the counter names."""

    # record level: decided by the decoder
    DDL = "ddl"                          # canal CREATE/ALTER/..., Debezium schema-change, Maxwell table-*
    TOMBSTONE = "tombstone"              # Debezium null value after a delete
    HEARTBEAT = "heartbeat"              # Debezium heartbeat, canal MHEARTBEAT
    TRANSACTION_MARKER = "transaction_marker"  # Debezium BEGIN/END, canal GTID/XACOMMIT
    TRUNCATE = "truncate"                # Debezium op "t"
    CONTROL_EVENT = "control_event"      # Maxwell bootstrap-start/complete, Debezium op "m"
    EMPTY = "empty"                      # a row event carrying zero rows
    # row level: decided by the converter from the connector spec
    TABLE_NOT_SELECTED = "table_not_selected"
    OPERATION_NOT_SELECTED = "operation_not_selected"
    UNCHANGED_UPDATE = "unchanged_update"


class CdcErrorReason(str, Enum):
    """Dead-letter reasons; each names a different fix."""

    INVALID_JSON = "invalid_json"            # bytes are not JSON
    MALFORMED_EVENT = "malformed_event"      # JSON, but not the shape the format promises
    CAST_ERROR = "cast_error"                # a value does not fit its declared/target type
    SCHEMA_MISMATCH = "schema_mismatch"      # a mapped column is absent from the row image
    MISSING_PRIMARY_KEY = "missing_primary_key"  # no pk in the event and none configured
    NULL_IN_REQUIRED_FIELD = "null_in_required_field"  # SQL NULL for a model input that is required, not nullable
    CONVERSION_ERROR = "conversion_error"    # an unforeseen failure (a bug): dead-lettered, never a crash loop


class CdcDecodeError(Exception):
    """Poison input.  ``str(e)`` is ``"<reason>: <detail>"``; the detail names the
    table/column and the fix so a dead-letter reader can act on it.

    ``coordinates`` (``db``, ``table``, ``op``, ``pk``, ``position``) are set when the failing row is
    known; the stage writes them as ``sie.cdc.*`` dead-letter headers."""

    def __init__(self, reason: CdcErrorReason | str, detail: str,
                 coordinates: dict[str, str] | None = None) -> None:
        self.reason = CdcErrorReason(reason)
        self.detail = detail
        self.coordinates = coordinates or {}
        super().__init__(f"{self.reason.value}: {detail}")

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason.value, "detail": self.detail}


class RowChange(NamedTuple):
    """One changed row, values already cast to Python types (images hold only the
    projected columns when ``DecodeOptions.columns`` is set).

    A NamedTuple (immutable, cheap to build: the hot path creates one per row).
    ``before``/``after``: full images where the source has them (canal/maxwell
    UPDATE ``before`` is ``after`` overlaid with ``old``).  ``changed_columns``
    is None when unknown (inserts, deletes, Debezium updates without a before
    image).  ``ref`` is the replay-stable identity of this change inside its
    table+pk (used for request ids); ``position`` is the human-readable source
    position for traceability.
    """

    source_format: str
    database: str
    table: str
    op: Op
    pk: dict[str, Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    changed_columns: frozenset[str] | None
    ts_ms: int | None
    position: str
    ref: str

    @property
    def qualified_table(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def image(self) -> dict[str, Any]:
        """The image requests are built from: ``before`` for deletes, else ``after``."""
        return self.before if self.op is Op.DELETE else self.after  # type: ignore[return-value]


class DecodeResult(NamedTuple):
    """Either ``rows`` (possibly several: a canal multi-row statement) or a ``skipped`` reason."""

    rows: tuple[RowChange, ...] = ()
    skipped: SkipReason | None = None


class DecodeOptions(NamedTuple):
    """Per-connector knobs a decoder needs (built from the connector spec).

    tinyint1_as_bool: canal ``tinyint(1)`` columns become bool (MySQL's BOOLEAN
        is ``tinyint(1)``); set False to keep ints.
    decimal_scales: ``{"db.table.column": scale}`` for Debezium ``precise``
        decimals when the record has no schema wrapper.
    columns: when set, canal and Debezium images keep (and cast) only these
        columns plus the event's primary key columns: casting is most of the
        per-row cost and real tables are wide while a model reads a few
        columns.  ``changed_columns`` still covers every column.
    """

    tinyint1_as_bool: bool = True
    decimal_scales: dict[str, int] = {}
    columns: frozenset[str] | None = None


DEFAULT_OPTIONS = DecodeOptions()


def load_json(value: bytes | str, what: str = "value") -> Any:
    """Parse JSON text and bound its nesting (``MAX_JSON_DEPTH``), or raise the right dead-letter reason."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise CdcDecodeError(
            CdcErrorReason.INVALID_JSON, f"record {what} is not JSON ({exc}); starts with {preview(value)}"
        ) from None
    check_depth(value, doc, what)
    return doc


def check_depth(text: bytes | str, doc: Any, what: str = "value") -> None:
    """``malformed_event`` when ``doc`` (parsed from ``text``) is nested deeper than ``MAX_JSON_DEPTH``."""
    depth = json_text_depth_exceeds(text, doc, MAX_JSON_DEPTH)
    if depth:
        raise CdcDecodeError(
            CdcErrorReason.MALFORMED_EVENT,
            f"record {what} is nested {depth}+ levels deep (at most {MAX_JSON_DEPTH} are accepted)",
        )


def load_json_object(value: bytes | str | None, what: str = "value") -> dict[str, Any]:
    """Parse one JSON object or raise the right dead-letter reason."""
    if value is None:
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"record {what} is null")
    if not isinstance(value, (bytes, str)):
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"record {what} is {preview(value)}, not bytes")
    doc = load_json(value, what)
    if not isinstance(doc, dict):
        raise CdcDecodeError(
            CdcErrorReason.MALFORMED_EVENT, f"record {what} must be a JSON object, got {describe(doc)}"
        )
    return doc


def require(doc: dict[str, Any], field: str, kind: type | tuple[type, ...], fmt: str) -> Any:
    """``doc[field]`` checked for presence and type; a missing/mistyped field is malformed."""
    value = doc.get(field)
    if not isinstance(value, kind):
        got = "missing" if field not in doc else describe(value)
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{fmt} event field {field!r} is {got}")
    return value


_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def describe(value: Any) -> str:
    """``a string 'abc'``, ``a number 5``, ``null``, ``an array of 2 items``: what a JSON value is, bounded."""
    kind = _JSON_KINDS.get(type(value))
    if kind is None or type(value) in (dict, list):
        return preview(value, 40)
    return kind if value is None else f"{kind} {preview(value, 40)}"


def position_part(value: Any, field: str, fmt: str) -> str:
    """Text of a source-position field (batch id, binlog file/pos, gtid, xid ...) for ``position``/``ref``.

    A position is made of scalars; an object or array there is a malformed event (and formatting one
    would put an arbitrary structure into every request id)."""
    t = type(value)
    if t is str:
        return value
    if t is int or t is float or value is None or t is bool:
        return str(value)
    raise CdcDecodeError(
        CdcErrorReason.MALFORMED_EVENT, f"{fmt} event field {field!r} must be a string or a number, got {preview(value)}"
    )


def check_names(value: Any, field: str, where: str) -> list[str]:
    """A JSON array of column names (``pkNames``, ``primary_key_columns``), else ``malformed_event``."""
    if type(value) is not list or any(type(n) is not str for n in value):
        raise CdcDecodeError(
            CdcErrorReason.MALFORMED_EVENT, f"{where}: {field!r} must be an array of column names, got {preview(value)}"
        )
    return value


def format_pk(pk: dict[str, Any]) -> str:
    """Deterministic text form of a primary key.

    Single column: the value alone (``10001``); composite: ``col=value`` pairs in
    the source's key order joined by ``,`` (``order_id=7,line=2``).  Characters
    that would make the form ambiguous (``% , = :``) are percent-escaped.
    """
    if len(pk) == 1:
        for value in pk.values():
            if type(value) is int:  # the common case: digits need no escaping
                return str(value)
            return _pk_value(value)
    return ",".join(f"{_escape(col)}={_pk_value(value)}" for col, value in pk.items())


def _pk_value(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    t = type(value)
    if t is str:
        return _escape(value)
    if t is int or t is float:
        return _escape(str(value))
    raise CdcDecodeError(
        CdcErrorReason.MALFORMED_EVENT,
        f"primary key value {preview(value)}: a key column must hold a string, number or boolean",
    )


def _escape(text: str) -> str:
    if "%" in text or "," in text or "=" in text or ":" in text:
        return text.replace("%", "%25").replace(",", "%2C").replace("=", "%3D").replace(":", "%3A")
    return text
