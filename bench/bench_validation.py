"""Records/s of the compiled input validator vs a pydantic model built from the same schema.

The scorer validates every request on the hot path; this shows what the
precompiled per-field checks (schemas/validation.py) buy over the obvious
alternative, a ``pydantic.create_model`` per schema with strict types.
jsonschema is compared too when installed (it is not a dependency).

Run: ``python bench/bench_validation.py [--records N]``; writes bench/results/validation.txt.
Inputs are JSON-decoded dicts (what the scorer has after orjson.loads), 10 %
of them invalid, so the error path is measured too.  Keep it under ~20 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model  # noqa: E402

from sie.schemas.spec import FieldSpec, IOSchema  # noqa: E402
from sie.schemas.validation import SchemaViolation, compile_validator  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "validation.txt"

SCHEMA = IOSchema(fields=(
    FieldSpec(name="amount", type="float", range=(0, 1_000_000)),
    FieldSpec(name="merchant_risk", type="float", range=(0, 1)),
    FieldSpec(name="hour", type="int", range=(0, 23)),
    FieldSpec(name="country", type="string", max_length=2),
    FieldSpec(name="is_new_device", type="bool"),
    FieldSpec(name="card_age_days", type="int", range=(0, 100_000), required=False),
    FieldSpec(name="note", type="string", max_length=200, required=False, nullable=True),
    FieldSpec(name="velocity_1h", type="float", range=(0, 10_000)),
))


def make_records(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r: dict[str, Any] = {
            "amount": round(rng.uniform(1, 5000), 2), "merchant_risk": rng.random(), "hour": rng.randrange(24),
            "country": rng.choice(["DE", "FR", "US", "GB"]), "is_new_device": rng.random() < 0.1,
            "velocity_1h": rng.randrange(20),
        }
        if i % 3 == 0:
            r["card_age_days"] = rng.randrange(3000)
        if i % 5 == 0:
            r["note"] = None
        if i % 10 == 9:  # 10 % invalid, each a different way
            r[["amount", "hour", "country", "is_new_device"][i // 10 % 4]] = ["abc", True, "DEU", 1][i // 10 % 4]
        out.append(r)
    return out


def pydantic_model(io: IOSchema) -> type[BaseModel]:
    """The naive alternative: a strict pydantic model with the same constraints."""
    fields: dict[str, Any] = {}
    for f in io.fields:
        py: Any = {"string": str, "int": int, "float": float, "bool": bool}[f.type]
        kw: dict[str, Any] = {}
        if f.range is not None:
            kw.update(ge=f.range[0], le=f.range[1])
        if f.max_length is not None:
            kw["max_length"] = f.max_length
        if f.type == "float":
            kw["allow_inf_nan"] = False
        if f.nullable:
            py = py | None
        fields[f.name] = (py, Field(... if f.required else None, **kw))
    extra: Literal["forbid", "ignore"] = "forbid" if io.unknown_fields == "reject" else "ignore"
    # strict: no str->int coercion, bool is not an int; ints into floats are still allowed in strict mode
    return create_model("Inputs", __config__=ConfigDict(strict=True, extra=extra), **fields)


def one_pass(fn: Callable[[dict], Any], errors: tuple[type[Exception], ...], records: list[dict]) -> tuple[float, int]:
    """Records/s of one pass over ``records`` and the number rejected."""
    rejected = 0
    start = time.perf_counter()
    for r in records:
        try:
            fn(r)
        except errors:
            rejected += 1
    return len(records) / (time.perf_counter() - start), rejected


def measure(contenders: list, workloads: dict[str, list[dict]], budget_s: float) -> dict[tuple[str, str], tuple[float, int]]:
    """Best-of-passes records/s per (contender, workload).

    Passes are interleaved round-robin so load from other processes on a
    shared machine hits every contender alike; the best pass is the least
    disturbed one.
    """
    best: dict[tuple[str, str], tuple[float, int]] = {}
    deadline = time.perf_counter() + budget_s * len(contenders)
    rounds = 0
    while rounds < 2 or time.perf_counter() < deadline:
        for name, fn, errors in contenders:
            if rounds >= 2 and name.startswith("jsonschema"):
                continue  # ~100x slower: two passes are plenty and keep the bench short
            for wname, records in workloads.items():
                rate, rejected = one_pass(fn, errors, records)
                key = (name, wname)
                if key not in best or rate > best[key][0]:
                    best[key] = (rate, rejected)
        rounds += 1
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per contender")
    args = parser.parse_args()
    records = make_records(args.records)

    compiled = compile_validator(SCHEMA)
    model = pydantic_model(SCHEMA)
    contenders: list[tuple[str, Callable[[dict], Any], tuple[type[Exception], ...]]] = [
        ("compiled (sie.schemas.validation)", compiled, (SchemaViolation,)),
        ("pydantic create_model, strict", model.model_validate, (ValidationError,)),
    ]
    try:
        import jsonschema  # type: ignore[import-not-found]

        from sie.schemas.request import io_json_schema

        validator = jsonschema.Draft202012Validator(io_json_schema(SCHEMA))
        contenders.append(("jsonschema Draft2020-12", validator.validate, (jsonschema.ValidationError,)))
    except ImportError:
        pass

    valid = [r for i, r in enumerate(records) if i % 10 != 9]
    workloads = {"mixed": records, "valid": valid}
    best = measure(contenders, workloads, args.seconds)
    base = {w: best[(contenders[0][0], w)][0] for w in workloads}
    lines = [
        f"bench_validation: {len(SCHEMA.fields)}-field schema, {len(records)} JSON-decoded records "
        f"(mixed: 10% invalid; valid: the other 90%), best of interleaved passes, ~{args.seconds:g}s per contender",
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus (shared machine)",
        "",
        f"{'validator':32} {'mixed rec/s':>12} {'vs compiled':>11} {'valid rec/s':>12} {'vs compiled':>11} {'rejected':>9}",
    ]
    rejected_counts = set()
    for name, _, _ in contenders:
        (m_rate, m_rej), (v_rate, _) = best[(name, "mixed")], best[(name, "valid")]
        rejected_counts.add(m_rej)
        lines.append(f"{name:32} {m_rate:12,.0f} {m_rate / base['mixed']:10.2f}x {v_rate:12,.0f} "
                     f"{v_rate / base['valid']:10.2f}x {m_rej:9d}")
    if not any(c[0].startswith("jsonschema") for c in contenders):
        lines.append("jsonschema: not installed, skipped")
    if len(rejected_counts) != 1:
        lines.append("WARNING: contenders disagree on the number of invalid records")
    text = "\n".join(lines)
    print(text)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text + "\n", encoding="utf-8")
    return 0 if len(rejected_counts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
