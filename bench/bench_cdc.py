"""CDC conversion throughput (pure CPU, no Kafka): rows/s from source record bytes
to request key/value bytes through ``CdcConverter.convert``.

The issue requires CDC conversion to run at >= 2x the scorer's rate (the scorer
does roughly 10-50k records/s), so the target here is >= 100k rows/s on one core.
Usage: ``python bench/bench_cdc.py [--seconds 3]``; writes bench/results/cdc_convert.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sie.connectors.cdc import CdcConverter, parse_connector_spec  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "cdc"
FIELD_TYPES = {"amount": "float", "customer_id": "int", "currency": "string", "is_first_order": "bool",
               "created_at_ms": "int"}
MAPPING = {"amount": "amount", "customer_id": "customer_id", "currency": "currency",
           "is_first_order": "is_first_order", "created_at_ms": "created_at"}


def _fixture(name: str) -> tuple[bytes | None, dict]:
    (rec,) = [r for r in json.loads((FIXTURES / name).read_text()) if r["value"] is not None][:1]
    key = None if rec["key"] is None else json.dumps(rec["key"]).encode()
    return key, rec["value"]


def _variants(fmt: str, name: str, n: int, rows_per_message: int = 1) -> list[tuple[bytes | None, bytes]]:
    """n distinct messages (different pks/amounts) so caches see realistic traffic."""
    key, doc = _fixture(name)
    out = []
    for i in range(n):
        d = json.loads(json.dumps(doc))
        if fmt == "canal-json":
            base = d["data"][0]
            d["data"] = [dict(base, id=str(20000 + i * rows_per_message + j), amount=f"{(i + j) % 997}.25")
                         for j in range(rows_per_message)]
            d["es"] += i * 1000
        else:
            d["payload"]["after"]["id"] = 20000 + i
            d["payload"]["source"]["pos"] += i
            key = json.dumps({"schema": json.loads(key)["schema"], "payload": {"id": 20000 + i}}).encode()
        out.append((key, json.dumps(d).encode()))
    return out


def _run(fmt: str, messages: list, seconds: float) -> tuple[float, float, int]:
    spec = parse_connector_spec({"name": "bench", "format": fmt, "source_topic": "src", "model": "fraud-scorer",
                                 "tables": ["shop.*"], "mapping": MAPPING})
    conv = CdcConverter(spec, FIELD_TYPES)
    for k, v in messages[:100]:  # warm caches
        conv.convert(k, v)
    rows = msgs = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for k, v in messages:
            out = conv.convert(k, v)
            rows += len(out.requests)
        msgs += len(messages)
    elapsed = time.perf_counter() - start
    assert conv.stats().get("records_failed", 0) == 0, conv.stats()
    size = sum(len(v) for _, v in messages) / len(messages)
    return rows / elapsed, msgs / elapsed, int(size)


def _json_floor(messages: list, seconds: float) -> float:
    """Messages/s of bare orjson.loads + dumps on the same bytes: the machine's
    ceiling for any JSON->JSON conversion, so results on a busy/slow machine can
    be read as a ratio."""
    import orjson

    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _, v in messages:
            orjson.dumps(orjson.loads(v))
        n += len(messages)
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measuring time per case (default 3)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cdc_convert.txt"))
    args = ap.parse_args()
    cases = [
        ("canal-json single-row", "canal-json", _variants("canal-json", "canal_insert.json", 2000)),
        ("canal-json 10-row stmt", "canal-json", _variants("canal-json", "canal_insert.json", 400, 10)),
        ("debezium-json +schema", "debezium-json", _variants("debezium-json", "debezium_schema_update.json", 2000)),
    ]
    lines = [
        f"# CDC conversion throughput (bench/bench_cdc.py, {args.seconds:.0f} s per case, 1 core, "
        f"python {platform.python_version()}, {platform.machine()})",
        f"{'case':<24} {'rows/s':>10} {'msgs/s':>10} {'bytes/msg':>10} {'json floor msgs/s':>18} {'% of floor':>10}",
    ]
    for label, fmt, messages in cases:
        rows_s, msgs_s, size = _run(fmt, messages, args.seconds)
        floor = _json_floor(messages, min(1.0, args.seconds))
        lines.append(
            f"{label:<24} {rows_s:>10,.0f} {msgs_s:>10,.0f} {size:>10} {floor:>18,.0f} {100 * msgs_s / floor:>9.0f}%"
        )
    lines.append("target: >= 100,000 rows/s (2x the scorer's upper 50k records/s); "
                 f"load average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
