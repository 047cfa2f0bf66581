"""Density of multi-model worker processes (issue 16): memory per hosted model, time to READY, throughput.

    python bench/bench_density.py                        # the full run (load average < 4 only)
    python bench/bench_density.py --reduced              # 1/10/50 models, smaller loads (a loaded machine)

Against the broker in SIE_BOOTSTRAP_SERVERS (default 127.0.0.1:9092).  What it measures, all in one run:

1. resident memory (VmRSS from /proc/<pid>/status) of ONE ``python -m sie.workers.multimodel`` process hosting
   1, 10, 50, 100 copies of the demo fraud model (examples/fraud-scorer.yaml: TorchScript, ~1k
   parameters, each copy its own topics, consumer group, transactional producer, loaded module);
2. the same of 1..3 dedicated ``sie score`` processes (one model each), extrapolated to N models by
   multiplying (measured for up to 3 only: 100 dedicated processes do not fit this machine);
3. time to READY of a model added to the warm process (desired-models file written -> lane READY, i.e.
   loaded, readiness inference passed, producer initialised, consumer subscribed; the model's topics exist);
4. throughput draining the same mixed backlog (models with 4:2:1:1 shares of the requests) on one shared
   process vs as many dedicated processes, as a ratio (the machine has 2 cores: 4 models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import yaml  # noqa: E402

from sie.kernel.admin import delete_topics, ensure_model_topics  # noqa: E402
from sie.kernel.settings import Settings  # noqa: E402
from sie.schemas.spec import load  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402
from tests.support.multimodel_fixtures import SharedHostProcess  # noqa: E402
from tests.support.scorer_fixtures import CommittedReader, ScorerProcess, produce_requests  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PARTITIONS = 2  # per model topic: 100 models = 600 partitions on the broker


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for {pid}")


def fraud_doc(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "fraud-scorer.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["name"] = name
    doc["spec"]["priorityLevel"] = "P2"
    return doc


def fraud_spec(name: str) -> Any:
    return load(fraud_doc(name), base_dir=EXAMPLES)


#: every topic this run created: deleted at the end (100 models are 600 partitions on a shared broker)
CREATED: list[str] = []


def make_topics(settings: Settings, specs: list[Any]) -> None:
    topics = [t for s in specs for t in (s.topics.requests, s.topics.results, s.topics.dead_letters)]
    CREATED.extend(topics)
    for i in range(0, len(topics), 150):
        ensure_model_topics(settings, topics[i:i + 150], PARTITIONS)


def fraud_requests(n: int, prefix: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 101}".encode(), orjson.dumps({"id": f"{prefix}{i}", "inputs": {
        "amount": float(10 + i % 5000), "merchant_risk": (i % 100) / 100.0, "hour": i % 24,
        "account_age_days": i % 3000, "is_foreign": bool(i % 2), "tx_count_24h": i % 50}})) for i in range(n)]


def summary(health: dict[str, Any]) -> str:
    """States, errors and refusals of a host's health (a failure message)."""
    states: dict[str, int] = {}
    errors = set()
    for lane in health.get("lanes", {}).values():
        states[lane["state"]] = states.get(lane["state"], 0) + 1
        if lane["last_error"]:
            errors.add(lane["last_error"][:200])
    return (f"states {states}, errors {sorted(errors)[:5]}, topics_error {health.get('topics_error')}, "
            f"refused {list(health.get('refused', {}))[:5]}")


def settle_rss(pid: int, seconds: float = 3.0) -> float:
    """RSS after the process has been idle a moment (librdkafka buffers and the allocator settle)."""
    time.sleep(seconds)  # measuring a steady state, not synchronising
    return rss_mb(pid)


