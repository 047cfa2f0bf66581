"""Is a new model version's I/O schema compatible with the version it replaces?

Applying a new version replaces each replica independently, so for a while
both versions serve the same request topic and write the same result topic:

- input (``kind="input"``): every request valid for the OLD schema must stay
  valid for the NEW one (producers do not change in step with the model).
  Breaks: new required field, type changed (except int -> float, since ints
  are accepted for floats), optional -> required, nullable -> not nullable,
  range narrowed or added, max_length reduced or added, a field removed while
  the new schema rejects unknown fields, unknown-field policy tightened to reject.
- output (``kind="output"``): every result of the NEW schema must satisfy
  consumers written for the OLD one.  Breaks: field removed, type changed
  (except float -> int: an int is a valid float), required -> optional, not nullable -> nullable, range widened or removed,
  max_length increased or removed.  New output fields are fine.

``check_compatibility`` returns every break (empty list = compatible); each
prints as ``inputs.text: type changed string -> int``.  The control plane's
``POST /v1/models`` and ``sie apply`` refuse such a version with
``schema_incompatible`` and these lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sie.schemas.spec_models import FieldSpec, IOSchema

if TYPE_CHECKING:
    from sie.schemas.spec_models import ModelService

Kind = Literal["input", "output"]


@dataclass(frozen=True)
class Break:
    """One incompatible change: ``field`` (as ``inputs.x``/``outputs.x``), a ``change`` code, a human ``detail``."""

    field: str
    change: str
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}"


def _fmt_range(r: tuple[float, float] | None) -> str:
    if r is None:
        return "unbounded"
    return "[" + ", ".join(str(int(x)) if float(x).is_integer() else repr(x) for x in r) + "]"


def _contains(outer: tuple[float, float] | None, inner: tuple[float, float] | None) -> bool:
    """Does range ``outer`` accept every value range ``inner`` accepts (None = unbounded)?"""
    if outer is None:
        return True
    if inner is None:
        return False
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def _max_len_ok(wider: int | None, narrower: int | None) -> bool:
    """Is every string of length <= ``narrower`` accepted by ``wider``?"""
    if wider is None:
        return True
    if narrower is None:
        return False
    return narrower <= wider


def _field_breaks(old: FieldSpec, new: FieldSpec, kind: Kind, path: str) -> list[Break]:
    out: list[Break] = []
    if old.type != new.type:
        # an int value is valid for a float field: the "accepting" side may widen int -> float
        widening_ok = (kind == "input" and (old.type, new.type) == ("int", "float")) or (
            kind == "output" and (old.type, new.type) == ("float", "int")
        )
        if not widening_ok:
            out.append(Break(path, "type_changed", f"type changed {old.type} -> {new.type}"))
    # "accepting" = the schema that must accept what the other produces
    if kind == "input":
        producer, acceptor = old, new
    else:
        producer, acceptor = new, old
    if kind == "input" and new.required and not old.required:
        out.append(Break(path, "now_required", "optional field became required"))
    if kind == "output" and old.required and not new.required:
        out.append(Break(path, "now_optional", "required output may now be absent"))
    if producer.nullable and not acceptor.nullable:
        what = "no longer nullable" if kind == "input" else "output may now be null"
        out.append(Break(path, "nullable_changed", what))
    if not _contains(acceptor.range, producer.range):
        if kind == "input":
            out.append(Break(path, "range_narrowed", f"range narrowed {_fmt_range(old.range)} -> {_fmt_range(new.range)}"))
        else:
            out.append(Break(path, "range_widened", f"range widened {_fmt_range(old.range)} -> {_fmt_range(new.range)}"))
    if not _max_len_ok(acceptor.max_length, producer.max_length) and old.type == new.type == "string":
        change = "max_length_reduced" if kind == "input" else "max_length_increased"
        out.append(Break(path, change, f"max_length {'reduced' if kind == 'input' else 'increased'} "
                                       f"{old.max_length or 'unbounded'} -> {new.max_length or 'unbounded'}"))
    return out


def check_compatibility(old: IOSchema, new: IOSchema, kind: Kind = "input") -> list[Break]:
    """Every way ``new`` breaks clients of ``old`` (empty = compatible). See the module doc for the rules."""
    if kind not in ("input", "output"):
        raise ValueError(f"kind must be 'input' or 'output' (got {kind!r})")
    prefix = "inputs" if kind == "input" else "outputs"
    breaks: list[Break] = []
    new_by_name = {f.name: f for f in new.fields}
    old_names = {f.name for f in old.fields}
    for old_field in old.fields:
        path = f"{prefix}.{old_field.name}"
        new_field = new_by_name.get(old_field.name)
        if new_field is None:
            if kind == "output":
                breaks.append(Break(path, "field_removed",
                                    f"{'required' if old_field.required else 'optional'} output field removed"))
            elif new.unknown_fields == "reject":
                breaks.append(Break(path, "field_removed",
                                    f"{'required' if old_field.required else 'optional'} field removed; requests "
                                    "that still send it are rejected (unknown_fields: reject)"))
            continue
        breaks.extend(_field_breaks(old_field, new_field, kind, path))
    for new_field in new.fields:
        if new_field.name in old_names:
            continue
        if kind == "input" and new_field.required:
            breaks.append(Break(f"{prefix}.{new_field.name}", "required_added", "new required field"))
    if kind == "input" and new.unknown_fields == "reject" and old.unknown_fields != "reject":
        breaks.append(Break(prefix, "unknown_fields_rejected",
                            f"unknown_fields {old.unknown_fields} -> reject: requests with undeclared fields are rejected"))
    return breaks


def check_spec_compatibility(old: ModelService, new: ModelService) -> list[Break]:
    """Input and output breaks of a new version of the same model."""
    return check_compatibility(old.input_schema, new.input_schema, "input") + check_compatibility(
        old.output_schema, new.output_schema, "output"
    )
