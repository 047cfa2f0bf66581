"""End-to-end latency of the SIE scorer with a time split, next to its floor and its peers, on one private broker.

At each controlled rate (default 200/s, 2,000/s and half of the scorer's max throughput), in the same run:

* ``sie``      the scorer with pipelined commits (``sie score --pipelined``) and adaptive batches, traced:
               every committed batch's ``BatchTimes`` split each request's latency into
               queue / prepare / wait / produce / commit / visible (``common.latency_split``);
* ``serial``   the same scorer with ``pipelined=False`` (one batch at a time: ``sie score``'s default), traced;
* ``null``     the transactional byte copy with the scorer's client settings and batching: the floor of
               an exactly-once Python pipeline on this machine (no parsing, validation or inference);
* ``quix``     Quix Streams, ``processing_guarantee="exactly-once"``, commit_interval 5 s (its default);
* ``quixt``    the same with the commit interval tuned for latency (``--quix-commit-interval``).

End-to-end = the request record's timestamp (set when the request is handed to the client) -> the result
visible to a separate read_committed reader process.  "half" needs the scorer's max: a backlog run of the
real CLI (``python -m sie score``) first, unless ``--max-rate`` is given; next to it, the null copy's backlog
run on the same requests gives the throughput ratio SIE / null (``--no-null-backlog`` skips it).

Usage::

    python bench/bench_latency.py [--seconds 10] [--rates 200,2000,half] [--contestants sie,serial,null,quix,quixt]
                                  [--max-rate 36000] [--quix-python PATH] [--no-write]

Writes bench/results/latency.txt and latency.json, with the load average the run saw (the machine is
shared: compare contestants of the same run, as ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/common.py: the harness bench_scoring.py shares)

RESULTS = common.RESULTS_DIR
CONTESTANTS = {
    # key: (label, role, cfg extras)
    "sie": ("SIE (pipelined, adaptive)", "sie_traced", {"pipelined": True}),
    "serial": ("SIE serial", "sie_traced", {"pipelined": False}),
    "linger": ("SIE (pipelined, 3 ms linger)", "sie_traced", {"pipelined": True, "max_wait_ms": 3}),
    "null": ("null EOS copy (floor)", "null", {}),
    "quix": ("Quix EOS, commit 5s", "quix", {"commit_interval": common.QUIX_DEFAULT_COMMIT_S}),
    "quixt": ("Quix EOS, tuned", "quix", {}),
}


def main() -> int:
    common.exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each controlled-rate run")
    ap.add_argument("--jit-warmup-max-s", type=float, default=240.0,
                    help="warm the broker (null pipeline at 1,000/s) until its JIT compiler threads use < 5%% of "
                         "a core, at most this long")
    ap.add_argument("--warmup-seconds", type=float, default=2.0, help="left out of the steady-state figures")
    ap.add_argument("--rates", default="200,2000,half", help="comma list of requests/s; 'half' = half of max")
    ap.add_argument("--max-rate", type=float, default=None,
                    help="the scorer's max throughput for 'half' (default: measured by a backlog run first)")
    ap.add_argument("--max-requests", type=int, default=50_000, help="requests of the backlog run measuring max")
    ap.add_argument("--no-null-backlog", dest="null_backlog", action="store_false",
                    help="skip the null EOS copy's backlog run next to the scorer's (the throughput ratio)")
    ap.add_argument("--contestants", default="sie,serial,null,quix,quixt", help=f"comma list of {','.join(CONTESTANTS)}")
    ap.add_argument("--quix-python", default=None, help="python of the Quix Streams virtualenv (bench_scoring.py)")
    ap.add_argument("--quix-commit-interval", default=str(common.QUIX_TUNED_COMMIT_S),
                    help="commit_interval (s) of the tuned Quix contestant; a comma list runs one per value (a sweep)")
    ap.add_argument("--keep-logs", default=None, help="copy the contestants' logs and traces to this folder")
    ap.add_argument("--no-write", action="store_true", help="don't write bench/results/latency.*")
    args = ap.parse_args()
    args.latency_warmup_seconds = args.warmup_seconds  # what common.Bench.run_latency reads
    chosen = [c.strip() for c in args.contestants.split(",") if c.strip()]
    unknown = set(chosen) - set(CONTESTANTS)
    if unknown:
        ap.error(f"--contestants: unknown {sorted(unknown)} (choose from {', '.join(CONTESTANTS)})")

    started, load_start = time.time(), os.getloadavg()
    quix_python = common.find_quix_python(args.quix_python) if {"quix", "quixt"} & set(chosen) else None
    records = common.make_requests(max(args.max_requests, 10_000))
    bench = common.Bench(args)
    phases: dict[str, common.Phase] = {}
    max_rate = args.max_rate
    try:
        bench.start_broker()

        def setup(key: str) -> tuple[dict[str, str], Path, str]:
            topics = bench.topics_for(key)
            return topics, bench.spec_for(key, topics), f"bench.{bench.run_id}.{key}"

        topics, spec, group = setup("warmup")
        common.log("warmup: null pipeline on 10,000 requests (not reported)")
        bench.run_backlog(common.Phase("warmup", "warmup", 1, 10_000),
                          [common.role_cmd("null", {"bootstrap": bench.bootstrap, "spec_file": str(spec), "instance": "w"})],
                          group, topics, records[:10_000], None)
        # and at a controlled rate, until the broker's JIT compiler threads are quiet: a fresh broker compiles
        # its hot paths for a minute or more, and on 2 cores that takes half a core from every contestant
        # (the first latency runs after a start were 2x slower); a production broker is long past that
        args.jit_share = warm_broker(bench, setup, records, args.jit_warmup_max_s)
        rates: list[tuple[str, float]] = []
        for item in (r.strip() for r in args.rates.split(",") if r.strip()):
            if item == "half":
                if max_rate is None:
                    topics, spec, group = setup("max")
                    common.log(f"max throughput: SIE scorer (python -m sie score) on {args.max_requests:,} requests")
                    ph = bench.run_backlog(common.Phase("max", "SIE scorer backlog", 1, args.max_requests),
                                           [common.score_cmd(spec, "bench-max")], group, topics,
                                           records[: args.max_requests], None)
                    phases["max"] = ph
                    max_rate = ph.rate
                    if args.null_backlog:  # the throughput target: the scorer vs the null copy, same run
                        topics, spec, group = setup("max_null")
                        common.log(f"max throughput: null EOS copy on {args.max_requests:,} requests")
                        phases["max_null"] = bench.run_backlog(
                            common.Phase("max_null", "null EOS copy backlog", 1, args.max_requests),
                            [common.role_cmd("null", {"bootstrap": bench.bootstrap, "spec_file": str(spec),
                                                  "instance": "bench-max-null"})],
                            group, topics, records[: args.max_requests], None)
                rates.append(("half", max_rate / 2))
            else:
                rates.append((item, float(item)))
        intervals = [float(v) for v in args.quix_commit_interval.split(",") if v.strip()]
        runs = [(name, {"commit_interval": v} if name == "quixt" else {})
                for name in chosen for v in (intervals if name == "quixt" else [None])]
        for rate_key, rate in rates:
            for name, run_extra in runs:
                label, role, extra = CONTESTANTS[name]
                extra = {**extra, **run_extra}
                key = f"{name}_{rate_key}"
                while key in phases:  # the same contestant twice in --contestants: a repeat (noise check)
                    key = f"{name}{len(key)}_{rate_key}"
                python = quix_python if role == "quix" else None
                if role == "quix" and python is None:
                    phases[key] = common.Phase(key, f"{label} @ {rate:,.0f}/s", 1, 0, error=f"not measured: {common.QUIX_MISSING}")
                    continue
                topics, spec, group = setup(key)
                cfg: dict[str, Any] = {"bootstrap": bench.bootstrap, "spec_file": str(spec), "instance": f"bench-{key}",
                                       **extra}
                trace = None
                if role == "sie_traced":
                    trace = bench.tmp / f"{key}.trace.json"
                    cfg["trace"] = str(trace)
                if role == "quix":
                    cfg["state_dir"] = str(bench.tmp / f"{key}-state")
                    label = f"Quix EOS, commit {cfg['commit_interval']:g}s"
                ph = common.Phase(key, f"{label} @ {rate:,.0f}/s", 1, 0,
                              settings={"rate_key": rate_key, "rate": rate, "contestant": name, **extra})
                phases[key] = ph
                common.log(f"phase {ph.label}: {args.seconds:.0f}s")
                try:
                    bench.run_latency(ph, common.role_cmd(role, cfg, python), group, topics, records, rate, args.seconds,
                                      trace=trace)
                except Exception as exc:  # noqa: BLE001 - reported in the table, never hidden
                    ph.error = f"failed: {exc}"
                    common.log(f"  {ph.label}: {ph.error}")
    finally:
        bench.close()

    text, js = report(phases, args, started, load_start, max_rate)
    print()
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "latency.txt").write_text(text + "\n")
        (RESULTS / "latency.json").write_text(json.dumps(js, indent=2) + "\n")
        common.log(f"wrote {RESULTS / 'latency.txt'} and latency.json")
    return 0


#: the broker counts as warm once its JIT compiler threads use less than this share of one core
JIT_QUIET_SHARE = 0.05
WARM_RATE, WARM_ROUND_S = 1000.0, 10.0


def warm_broker(bench: common.Bench, setup: Any, records: list[tuple[bytes, bytes]], max_s: float) -> float:
    """Null-pipeline rounds at ``WARM_RATE`` until the broker's JIT is quiet or ``max_s`` passed; returns the
    compiler threads' share of a core in the last round (reported with the results: > 5 % = still compiling)."""
    deadline = time.monotonic() + max_s
    share, round_no = 1.0, 0
    while True:
        topics, spec, group = setup(f"warmup_rate{round_no}")
        jit0, t0 = common.jit_cpu_seconds(bench.broker_pid), time.monotonic()
        bench.run_latency(common.Phase(f"warmup_rate{round_no}", "warmup", 1, 0),
                          common.role_cmd("null", {"bootstrap": bench.bootstrap, "spec_file": str(spec),
                                               "instance": f"w{round_no}"}),
                          group, topics, records, WARM_RATE, WARM_ROUND_S)
        share = (common.jit_cpu_seconds(bench.broker_pid) - jit0) / (time.monotonic() - t0)
        common.log(f"warmup round {round_no}: the broker's JIT compiler threads used {share:.0%} of a core")
        round_no += 1
        if share < JIT_QUIET_SHARE:
            return share
        if time.monotonic() >= deadline:
            common.log(f"warmup: the broker's JIT still uses {share:.0%} of a core after {max_s:.0f}s; measuring anyway "
                   "(reported in the header)")
            return share


