"""Per-message validation of request ``inputs`` (and model ``outputs``) against an IOSchema.

The scorer validates every record on the hot path, so the schema is compiled
once into a tuple of small per-field check functions; no pydantic model is
built per message.  Rules (JSON semantics, as ``json.loads``/``orjson`` give):

- ``bool`` is not an ``int`` (``True`` for an int field is a violation);
- ``int`` values are accepted for ``float`` fields and converted to float;
- NaN and +/-Infinity are rejected for float fields;
- ``required`` fields must be present; ``nullable`` fields may be ``null``;
- ``max_length`` bounds strings (characters), ``range`` bounds numbers (inclusive);
- unknown fields: ``reject`` -> violation, ``ignore`` -> dropped, ``allow`` -> kept.

A violation raises ``SchemaViolation`` whose ``str`` is one line,
``inputs.amount: must be a number (got 'abc')``; the scorer dead-letters the
record with reason ``schema_violation`` and that line as detail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sie.schemas.spec_models import FieldSpec, IOSchema

_MISSING = object()
_REPR_LIMIT = 60

Validator = Callable[[Any], dict]
_Check = Callable[[Any], Any]  # returns the clean value or raises _Bad


class SchemaViolation(ValueError):
    """A record's inputs/outputs do not match the schema (poison input: dead-letter, never retry)."""

    dlq_reason = "schema_violation"

    def __init__(self, field: str, reason: str, value: Any = _MISSING, prefix: str = "inputs") -> None:
        self.field = field
        self.reason = reason
        self.value = None if value is _MISSING else value
        self.prefix = prefix
        path = f"{prefix}.{field}" if field else prefix
        got = "" if value is _MISSING else f" (got {_short_repr(value)})"
        super().__init__(f"{path}: {reason}{got}")