# --- 1 + 3: one shared process --------------------------------------------------------------------------------
def shared_memory(settings: Settings, work: Path, counts: list[int], run: str, adds: int) -> dict[str, Any]:
    top = max(counts)
    specs = [fraud_spec(f"dens-{run}-{i}") for i in range(top + adds)]
    make_topics(settings, specs)
    env = {"SIE_REQUEST_PARTITIONS": str(PARTITIONS), "SIE_SHARED_PROCESS_THREADS": "2"}
    host = SharedHostProcess(work / "shared", settings.bootstrap_servers, env=env)
    out: dict[str, Any] = {"rss": {}, "ready_s": [], "ready_wall_s": []}
    try:
        wait_until(lambda: host.health().get("pid") == host.proc.pid, 60, interval=0.1, message="the host's health")
        out["rss"][0] = settle_rss(host.proc.pid, 1.0)
        for count in counts:
            models = [(f"{s.name}-0", s) for s in specs[:count]]
            host.set_models(models)
            wait_until(lambda: host.ready([rid for rid, _ in models]), 60 + 2.0 * count, interval=0.25,
                       message=lambda: f"{count} lanes READY: {summary(host.health())}\n{host.output()[-3000:]}")
            out["rss"][count] = settle_rss(host.proc.pid)
            print(f"shared process, {count:3d} models: RSS {out['rss'][count]:.0f} MB", flush=True)
        # time to READY of a model added to the warm process
        models = [(f"{s.name}-0", s) for s in specs[:top]]
        for extra in specs[top:top + adds]:
            models.append((f"{extra.name}-0", extra))
            started = time.monotonic()
            host.set_models(models)
            wait_until(lambda: host.ready([f"{extra.name}-0"]), 60, interval=0.02, message="the added lane READY")
            out["ready_wall_s"].append(time.monotonic() - started)
            out["ready_s"].append(host.health()["lanes"][f"{extra.name}-0"]["ready_s"])
        print(f"added to a warm process: READY in {statistics.median(out['ready_s']):.3f} s (lane), "
              f"{statistics.median(out['ready_wall_s']):.3f} s (file written -> health says READY)", flush=True)
    finally:
        host.ensure_dead()
    return out


# --- 2: dedicated processes ----------------------------------------------------------------------------------
def write_spec(directory: Path, name: str) -> Path:
    doc = fraud_doc(name)
    doc["spec"]["backend"]["artifact"] = str(EXAMPLES / "models/fraud/fraud_scorer.pt")
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def dedicated_memory(settings: Settings, work: Path, n: int, run: str) -> list[float]:
    procs = []
    try:
        for i in range(n):
            name = f"dens-{run}-solo-{i}"
            make_topics(settings, [fraud_spec(name)])
            procs.append(ScorerProcess(write_spec(work, name), settings.bootstrap_servers, f"solo{i}", work,
                                       "--max-batch", "256", "--max-wait-ms", "0", "--partitions", str(PARTITIONS)))
        wait_until(lambda: all(p.ready() for p in procs), 120, interval=0.25, message="dedicated scorers READY")
        time.sleep(3.0)  # steady state, as for the shared process
        values = [rss_mb(p.proc.pid) for p in procs]
        print(f"dedicated processes: RSS {', '.join(f'{v:.0f}' for v in values)} MB", flush=True)
        return values
    finally:
        for p in procs:
            p.ensure_dead()


# --- 4: throughput -------------------------------------------------------------------------------------------
SHARES = (4, 2, 1, 1)


