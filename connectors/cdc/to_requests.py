"""RowChange -> SIE scoring requests, and the per-record converter the Kafka stage calls.

Request record (produced to the model's request topic):

* key   ``"<db>.<table>:<pk>"`` (see ``model.format_pk``): all changes of one row
  land on one partition in order, and results keyed by it upsert.
* value ``{"id": ..., "inputs": {field: value}, "metadata": {"cdc": {"format",
  "db", "table", "op", "pk", "ts_ms", "position"}}}`` where ``id`` comes from
  ``id_template`` (default ``{db}.{table}:{pk}:{ref}:{op}``) and ``ref`` is the
  replay-stable change identity from the decoder: replaying the source topic
  yields byte-identical requests, so downstream dedupe/upsert works.

Per record the outcome is all-or-nothing: either every selected row becomes a
request, or the record is dead-lettered with one ``CdcDecodeError``.  Rows that
are filtered out (table, operation, unchanged update) are counted, not lost.

SQL NULL for a mapped model input follows the model's input schema (when the
converter has it): a ``nullable`` field gets ``null``; a field that is neither
nullable nor required is left out of ``inputs``; a required, non-nullable field
makes the record a ``null_in_required_field`` dead letter here, with the row's
db/table/pk/position, instead of a request the scorer would reject without them.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from sie.connectors.cdc.canal import decode_canal
from sie.connectors.cdc.casting import coercer
from sie.connectors.cdc.config import CdcConnectorSpec, ConnectorSpecError
from sie.connectors.cdc.debezium import decode_debezium
from sie.connectors.cdc.maxwell import decode_maxwell
from sie.connectors.cdc.model import (
    CdcDecodeError,
    CdcErrorReason,
    DecodeOptions,
    DecodeResult,
    Op,
    RowChange,
    SkipReason,
    format_pk,
)
from sie.kernel.untrusted import exception_text, preview
from sie.schemas.spec_models import IOSchema

log = logging.getLogger("sie.cdc")

DECODERS: dict[str, Callable[[bytes | None, bytes | None, DecodeOptions], DecodeResult]] = {
    "canal-json": decode_canal,
    "debezium-json": decode_debezium,
    "maxwell-json": decode_maxwell,
}


class ConvertedRequest(NamedTuple):
    """One scoring request ready to produce: ``key``/``value`` bytes plus the id and source row."""

    key: bytes
    value: bytes
    request_id: str
    row: RowChange


class ConversionOutcome(NamedTuple):
    """Result of converting one source record.

    ``error`` set -> dead-letter the record (``error.reason``/``error.detail``);
    ``requests`` empty and no error -> nothing to produce (see ``skipped``:
    ``{reason: count}``); both can be non-empty when some rows of a multi-row
    message were filtered out."""

    requests: list[ConvertedRequest]
    skipped: dict[str, int]
    error: CdcDecodeError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# model field type -> the Python type its coercer passes through untouched
_EXACT: dict[str, type] = {"float": float, "int": int, "bool": bool, "string": str}

# what SQL NULL becomes for a model input (``null_rules``): see the module docstring
NULL_PASSES, NULL_OMITTED, NULL_REJECTED = 0, 1, 2


def null_rules(input_schema: IOSchema) -> dict[str, int]:
    """Per model input field, what SQL NULL becomes: ``null`` if nullable, left out if optional, else a
    ``null_in_required_field`` dead letter (the scorer's validator would reject ``null`` there)."""
    return {f.name: NULL_PASSES if f.nullable else NULL_OMITTED if not f.required else NULL_REJECTED
            for f in input_schema.fields}


class _Plan:
    """The compiled connector spec: table matcher, op filter, mapping, coercers."""

    def __init__(self, spec: CdcConnectorSpec, field_types: Mapping[str, str] | None,
                 nulls: Mapping[str, int] | None = None) -> None:
        self.spec = spec
        self.patterns = tuple(spec.tables)
        self._table_ok: dict[tuple[str, str], bool] = {}
        ops = set(spec.operations)
        self.ops = frozenset(
            [Op(o) for o in ops] + ([Op.READ] if "insert" in ops else [])
        )
        self.mapping: dict[str, str] | None
        if spec.mapping is not None:
            self.mapping = dict(spec.mapping)
        elif field_types is not None:
            self.mapping = {f: f for f in field_types}
        else:
            self.mapping = None  # every column, same names
        self.columns = frozenset(self.mapping.values()) if self.mapping is not None else None
        types = field_types or {}
        nulls = nulls or {}
        # (field, column, coercer, the type a coercer returns unchanged, what NULL becomes)
        self.fields: tuple[tuple[str, str, Any, type | None, int], ...] = tuple(
            (field, column, coercer(types.get(field)), _EXACT.get(types.get(field)),  # type: ignore[arg-type]
             nulls.get(field, NULL_PASSES))
            for field, column in (self.mapping or {}).items()
        )
        self.primary_keys = {t: tuple(cols) for t, cols in spec.primary_keys.items()}
        self.template = spec.id_template
        self.fast_id = spec.id_template == "{db}.{table}:{pk}:{ref}:{op}"
        projection = None
        if self.columns is not None:
            projection = self.columns.union(*self.primary_keys.values())
        self.options = DecodeOptions(spec.tinyint1_as_bool, dict(spec.decimal_scales), projection)

    def table_selected(self, db: str, table: str) -> bool:
        key = (db, table)
        ok = self._table_ok.get(key)
        if ok is None:
            name = f"{db}.{table}"
            ok = any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
            if len(self._table_ok) > 65536:
                self._table_ok.clear()
            self._table_ok[key] = ok
        return ok

    def select(self, row: RowChange) -> SkipReason | None:
        if not self.table_selected(row.database, row.table):
            return SkipReason.TABLE_NOT_SELECTED
        if row.op not in self.ops:
            return SkipReason.OPERATION_NOT_SELECTED
        if (
            row.op is Op.UPDATE
            and self.spec.skip_unchanged_updates
            and row.changed_columns is not None
            and (not row.changed_columns if self.columns is None else self.columns.isdisjoint(row.changed_columns))
        ):
            return SkipReason.UNCHANGED_UPDATE
        return None

    def _pk(self, row: RowChange, image: dict[str, Any], qualified: str) -> dict[str, Any]:
        """The row's primary key: the configured columns for this table, else the event's."""
        if self.primary_keys:
            configured = self.primary_keys.get(qualified)
            if configured is not None:
                return {c: image.get(c) for c in configured}
        return row.pk

    def coordinates(self, row: RowChange) -> dict[str, str]:
        """Where a failing row is (``sie.cdc.*`` dead-letter headers): db, table, op, position, pk if known."""
        out = {"db": row.database, "table": row.table, "op": row.op.value, "position": row.position}
        image = row.before if row.op is Op.DELETE else row.after
        try:
            pk = self._pk(row, image or {}, f"{row.database}.{row.table}")
            if pk:
                out["pk"] = format_pk(pk)
        except CdcDecodeError:  # a pk that cannot be written (an object): the detail says so
            pass
        return out

    def request(self, row: RowChange) -> ConvertedRequest:
        database, table, op_enum = row.database, row.table, row.op
        image = row.before if op_enum is Op.DELETE else row.after
        qualified = f"{database}.{table}"
        if image is None:
            raise CdcDecodeError(
                CdcErrorReason.MALFORMED_EVENT,
                f"{qualified}: the {op_enum.value} event carries no row image "
                f"({'before' if op_enum is Op.DELETE else 'after'}); the source must log full row images",
            )
        pk = self._pk(row, image, qualified) if self.primary_keys else row.pk
        if not pk:
            raise CdcDecodeError(
                CdcErrorReason.MISSING_PRIMARY_KEY,
                f"{qualified}: the event carries no primary key (canal pkNames null, Debezium null key, "
                f"Maxwell key without pk.*); set primary_keys: {{{qualified}: [<column>, ...]}} "
                f"in connector {self.spec.name!r}",
            )
        pk_text = format_pk(pk)
        key = f"{qualified}:{pk_text}"
        op = op_enum.value
        if self.fast_id:
            request_id = f"{key}:{row.ref}:{op}"
        else:
            request_id = self.template.format(
                db=database, table=table, pk=pk_text, op=op, ref=row.ref,
                position=row.position, ts_ms=row.ts_ms, connector=self.spec.name,
            )
        if self.mapping is None:
            inputs = dict(image)
        else:
            inputs = {}
            for field, column, coerce, exact, null_rule in self.fields:
                try:
                    value = image[column]
                except KeyError:
                    raise CdcDecodeError(
                        CdcErrorReason.SCHEMA_MISMATCH,
                        f"{qualified}: mapped column {column!r} (model input {field!r}) is missing from the "
                        f"{op} row image; columns present: {[preview(c, 40) for c in sorted(image)[:20]]}; "
                        f"fix mapping in connector {self.spec.name!r} or the table",
                    ) from None
                if type(value) is exact:
                    inputs[field] = value  # what the coercer would return unchanged
                elif value is None:
                    if null_rule == NULL_PASSES:
                        inputs[field] = None
                    elif null_rule == NULL_REJECTED:
                        raise CdcDecodeError(
                            CdcErrorReason.NULL_IN_REQUIRED_FIELD,
                            f"inputs.{field}: column {qualified}.{column} is NULL (pk {pk_text}, {op} at "
                            f"{row.position}) but the model input is required and not nullable; declare it "
                            f"nullable (or not required) in model {self.spec.model!r}, or map a NOT NULL column",
                        )
                    # NULL_OMITTED: an optional input without a value is simply absent
                elif coerce is None:
                    inputs[field] = value
                else:
                    # the error text (`where`) is only built when coercion fails: re-run to raise it
                    try:
                        inputs[field] = coerce(value, "")
                    except CdcDecodeError:
                        coerce(value, f"{qualified}.{column} -> inputs.{field}")
                        raise
        doc = {
            "id": request_id,
            "inputs": inputs,
            "metadata": {
                "cdc": {
                    "format": row.source_format,
                    "db": database,
                    "table": table,
                    "op": op,
                    "pk": pk,
                    "ts_ms": row.ts_ms,
                    "position": row.position,
                }
            },
        }
        try:
            value = orjson.dumps(doc)  # str keys only: the same bytes as with OPT_NON_STR_KEYS, faster
        except TypeError:
            try:
                value = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
            except TypeError as exc:
                raise self._unwritable(inputs, qualified, exc) from None
        return ConvertedRequest(key.encode(), value, request_id, row)

    def _unwritable(self, inputs: dict[str, Any], qualified: str, exc: TypeError) -> CdcDecodeError:
        """Why a request cannot be written as JSON (an integer beyond 64 bits is the one known case: the
        values are bounded in depth and come from JSON or a caster), naming the input and its column."""
        for field, v in inputs.items():
            try:
                orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)
            except TypeError as field_exc:
                column = self.mapping.get(field, field) if self.mapping is not None else field
                return CdcDecodeError(
                    CdcErrorReason.CAST_ERROR,
                    f"{qualified}.{column} -> inputs.{field}: {preview(v)} cannot be written to a request "
                    f"({exception_text(field_exc, 80)})",
                )
        return CdcDecodeError(CdcErrorReason.CAST_ERROR,
                              f"{qualified}: the request cannot be written as JSON ({exception_text(exc, 80)})")

    def convert_rows(self, rows: Iterable[RowChange], skipped: dict[str, int]) -> list[ConvertedRequest]:
        out = []
        for row in rows:
            reason = self.select(row)
            if reason is not None:
                skipped[reason.value] = skipped.get(reason.value, 0) + 1
                continue
            try:
                out.append(self.request(row))
            except CdcDecodeError as exc:
                if not exc.coordinates:
                    exc.coordinates = self.coordinates(row)
                raise
        return out