class _Bad(Exception):
    """Internal: a check failed; carries the reason (the caller adds field and value)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _string_check(spec: FieldSpec) -> _Check:
    max_len = spec.max_length

    def check(v: Any) -> Any:
        if type(v) is not str and not isinstance(v, str):
            raise _Bad("must be a string")
        if max_len is not None and len(v) > max_len:
            raise _Bad(f"longer than max_length {max_len} ({len(v)} characters)")
        return v

    return check


def _bool_check(spec: FieldSpec) -> _Check:
    def check(v: Any) -> Any:
        if v is True or v is False:
            return v
        raise _Bad("must be a boolean")

    return check


def _range_reason(spec: FieldSpec) -> str:
    lo, hi = spec.range  # type: ignore[misc]
    return f"out of range [{_fmt(lo)}, {_fmt(hi)}]"


def _int_check(spec: FieldSpec) -> _Check:
    bounds = spec.range
    if bounds is None:

        def check(v: Any) -> Any:
            if type(v) is int:
                return v
            raise _Bad("must be an integer")

        return check
    lo, hi = bounds
    out_of_range = _range_reason(spec)

    def check_ranged(v: Any) -> Any:
        if type(v) is not int:
            raise _Bad("must be an integer")
        if v < lo or v > hi:
            raise _Bad(out_of_range)
        return v

    return check_ranged


def _float_check(spec: FieldSpec) -> _Check:
    bounds = spec.range
    lo, hi = bounds if bounds is not None else (-math.inf, math.inf)
    out_of_range = _range_reason(spec) if bounds is not None else ""
    isfinite = math.isfinite

    def check(v: Any) -> Any:
        t = type(v)
        if t is float:
            if not isfinite(v):
                raise _Bad("must be a finite number (NaN/Infinity not allowed)")
        elif t is int:
            try:
                v = float(v)
            except OverflowError:
                raise _Bad("number too large for a float") from None
        else:
            raise _Bad("must be a number")
        if v < lo or v > hi:
            raise _Bad(out_of_range)
        return v

    return check


_FACTORIES: dict[str, Callable[[FieldSpec], _Check]] = {
    "string": _string_check,
    "int": _int_check,
    "float": _float_check,
    "bool": _bool_check,
}


def compile_field(spec: FieldSpec) -> _Check:
    """The check of one field (not null-aware); exposed for the parser and tests."""
    return _FACTORIES[spec.type](spec)


def _slow_path(spec: FieldSpec, prefix: str) -> Callable[[Any], Any]:
    """Exact check of one value that missed the fast path: None, int->float, str subclasses, or a violation."""
    check = compile_field(spec)
    name, nullable = spec.name, spec.nullable

    def slow(v: Any) -> Any:
        if v is None:
            if nullable:
                return None
            raise SchemaViolation(name, "must not be null", v, prefix)
        try:
            return check(v)
        except _Bad as bad:
            raise SchemaViolation(name, bad.reason, v, prefix) from None

    return slow


def _fast_condition(spec: FieldSpec, i: int) -> str:
    """A Python expression true only for values that are certainly valid and need no conversion."""
    if spec.type == "bool":
        return "v is True or v is False"
    if spec.type == "string":
        return "type(v) is str" + (f" and len(v) <= {spec.max_length}" if spec.max_length is not None else "")
    if spec.type == "int":
        return "type(v) is int" + (f" and lo_{i} <= v <= hi_{i}" if spec.range is not None else "")
    # float: the comparisons are False for NaN; +/-inf fail the (finite or strict infinite) bounds
    return f"type(v) is float and lo_{i} <= v <= hi_{i}" if spec.range is not None else "type(v) is float and -inf < v < inf"


def compile_validator(io_schema: IOSchema, prefix: str = "inputs") -> Validator:
    """Compile ``io_schema`` into ``validate(payload) -> clean dict`` (raises SchemaViolation).

    ``prefix`` names the payload in messages: ``inputs`` for requests,
    ``outputs`` for what a backend returns.  The schema becomes the source of
    one straight-line function (one inlined type/bound test per field); any
    value that misses that fast test takes the exact per-field check, which
    either converts it (int for a float field, null for a nullable field) or
    raises with the precise reason.
    """
    declared = frozenset(f.name for f in io_schema.fields)
    policy = io_schema.unknown_fields
    env: dict[str, Any] = {"M": _MISSING, "inf": math.inf, "SchemaViolation": SchemaViolation, "prefix": prefix}

    def not_object(payload: Any) -> dict:
        raise SchemaViolation("", "must be a JSON object", payload, prefix)

    def extras(payload: dict, out: dict) -> dict:
        extra = [k for k in payload if k not in declared]
        if extra and policy == "reject":
            raise SchemaViolation(
                str(extra[0]), f"unknown field (declared: {', '.join(sorted(declared)) or 'none'})",
                payload[extra[0]], prefix,
            )
        if policy == "allow":
            for k in extra:
                out[k] = payload[k]
        return out

    env["not_object"], env["extras"] = not_object, extras
    lines = [
        "def validate(payload):",
        "    if type(payload) is not dict and not isinstance(payload, dict):",
        "        return not_object(payload)",
        "    get = payload.get",
        "    out = {}",
    ]
    for i, f in enumerate(io_schema.fields):
        env[f"slow_{i}"] = _slow_path(f, prefix)
        if f.range is not None:
            env[f"lo_{i}"], env[f"hi_{i}"] = f.range
        key = repr(f.name)
        lines += [
            f"    v = get({key}, M)",
            "    if v is not M:",
            f"        if {_fast_condition(f, i)}:",
            f"            out[{key}] = v",
            "        else:",
            f"            out[{key}] = slow_{i}(v)",
        ]
        if f.required:
            lines += ["    else:", f"        raise SchemaViolation({key}, 'required field missing', prefix=prefix)"]
    lines += [
        "    if len(out) != len(payload)" + (" or True" if policy == "allow" else "") + ":",
        "        return extras(payload, out)",
        "    return out",
    ]
    exec(compile("\n".join(lines), f"<validator {prefix}>", "exec"), env)  # noqa: S102 - source built from a validated schema
    return env["validate"]


def compile_output_check(io_schema: IOSchema) -> Validator | None:
    """The run-time check of a model's ``outputs`` (``prefix='outputs'``), or None when the spec declares no
    output schema (nothing to enforce: no per-row cost at all).

    Compiled once per scorer like the input validator: a type, a ``range``, a missing required field or an
    undeclared one (``unknown_fields: reject``) raises ``SchemaViolation`` naming ``outputs.<field>``, and the
    scorer dead-letters the request as ``output_violation`` instead of publishing an ``ok`` result.
    """
    if not io_schema.fields and io_schema.unknown_fields == "allow":
        return None
    return compile_validator(io_schema, prefix="outputs")