def backlog(settings: Settings, specs: list[Any], total: int, prefix: str) -> int:
    """The mixed load (shares 4:2:1:1) produced before the scorers start; returns how many requests."""
    weights = [SHARES[i % len(SHARES)] for i in range(len(specs))]
    for spec, w in zip(specs, weights):
        produce_requests(settings, spec.topics.requests, fraud_requests(total * w // sum(weights), f"{prefix}-"))
    return sum(total * w // sum(weights) for w in weights)


def drain(settings: Settings, specs: list[Any], expected: int, ready: Any) -> tuple[float, int]:
    """Once every scorer is READY: results per second until the backlog is committed (what was committed
    before that moment is not counted), and how many results that was."""
    readers = [CommittedReader(settings, s.topics.results) for s in specs]
    try:
        wait_until(ready, 120, interval=0.05, message="scorers READY")
        started, done0 = time.monotonic(), sum(r.count() for r in readers)
        wait_until(lambda: sum(r.count() for r in readers) >= expected, 600, interval=0.05,
                   message=lambda: f"{expected} results ({sum(len(r.records) for r in readers)})")
        elapsed = time.monotonic() - started
        return (expected - done0) / elapsed, done0
    finally:
        for r in readers:
            r.close()


def throughput(settings: Settings, work: Path, models: int, total: int, run: str) -> dict[str, Any]:
    shared_specs = [fraud_spec(f"dens-{run}-tp-s{i}") for i in range(models)]
    solo_specs = [fraud_spec(f"dens-{run}-tp-d{i}") for i in range(models)]
    make_topics(settings, shared_specs + solo_specs)
    out: dict[str, Any] = {"requests": backlog(settings, shared_specs, total, "s")}
    backlog(settings, solo_specs, total, "d")
    env = {"SIE_REQUEST_PARTITIONS": str(PARTITIONS), "SIE_SHARED_PROCESS_THREADS": "2"}
    host = SharedHostProcess(work / "tp-shared", settings.bootstrap_servers, env=env)
    try:
        host.set_models([(f"{s.name}-0", s) for s in shared_specs])
        out["shared_rps"], out["shared_early"] = drain(settings, shared_specs, out["requests"],
                                                       lambda: host.ready([f"{s.name}-0" for s in shared_specs]))
    finally:
        host.ensure_dead()
    procs = []
    try:
        for i, spec in enumerate(solo_specs):
            procs.append(ScorerProcess(write_spec(work, spec.name), settings.bootstrap_servers, f"tp{i}", work,
                                       "--max-batch", "256", "--max-wait-ms", "0", "--partitions", str(PARTITIONS)))
        out["dedicated_rps"], out["dedicated_early"] = drain(settings, solo_specs, out["requests"],
                                                             lambda: all(p.ready() for p in procs))
    finally:
        for p in procs:
            p.ensure_dead()
    print(f"throughput, {models} models, {out['requests']} requests: shared {out['shared_rps']:.0f}/s, "
          f"dedicated {out['dedicated_rps']:.0f}/s", flush=True)
    return out


def cleanup(settings: Settings) -> None:
    for i in range(0, len(CREATED), 150):
        try:
            delete_topics(settings, CREATED[i:i + 150])
        except Exception as exc:  # a broker gone meanwhile: say so, the numbers are still printed
            print(f"topics not deleted: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="1/10/50 models, 2 dedicated, 16000 requests")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/density.txt")
    parser.add_argument("--only-throughput", action="store_true", help="part 4 alone (printed, not written)")
    args = parser.parse_args()
    settings = Settings()
    counts = [1, 10, 50] if args.reduced else [1, 10, 50, 100]
    singles, total, tp_models, adds = (2, 16000, 4, 3) if args.reduced else (3, 40000, 4, 5)
    load_before = os.getloadavg()
    run = uuid.uuid4().hex[:6]
    if args.only_throughput:
        try:
            with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
                throughput(settings, Path(tmp), tp_models, total, run)
        finally:
            cleanup(settings)
        print(f"load average before {load_before}, after {os.getloadavg()}")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
            work = Path(tmp)
            shared = shared_memory(settings, work, counts, run, adds)
            solo = dedicated_memory(settings, work, singles, run)
            tp = throughput(settings, work, tp_models, total, run)
    finally:
        cleanup(settings)
    load_after = os.getloadavg()
    rss = shared["rss"]
    solo_med = statistics.median(solo)
    lines = [
        f"# bench_density: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs (shared), "
        f"broker {settings.bootstrap_servers}{'  [REDUCED run]' if args.reduced else ''}",
        f"# load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)}",
        f"# model: examples/fraud-scorer.yaml (TorchScript, 6 inputs, ~1k parameters), {PARTITIONS} partitions per "
        f"topic, SIE_SHARED_PROCESS_THREADS=2; every model has its own topics, group, producer and loaded module",
        "",
        "## resident memory (VmRSS, /proc/<pid>/status, 3 s after every lane was READY)",
        "",
        "| models | one shared process | per model above 1 | N dedicated `sie score` (N x median measured) |",
        "|-------:|-------------------:|------------------:|-----------------------------------------------:|",
        f"| 0 | {rss[0]:.0f} MB | - | - |",
    ]
    for count in counts:
        per = f"{(rss[count] - rss[1]) / (count - 1):.1f} MB" if count > 1 else "-"
        lines.append(f"| {count} | {rss[count]:.0f} MB | {per} | {count * solo_med:.0f} MB |")
    lines += [
        "",
        f"dedicated `sie score` processes measured: {len(solo)} ({', '.join(f'{v:.0f}' for v in solo)} MB); "
        f"the N-process column multiplies their median: 100 of them were not started on this 2-core machine.",
        "",
        "## time to READY of a model added to the warm process",
        "",
        f"lane start -> READY (load + readiness inference + init_transactions + subscribe): median "
        f"{statistics.median(shared['ready_s']):.3f} s, runs {', '.join(f'{x:.3f}' for x in shared['ready_s'])}",
        f"desired-models file written -> health.json says READY (0.2 s reconcile tick, 0.02 s polling): median "
        f"{statistics.median(shared['ready_wall_s']):.3f} s",
        "",
        f"## throughput: {tp_models} models, a backlog of {tp['requests']} requests in shares 4:2:1:1",
        "",
        "Produced before the scorers start; measured from the moment every scorer is READY to the last result",
        "committed (results committed before that moment are not counted), same backlog for both layouts.",
        "",
        "| layout | results/s | results committed before every scorer was READY (not counted) |",
        "|--------|----------:|-------------------------------------------------------------:|",
        f"| one shared process ({tp_models} lanes) | {tp['shared_rps']:.0f} | {tp['shared_early']} |",
        f"| {tp_models} dedicated `sie score` processes | {tp['dedicated_rps']:.0f} | {tp['dedicated_early']} |",
        "",
        f"ratio shared / dedicated (results/s): {tp['shared_rps'] / tp['dedicated_rps']:.2f}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