def _check_mapping(spec: CdcConnectorSpec, field_types: Mapping[str, str] | None) -> None:
    if field_types is None or spec.mapping is None:
        return
    unknown = sorted(set(spec.mapping) - set(field_types))
    if unknown:
        raise ConnectorSpecError(
            f"connector {spec.name!r}: connector.mapping: model {spec.model!r} has no input field(s) {unknown}; "
            f"its fields are {sorted(field_types)}"
        )


def _model_fields(
    field_types: Mapping[str, str] | None, input_schema: IOSchema | None
) -> tuple[Mapping[str, str] | None, dict[str, int] | None]:
    """(field types, NULL rules) from either a bare ``{field: type}`` or the model's input schema."""
    if input_schema is None:
        return field_types, None
    if field_types is not None:
        raise ValueError("give field_types or input_schema, not both (input_schema carries the types)")
    return {f.name: f.type for f in input_schema.fields}, null_rules(input_schema)


def rows_to_requests(
    rows: Iterable[RowChange], spec: CdcConnectorSpec, field_types: Mapping[str, str] | None = None,
    *, input_schema: IOSchema | None = None,
) -> list[ConvertedRequest]:
    """Filter and convert decoded rows (raises ``CdcDecodeError`` on the first bad row).
    For a stream of records use ``CdcConverter`` (compiles the spec once, counts outcomes)."""
    types, nulls = _model_fields(field_types, input_schema)
    _check_mapping(spec, types)
    return _Plan(spec, types, nulls).convert_rows(rows, {})


