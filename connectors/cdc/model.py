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


class CdcDecodeError(Exception):
    """Poison input.  ``str(e)`` is ``"<reason>: <detail>"``; the detail names the
    table/column and the fix so a dead-letter reader can act on it."""

    def __init__(self, reason: CdcErrorReason | str, detail: str) -> None:
        self.reason = CdcErrorReason(reason)
        self.detail = detail
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


def load_json_object(value: bytes | str | None, what: str = "value") -> dict[str, Any]:
    """Parse one JSON object or raise the right dead-letter reason."""
    if value is None:
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"record {what} is null")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        head = bytes(value[:60]) if isinstance(value, (bytes, bytearray, memoryview)) else str(value)[:60]
        raise CdcDecodeError(CdcErrorReason.INVALID_JSON, f"record {what} is not JSON ({exc}); starts with {head!r}") from None
    if not isinstance(doc, dict):
        raise CdcDecodeError(
            CdcErrorReason.MALFORMED_EVENT, f"record {what} must be a JSON object, got {type(doc).__name__}"
        )
    return doc


def require(doc: dict[str, Any], field: str, kind: type | tuple[type, ...], fmt: str) -> Any:
    """``doc[field]`` checked for presence and type; a missing/mistyped field is malformed."""
    value = doc.get(field)
    if not isinstance(value, kind):
        got = "missing" if field not in doc else f"{type(value).__name__} {str(value)[:40]!r}"
        raise CdcDecodeError(CdcErrorReason.MALFORMED_EVENT, f"{fmt} event field {field!r} is {got}")
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
    text = value if isinstance(value, str) else str(value)
    return _escape(text)


def _escape(text: str) -> str:
    if "%" in text or "," in text or "=" in text or ":" in text:
        return text.replace("%", "%25").replace(",", "%2C").replace("=", "%3D").replace(":", "%3A")
    return text