def report(phases: dict[str, common.Phase], args: argparse.Namespace, started: float,
           load_start: tuple[float, float, float], max_rate: float | None) -> tuple[str, dict[str, Any]]:
    load_end = os.getloadavg()
    lines = [
        f"# End-to-end latency with a time split (bench/bench_latency.py, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC, commit {common.git_commit()})",
        f"# {os.cpu_count()} cores, python {platform.python_version()}, one private broker on the same machine; "
        f"{args.seconds:g}s per run, first {args.warmup_seconds:g}s left out; {common.load_line(load_start, load_end)}",
        f"# broker warmed up until its JIT compiler threads used {getattr(args, 'jit_share', 1.0):.0%} of a core "
        f"(target < {JIT_QUIET_SHARE:.0%}: a fresh broker compiles its hot paths for a minute or more)",
        "# end-to-end = request timestamp -> result visible to a read_committed reader; split (SIE only, from its "
        "per-batch timings): broker (request acknowledged) -> queue -> prepare -> wait (previous commit) -> produce -> "
        "commit -> visible",
        "# load = the machine's 1-minute load average at each run's start -> end (2 cores; broker, contestant, load "
        "generator and reader add ~2-7 themselves)",
    ]
    if max_rate:
        backlog = phases.get("max")
        lines.append(f"# SIE scorer max throughput (backlog): {max_rate:,.0f} requests/s -> half = {max_rate / 2:,.0f}/s"
                     + (f" (load {_load(backlog)})" if backlog and backlog.load_avg else ""))
        null = phases.get("max_null")
        if null and null.rate and backlog:
            lines.append(f"# null EOS copy max throughput (backlog, same run): {null.rate:,.0f} requests/s (load "
                         f"{_load(null)}) -> SIE / null = {max_rate / null.rate:.2f}x (target >= 0.95x)")
    lines += ["", f"{'contestant @ rate':<44}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'results':>9}"
                  f"{'cpu %':>7}{'broker %':>9}{'load':>11}  note"]
    for ph in phases.values():
        if ph.key in ("max", "max_null"):
            continue
        L = ph.latency
        if not L:
            lines.append(f"{ph.label:<44}{'':>8}{'':>9}{'':>9}{'':>9}{ph.results:>9,}{'':>7}{'':>9}  "
                         f"{ph.error or 'no results'}")
            continue
        lines.append(f"{ph.label:<44}{L['achieved_rate']:>8,.0f}{L['steady_p50_ms']:>9.1f}{L['steady_p99_ms']:>9.1f}"
                     f"{L['steady_max_ms']:>9.1f}{ph.results:>9,}{ph.cpu_contestant_pct:>7.0f}{ph.cpu_broker_pct:>9.0f}"
                     f"{_load(ph):>11}  {ph.error}")
        if ph.split:
            lines.append("    " + common.split_line(ph.split))
    lines += ["", "ratios within each rate (p99 of the other / p99 of SIE; > 1 = SIE lower):"]
    for rate_key in dict.fromkeys(ph.settings.get("rate_key") for ph in phases.values() if ph.settings):
        base = phases.get(f"sie_{rate_key}")
        if not base or not base.latency:
            continue
        parts = [f"{name} {other.latency['steady_p99_ms'] / base.latency['steady_p99_ms']:.2f}x"
                 for name in CONTESTANTS if name != "sie"
                 for other in [phases.get(f"{name}_{rate_key}")] if other and other.latency]
        if parts:
            lines.append(f"  @ {rate_key}: " + ", ".join(parts))
    js = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "commit": common.git_commit(),
          "load_start": load_start, "load_end": load_end, "max_rate": max_rate,
          "phases": {k: asdict(v) for k, v in phases.items()}}
    return "\n".join(lines), js


def _load(ph: common.Phase) -> str:
    """The 1-minute load average at the run's start -> end (the machine is shared)."""
    return "->".join(f"{v:.1f}" for v in ph.load_avg)


if __name__ == "__main__":
    sys.exit(main())