class CdcConverter:
    """Per-record conversion for the Kafka stage: ``convert(key, value)`` never raises;
    it returns a ``ConversionOutcome`` and updates ``stats()``.

    What the converter knows about the model's inputs enables coercion of values to
    the model's types, a default mapping of the model's fields, and a
    construction-time check that the mapping names real fields.  Give either
    ``input_schema`` (the model's ``IOSchema``: types and the NULL rules of the
    module docstring) or ``field_types`` (field -> "string"|"int"|"float"|"bool":
    types only, NULL is passed on as null).
    """

    def __init__(
        self,
        spec: CdcConnectorSpec,
        field_types: Mapping[str, str] | None = None,
        *,
        request_topic: str | None = None,
        topic_prefix: str = "sie",
        input_schema: IOSchema | None = None,
    ) -> None:
        types, nulls = _model_fields(field_types, input_schema)
        _check_mapping(spec, types)
        self.spec = spec
        self._plan = _Plan(spec, types, nulls)
        self._decode = DECODERS[spec.format]
        if request_topic is None:
            request_topic = spec.request_topic
        if request_topic is None:  # the model's default topic in this cluster (SIE_TOPIC_PREFIX)
            from sie.kernel.names import Names

            request_topic = Names(topic_prefix).model_topics(spec.model).requests
        self.request_topic = request_topic
        self._stats: Counter = Counter()

    def decode(self, key: bytes | None, value: bytes | None) -> DecodeResult:
        """Decode only (raises ``CdcDecodeError``)."""
        return self._decode(key, value, self._plan.options)

    def convert(self, key: bytes | None, value: bytes | None) -> ConversionOutcome:
        stats = self._stats
        stats["records"] += 1
        skipped: dict[str, int] = {}
        try:
            result = self._decode(key, value, self._plan.options)
            if result.skipped is not None:
                skipped[result.skipped.value] = 1
                requests: list[ConvertedRequest] = []
            else:
                requests = self._plan.convert_rows(result.rows, skipped)
        except CdcDecodeError as exc:
            return self._failed(exc)
        except Exception as exc:  # noqa: BLE001 - the last line of defence, see below
            # Every known bad input raises CdcDecodeError with its own reason; reaching here is a bug
            # (tests/fuzz hunts for them).  Dead-lettering the record keeps the partition moving: raising
            # would crash the stage, and on restart it would read the same record again, forever.
            log.warning("cdc %s: unexpected %s converting a record; dead-lettered as conversion_error",
                        self.spec.name, type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
            return self._failed(
                CdcDecodeError(CdcErrorReason.CONVERSION_ERROR, f"unexpected {exception_text(exc)}")
            )
        stats["requests"] += len(requests)
        for reason, n in skipped.items():
            stats[f"skipped.{reason}"] += n
        stats["records_converted" if requests else "records_skipped"] += 1
        return ConversionOutcome(requests, skipped)

    def _failed(self, exc: CdcDecodeError) -> ConversionOutcome:
        self._stats["records_failed"] += 1
        self._stats[f"errors.{exc.reason.value}"] += 1
        return ConversionOutcome([], {}, exc)

    def stats(self) -> dict[str, int]:
        """Counters: records, records_converted/_skipped/_failed, requests,
        ``skipped.<reason>`` (rows/records), ``errors.<reason>`` (records)."""
        return dict(self._stats)
