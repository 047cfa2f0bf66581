"""The cost of serving a rollout's other version from a process of its own (``sie.workers.versions``) vs in the
scorer's own process, same run, same model, same batches.

For a python model (``churnpkg``, tests/support/user_models.py) and a TorchScript model, at batch sizes 1, 64 and 1,024:

A. in-process: the backend created and loaded in this process (what a replica's own version is), ``infer``;
B. companion: ``VersionHost`` (``python -m sie.workers.version_host``), the same backend in a child process,
   each batch sent and answered over two pipes (orjson lines).

Reported per batch size: p50 / p99 of one call in ms, B - A per call and per record, and B/A; the companion's
start -> ready time (imports + load + readiness inference) and its resident memory.  No broker is needed.

Usage: ``python bench/bench_versions.py [--calls 300]``; writes bench/results/versions.txt (with the load
average before and after: 2 cores shared with whatever else runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sie.schemas.module_bundle import build_bundle  # noqa: E402
from sie.schemas.spec import ModelService, load  # noqa: E402
from sie.workers.backends import backend_config_from_spec, create_backend  # noqa: E402
from sie.workers.versions import VersionHost  # noqa: E402
from tests.support.user_models import python_project, torchscript_project  # noqa: E402

RESULT = ROOT / "bench" / "results" / "versions.txt"
SIZES = (1, 64, 1024)


def _rows(n: int) -> list[dict[str, float]]:
    return [{"tenure": float(i % 500), "spend": float(i % 300), "tickets": 2.0} for i in range(n)]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def _timed(call: Any, rows: list[dict[str, float]], calls: int) -> list[float]:
    for _ in range(5):  # warm
        call(rows)
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        call(rows)
        out.append((time.perf_counter() - started) * 1000.0)
    return out


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _prepared(kind: str, root: Path) -> tuple[ModelService, Path]:
    """The spec as a worker gets it (a python package as a module archive), and its document on disk."""
    if kind == "python":
        path = python_project(root / "src", "1.0.0")
        spec = load(path)
        archive, _names = build_bundle(spec.backend, [path.parent], ["churnpkg"])
        bundle = root / "modules.zip"
        bundle.write_bytes(archive)
        doc = {**spec.to_document(), "source": None}
        doc["backend"] = {**doc["backend"], "modules_path": str(bundle)}
    else:
        spec = load(torchscript_project(root / "src", "1.0.0"))
        doc = spec.to_document()
    file = root / f"{kind}.json"
    file.write_text(json.dumps(doc))
    return ModelService.from_document(doc), file


def measure(kind: str, calls: int, root: Path) -> dict[str, Any]:
    from sie.kernel.settings import Settings
    from sie.schemas.spec_policy import SpecPolicy

    spec, file = _prepared(kind, root)
    policy = SpecPolicy.from_settings(Settings())
    own = create_backend(backend_config_from_spec(spec, policy))
    own.load()
    started = time.monotonic()
    host = VersionHost("1.0.0", file, f"bench {kind}", log_path=root / f"{kind}.log", call_timeout_s=60.0)
    host.start()
    while host.state == "loading":
        time.sleep(0.01)  # bench pacing while the child loads (not test synchronisation)
    if host.state != "ready":
        raise SystemExit(f"{kind}: companion did not load: {host.detail}")
    ready_s = time.monotonic() - started
    out: dict[str, Any] = {"ready_s": ready_s, "rss_mb": _rss_mb(host.pid or 0), "sizes": {}}
    try:
        for n in SIZES:
            rows = _rows(n)
            a = _timed(own.infer, rows, calls)
            b = _timed(host.infer, rows, calls)
            out["sizes"][n] = {"in_p50": statistics.median(a), "in_p99": _pct(a, 0.99),
                               "co_p50": statistics.median(b), "co_p99": _pct(b, 0.99)}
    finally:
        host.close()
        own.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    env = {"SIE_ALLOWED_MODULES": "churnpkg", "SIE_MODEL_ROOTS": ""}
    load_before = os.getloadavg()
    lines = [f"bench_versions.py --calls {args.calls}  ({time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
             f"{os.cpu_count()} cores, load {load_before[0]:.1f} before)", ""]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ.update({**env, "SIE_MODEL_ROOTS": str(root)})
        for kind in ("python", "torchscript"):
            r = measure(kind, args.calls, root / kind)
            lines.append(f"{kind}: companion start -> ready {r['ready_s']:.2f} s, resident {r['rss_mb']:.0f} MiB")
            lines.append("  batch   in-process p50/p99 ms   companion p50/p99 ms   extra per call (p50)   per record   "
                         "ratio p50")
            for n, s in r["sizes"].items():
                extra = s["co_p50"] - s["in_p50"]
                lines.append(f"  {n:>5}   {s['in_p50']:8.3f} / {s['in_p99']:7.3f}     {s['co_p50']:8.3f} / "
                             f"{s['co_p99']:7.3f}     {extra:8.3f} ms            {extra * 1000 / n:7.1f} us   "
                             f"{s['co_p50'] / s['in_p50']:6.2f}x")
            lines.append("")
    lines.append(f"load average after: {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULT.write_text(text)


if __name__ == "__main__":
    main()
