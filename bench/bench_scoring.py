"""SIE's exactly-once scorer against its baselines, on one private broker, one model, the same requests.

Contestants (each reads the same request records from a fresh 6-partition topic and
writes one result per request; a separate ``read_committed`` reader process times
the results as they become visible):

* (b) ``null``   transactional consume -> produce copying bytes with the scorer's own
                 librdkafka settings, batch size and one transaction per batch
                 (``send_offsets_to_transaction``): no parsing, validation or inference.
                 The practical ceiling of any exactly-once Python pipeline here.
* (a) ``sie``    the real scorer: ``python -m sie score -f <spec>`` (1 and 2 processes
                 in one group), default batching.
* (c) ``naive``  poll one message, json.loads, infer one row, produce, flush, commit
                 synchronously: what people write first. Slow: measured on a subset.
* (d) ``faust``  a faust-streaming agent iterating the stream (json, validate,
                 infer one row per event, send), default at_least_once. Subset.
* (e) ``quix``   a Quix Streams application, ``processing_guarantee="exactly-once"``
                 (json, validate, infer one row per message, to_topic) at its default
                 commit interval (5 s) and (e') tuned for latency; its own virtualenv
                 (``bench/setup_quix_venv.sh``: quixstreams pins confluent-kafka < 2.13). Subset.
* latency        at 200/s, 2,000/s and half of (a)'s measured throughput, same run: the
                 SIE scorer (traced: a per-request time split, see ``latency_split``)
                 and Quix EOS at both commit intervals; end-to-end latency = request
                 record timestamp -> result visible to the read_committed reader.

Throughput of a backlog run: the contestant is started on an empty topic and waited
for until its consumer group is stable with every partition assigned (so start-up and
the first rebalance are not measured), then all requests are produced at once; the
rate is results/s between the first and the last result the reader sees.

Usage: ``python bench/bench_scoring.py [--requests 100000] [--quick] [--only sie,null,quix,latency]``;
writes bench/results/scoring.txt and scoring.json (``--no-write`` for a dry run).
A contestant's own process is started as ``python bench/bench_scoring.py _role NAME JSON``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import (  # bench/common.py: the harness bench_latency.py shares
    PARTITIONS,
    QUIX_DEFAULT_COMMIT_S,
    QUIX_MISSING,
    QUIX_TUNED_COMMIT_S,
    RESULTS_DIR,
    SCORER_ENTRY,
    SCORER_EXTRA,
    Bench,
    Phase,
    exit_on_sigterm,
    find_quix_python,
    git_commit,
    load_line,
    log,
    make_requests,
    role_cmd,
    score_cmd,
    scorer_settings,
    split_line,
)

TARGETS = {"vs_null": 0.95, "vs_naive": 10.0, "vs_faust": 3.0,
           # steady-state p99 of the SIE scorer per controlled rate (issue 15)
           "p99_ms": {"200": 25.0, "2000": 50.0, "half": 50.0}}


# =============================================================================================
# Contestant processes (``_role``): null pipeline, naive consumer, faust agent
# =============================================================================================
def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _load_spec(cfg: dict) -> Any:
    from sie.schemas.spec import load

    return load(cfg["spec_file"])


def _load_backend(spec: Any) -> Any:
    from sie.workers.backends import backend_config_from_spec, create_backend

    backend = create_backend(backend_config_from_spec(spec))
    backend.load()
    return backend


def role_null(cfg: dict) -> None:
    """(b) Exactly-once byte copy with the scorer's own client settings and batch size."""
    from confluent_kafka import Consumer, Producer

    from sie.kernel.settings import Settings
    from sie.streams.scorer import ScorerConfig

    spec = _load_spec(cfg)
    sc = ScorerConfig(settings=Settings(bootstrap_servers=cfg["bootstrap"]), spec=spec, instance=cfg["instance"])
    stop = _stop_event()
    producer = Producer({**sc.producer_config(), **cfg.get("producer_extra", {})})
    producer.init_transactions(30)
    consumer = Consumer(sc.consumer_config())
    consumer.subscribe([spec.topics.requests])
    results, wait_s, n_max = spec.topics.results, sc.max_wait_ms / 1000, sc.max_batch
    while not stop.is_set():
        # the scorer's batcher: wait for one record, then take what is already fetched (max_wait 0, adaptive)
        # or fill until full / max_wait after it
        msgs = consumer.consume(1, 0.1)
        if not msgs:
            continue
        msgs += consumer.consume(n_max - 1, wait_s)
        producer.begin_transaction()
        for m in msgs:
            if m.error() is None:
                producer.produce(results, m.value(), m.key(), m.partition())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    consumer.close()
    producer.flush(5)


def role_naive(cfg: dict) -> None:
    """(c) Per message: poll, json.loads, infer one row, produce, flush, synchronous commit."""
    from confluent_kafka import Consumer, Producer

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    stop = _stop_event()
    consumer = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": spec.group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": cfg["bootstrap"]})
    consumer.subscribe([spec.topics.requests])
    results = spec.topics.results
    while not stop.is_set():
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            continue
        request = json.loads(msg.value())
        outputs = backend.infer([request["inputs"]])[0]
        producer.produce(results, json.dumps({"id": request["id"], "status": "ok", "outputs": outputs}).encode(),
                         msg.key())
        producer.flush()
        consumer.commit(message=msg, asynchronous=False)
    consumer.close()


def role_faust(cfg: dict) -> None:
    """(d) A faust-streaming agent iterating the stream: json, validate, infer one row, send."""
    import faust
    from faust.worker import Worker

    from sie.schemas.validation import compile_validator

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    validate = compile_validator(spec.input_schema)
    app = faust.App(spec.group_id, broker=f"kafka://{cfg['bootstrap']}", web_enabled=False,
                    datadir=cfg["datadir"], topic_partitions=PARTITIONS, consumer_auto_offset_reset="earliest",
                    key_serializer="raw", value_serializer="json")
    requests = app.topic(spec.topics.requests, key_type=bytes, partitions=PARTITIONS)
    results = app.topic(spec.topics.results, key_type=bytes, partitions=PARTITIONS)

    @app.agent(requests)
    async def score(stream):  # noqa: ANN001 - faust's idiomatic agent
        async for key, request in stream.items():
            try:
                inputs = validate(request["inputs"])
            except Exception as exc:  # noqa: BLE001 - a real agent would dead-letter it
                await results.send(key=key, value={"id": request.get("id"), "status": "error", "error": str(exc)})
                continue
            outputs = backend.infer([inputs])[0]
            await results.send(key=key, value={"id": request["id"], "status": "ok", "outputs": outputs})

    Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def role_sie_traced(cfg: dict) -> None:
    """(a) the SIE scorer as ``sie score`` runs it (same ``run_scorer``, ``ScorerConfig`` defaults unless
    ``cfg`` overrides pipelined / max_wait_ms), recording every committed batch's offsets and
    ``BatchTimes`` in memory; written to ``cfg["trace"]`` (JSON) at exit, so tracing costs no I/O while
    measured.  The latency phases use it for the time split."""
    from sie.kernel.settings import Settings
    from sie.streams.scorer import ScorerConfig, run_scorer

    spec = _load_spec(cfg)
    stop = _stop_event()
    overrides = {k: cfg[k] for k in ("pipelined", "max_wait_ms", "max_batch") if k in cfg}
    config = ScorerConfig(settings=Settings(bootstrap_servers=cfg["bootstrap"]), spec=spec,
                          instance=cfg["instance"], **overrides)
    trace: list[list] = []

    def traced(scorer: Any) -> None:
        prepare, committed = scorer.prepare, scorer.committed

        def prepare_traced(batch: list) -> Any:
            prepared = prepare(batch)
            span: dict[int, list[int]] = {}
            for m in batch:
                lo_hi = span.setdefault(m.partition(), [m.offset(), m.offset()])
                lo_hi[1] = m.offset()
            prepared.value["_span"] = span
            return prepared

        def committed_traced(stats: dict, n: int) -> None:
            t = scorer._loop.eos.last_times
            trace.append([stats.pop("_span"), t.collected, t.prepared, t.begun, t.produced, t.committed])
            committed(stats, n)

        scorer.prepare, scorer.committed = prepare_traced, committed_traced

    run_scorer(config, _load_backend, stop, on_ready=traced)
    Path(cfg["trace"]).write_text(json.dumps(trace))


def role_quix(cfg: dict) -> None:
    """(e) a Quix Streams application, ``processing_guarantee="exactly-once"``: the same request JSON, the
    same compiled validator and model; Quix processes one message at a time (its API has no batch hook
    short of stateful per-key count windows), so inference is one row per request.  ``commit_interval``
    from ``cfg`` (Quix's default 5 s, or tuned).  Runs in its own virtualenv (``--quix-python``):
    quixstreams pins confluent-kafka < 2.13."""
    from quixstreams import Application

    from sie.schemas.validation import compile_validator

    spec = _load_spec(cfg)
    backend = _load_backend(spec)
    validate = compile_validator(spec.input_schema)
    app = Application(broker_address=cfg["bootstrap"], consumer_group=spec.group_id, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", commit_interval=cfg["commit_interval"],
                      state_dir=cfg["state_dir"], loglevel="WARNING", auto_create_topics=False,
                      use_changelog_topics=False)
    requests = app.topic(spec.topics.requests, key_deserializer="bytes", value_deserializer="json")
    results = app.topic(spec.topics.results, key_serializer="bytes", value_serializer="json")

    def score(request: dict) -> dict:
        try:
            inputs = validate(request["inputs"])
        except Exception as exc:  # noqa: BLE001 - a real app would dead-letter it
            return {"id": request.get("id"), "status": "error", "error": str(exc)}
        return {"id": request["id"], "status": "ok", "outputs": backend.infer([inputs])[0]}

    app.dataframe(requests).apply(score).to_topic(results)
    app.run()


ROLES = {"null": role_null, "naive": role_naive, "faust": role_faust, "sie_traced": role_sie_traced,
         "quix": role_quix}


def latency_rates(half: float, explicit: bool) -> list[tuple[str, float, str]]:
    """(key suffix, requests/s, label): light load, 2,000/s and half of the scorer's max throughput."""
    return [("200", 200.0, "200/s"), ("2000", 2000.0, "2,000/s"),
            ("half", half, "--latency-rate" if explicit else "half of (a)'s max")]


def run_latency_phases(bench: Bench, phases: dict[str, Phase], setup: Any, cfg: Any,
                       records: list[tuple[bytes, bytes]], args: argparse.Namespace, rate_key: str, rate: float,
                       rate_label: str, quix_python: str | None) -> None:
    """At one rate, same run: the SIE scorer (traced: time split), then Quix EOS at its default and tuned
    commit intervals (if its virtualenv exists)."""
    contestants: list[tuple[str, str, str, dict[str, Any], str | None]] = [
        (f"lat_sie_{rate_key}", f"SIE @ {rate_label}", "sie_traced", {}, None)]
    if quix_python is not None:
        contestants += [
            (f"lat_quix_{rate_key}", f"Quix EOS {QUIX_DEFAULT_COMMIT_S:g}s @ {rate_label}", "quix",
             {"commit_interval": QUIX_DEFAULT_COMMIT_S}, quix_python),
            (f"lat_quixt_{rate_key}", f"Quix EOS {args.quix_commit_interval:g}s @ {rate_label}", "quix",
             {"commit_interval": args.quix_commit_interval}, quix_python)]
    for key, label, role, extra, python in contestants:
        topics, spec, group = setup(key)
        trace = bench.tmp / f"{key}.trace.json" if role == "sie_traced" else None
        if trace is not None:
            extra = {**extra, "instance": f"bench-{key}", "trace": str(trace)}
        if role == "quix":
            extra = {**extra, "state_dir": str(bench.tmp / f"{key}-state")}
        log(f"phase {label}: {rate:,.0f} requests/s for {args.latency_seconds:.0f}s")
        ph = Phase(key, label, 1, 0, settings={"rate": rate, "rate_label": rate_label, "role": role, **extra})
        phases[key] = ph
        try:
            bench.run_latency(ph, role_cmd(role, cfg(spec, **extra), python), group, topics, records, rate,
                              args.latency_seconds, trace=trace)
        except Exception as exc:  # noqa: BLE001 - reported in the table, never hidden
            ph.error = f"failed: {exc}"
            log(f"  {label}: {ph.error}")


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000, help="requests per backlog run (default 100000)")
    ap.add_argument("--quick", action="store_true", help="20,000 requests and shorter subsets: a fast check")
    ap.add_argument("--naive-requests", type=int, default=5000, help="subset for the naive consumer")
    ap.add_argument("--naive-seconds", type=float, default=30.0, help="time cap for the naive consumer")
    ap.add_argument("--faust-requests", type=int, default=20_000, help="subset for the faust agent")
    ap.add_argument("--faust-seconds", type=float, default=60.0, help="time cap for the faust agent")
    ap.add_argument("--latency-seconds", type=float, default=20.0, help="length of the controlled-rate run")
    ap.add_argument("--latency-warmup-seconds", type=float, default=3.0,
                    help="requests sent in the first seconds of the controlled-rate run are left out of the "
                         "steady-state p50/p99 (the whole-run figures are reported too)")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="requests/s of the third controlled-rate run (default: half of (a)'s measured throughput)")
    ap.add_argument("--quix-python", default=None,
                    help="python of the Quix Streams virtualenv (default: $SIE_BENCH_QUIX_PYTHON, else "
                         "bench/.venv-quix made by bench/setup_quix_venv.sh)")
    ap.add_argument("--quix-requests", type=int, default=20_000, help="subset for the Quix backlog runs")
    ap.add_argument("--quix-seconds", type=float, default=60.0, help="time cap for the Quix backlog runs")
    ap.add_argument("--quix-commit-interval", type=float, default=QUIX_TUNED_COMMIT_S,
                    help="commit_interval (s) of the tuned Quix runs (its default is 5 s)")
    ap.add_argument("--only", default="",
                    help="comma list of phases: null,sie,sie_other,sie2,naive,faust,quix,latency (sie_other: the "
                         "commit mode sie score does not default to; not run unless named)")
    ap.add_argument("--profile-scorer", action="store_true",
                    help="run (a) under cProfile and print the top functions (slower; numbers not comparable)")
    ap.add_argument("--scorer-entry", default=None,
                    help="experiments: run the scorer as `python SCRIPT score ...` instead of `python -m sie score ...`")
    ap.add_argument("--scorer-args", default="",
                    help="experiments: extra `sie score` options for every scorer run, e.g. '--max-batch 1024'")
    ap.add_argument("--no-write", action="store_true", help="don't write bench/results/scoring.*")
    args = ap.parse_args()
    if args.scorer_entry:
        SCORER_ENTRY[:] = [str(Path(args.scorer_entry).resolve())]
    SCORER_EXTRA[:] = shlex.split(args.scorer_args)
    if args.quick:
        args.requests = min(args.requests, 20_000)
        args.naive_requests, args.naive_seconds = min(args.naive_requests, 2000), min(args.naive_seconds, 15.0)
        args.faust_requests, args.faust_seconds = min(args.faust_requests, 10_000), min(args.faust_seconds, 30.0)
        args.quix_requests, args.quix_seconds = min(args.quix_requests, 10_000), min(args.quix_seconds, 30.0)
        args.latency_seconds = min(args.latency_seconds, 10.0)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    wanted = lambda name: name in only if only or name == "sie_other" else True  # noqa: E731

    started = time.time()
    load_start = os.getloadavg()
    log(f"generating {args.requests:,} requests")
    records = make_requests(args.requests)
    bench = Bench(args)
    phases: dict[str, Phase] = {}
    try:
        bench.start_broker()

        def setup(key: str) -> tuple[dict[str, str], Path, str]:
            topics = bench.topics_for(key)
            spec = bench.spec_for(key, topics)
            return topics, spec, f"bench.{bench.run_id}.{key}"

        def guarded(ph: Phase, run: Any, prefix: str = "failed") -> None:
            """Run one phase; a phase that breaks is reported with its error, the others still run."""
            phases[ph.key] = ph
            try:
                run(ph)
            except Exception as exc:  # noqa: BLE001 - reported in the table, never hidden
                ph.error = f"{prefix}: {exc}"
                log(f"  {ph.label}: {ph.error}")

        def cfg(spec: Path, **extra: Any) -> dict:
            return {"bootstrap": bench.bootstrap, "spec_file": str(spec), **extra}

        # Warm the broker (JIT, page cache, coordinators) with a short null run; not reported.
        topics, spec, group = setup("warmup")
        log("phase warmup: null pipeline on 10,000 requests (not reported)")
        bench.run_backlog(Phase("warmup", "warmup", 1, 10_000), [role_cmd("null", cfg(spec, instance="w"))],
                          group, topics, records[:10_000], None)

        if wanted("null"):
            topics, spec, group = setup("null")
            log(f"phase (b) null pipeline: {len(records):,} requests")
            guarded(Phase("null", "(b) null pipeline", 1, len(records)), lambda ph: bench.run_backlog(
                ph, [role_cmd("null", cfg(spec, instance="null-0"))], group, topics, records, None))

        if wanted("null"):
            # The same with another retry backoff: AddOffsetsToTxn meets CONCURRENT_TRANSACTIONS while the
            # coordinator still writes markers (or this transaction's AddPartitions) and librdkafka retries after
            # retry.backoff.ms (1 in the scorer's config, 5 before). The faster of (b)/(b') is the ceiling.
            topics, spec, group = setup("null_tuned")
            log(f"phase (b') null pipeline, retry.backoff.ms=5: {len(records):,} requests")
            guarded(Phase("null_tuned", "(b') null, backoff 5ms", 1, len(records)), lambda ph: bench.run_backlog(
                ph, [role_cmd("null", cfg(spec, instance="null-1", producer_extra={"retry.backoff.ms": 5}))],
                group, topics, records, None))

        if wanted("sie"):
            topics, spec, group = setup("sie")
            prof = bench.tmp / "scorer.prof" if args.profile_scorer else None
            log(f"phase (a) SIE scorer, 1 process: {len(records):,} requests" + (" (under cProfile)" if prof else ""))
            guarded(Phase("sie", "(a) SIE scorer", 1, len(records), settings=scorer_settings()),
                    lambda ph: bench.run_backlog(ph, [score_cmd(spec, "bench-0", profile=prof)], group, topics,
                                                 records, None))
            if prof is not None and prof.exists():
                import pstats

                print("\n--- cProfile of the scorer (tottime) ---")
                pstats.Stats(str(prof)).sort_stats("tottime").print_stats(30)
                print("--- (cumulative) ---")
                pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(40)

        if wanted("sie_other"):  # the commit mode sie score does not default to, same run: the default's evidence
            other = not scorer_settings()["pipelined"]
            mode = "pipelined" if other else "serial"
            topics, spec, group = setup("sie_other")
            log(f"phase (a') SIE scorer, {mode} commits: {len(records):,} requests")
            guarded(Phase("sie_other", f"(a') SIE scorer, {mode}", 1, len(records),
                          settings={**scorer_settings(), "pipelined": other}),
                    lambda ph: bench.run_backlog(ph, [score_cmd(spec, "bench-o", flags=(f"--{mode}",))], group,
                                                 topics, records, None))

        if wanted("sie2"):
            topics, spec, group = setup("sie2")
            log(f"phase (a2) SIE scorer, 2 processes in one group: {len(records):,} requests")
            guarded(Phase("sie2", "(a2) SIE scorer x2", 2, len(records), settings=scorer_settings()),
                    lambda ph: bench.run_backlog(ph, [score_cmd(spec, "bench-0"), score_cmd(spec, "bench-1")],
                                                 group, topics, records, None))

        def subset_run(key: str, label: str, role: str, n: int, cap_s: float, prefix: str, **extra: Any) -> None:
            topics, spec, group = setup(key)
            subset = records[: min(n, len(records))]
            log(f"phase {label}: first {len(subset):,} requests, cap {cap_s:.0f}s after the first result")

            def run(ph: Phase) -> None:
                python = extra.pop("python", None)
                bench.run_backlog(ph, [role_cmd(role, cfg(spec, **extra), python)], group, topics, subset, cap_s)
                if role == "quix" and ph.drain_s > 0:
                    # Quix makes results visible only at its commits (every commit_interval): with a 5 s interval
                    # a whole subset can appear at once, so results/s between visible results means nothing;
                    # its rate is results / (first request produced -> last result visible)
                    ph.rate = ph.rate_first_to_last = ph.results / ph.drain_s
                ph.subset_note = f"subset: {ph.results:,} of the first {len(subset):,} requests {ph.subset_note}"

            guarded(Phase(key, label, 1, len(subset)), run, prefix)

        if wanted("naive"):
            subset_run("naive", "(c) naive consumer", "naive", args.naive_requests, args.naive_seconds, "failed")
        if wanted("faust"):
            subset_run("faust", "(d) faust agent", "faust", args.faust_requests, args.faust_seconds,
                       "not measurable", datadir=str(bench.tmp / "faust-data"))

        quix_python = find_quix_python(args.quix_python)
        if wanted("quix") and quix_python is None:
            for key, label in (("quix", "(e) Quix EOS"), ("quix_tuned", "(e') Quix EOS tuned")):
                phases[key] = Phase(key, label, 1, 0, error=f"not measured: {QUIX_MISSING}")
        elif wanted("quix"):
            for key, label, interval in (("quix", "(e) Quix EOS", QUIX_DEFAULT_COMMIT_S),
                                         ("quix_tuned", "(e') Quix EOS", args.quix_commit_interval)):
                subset_run(key, f"{label} {interval:g}s", "quix", args.quix_requests, args.quix_seconds, "failed",
                           python=quix_python, commit_interval=interval, state_dir=str(bench.tmp / f"{key}-state"))

        if wanted("latency"):
            base = phases.get("sie")
            max_rate = base.rate if base and base.rate else 0.0
            half = args.latency_rate or (max_rate / 2 if max_rate else 2000.0)
            for rate_key, rate, rate_label in latency_rates(half, bool(args.latency_rate)):
                run_latency_phases(bench, phases, setup, cfg, records, args, rate_key, rate, rate_label,
                                   quix_python if wanted("quix") else None)
    finally:
        bench.close()

    report = build_report(phases, args, started, load_start)
    print()
    print(report["text"])
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "scoring.txt").write_text(report["text"] + "\n")
        (RESULTS_DIR / "scoring.json").write_text(json.dumps(report["json"], indent=2) + "\n")
        log(f"wrote {RESULTS_DIR / 'scoring.txt'} and scoring.json")
    return 0


# =============================================================================================
# Report
# =============================================================================================
def build_report(phases: dict[str, Phase], args: argparse.Namespace, started: float,
                 load_start: tuple[float, float, float]) -> dict[str, Any]:
    sie = phases.get("sie")
    a = sie.rate if sie else 0.0

    def ratio(other: str) -> float | None:
        ph = phases.get(other)
        return (a / ph.rate) if (a and ph and ph.rate) else None

    nulls = [phases[k] for k in ("null", "null_tuned") if k in phases and phases[k].rate]
    best_null = max(nulls, key=lambda ph: ph.rate) if nulls else None

    commit = git_commit()
    lines = [
        f"# Scoring throughput and latency (bench/bench_scoring.py, {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC)",
        f"# {os.cpu_count()} cores, python {platform.python_version()}, one private Kafka broker on the same machine; "
        f"model examples/fraud-scorer.yaml (TorchScript MLP, CPU, 1 torch thread); topics with {PARTITIONS} partitions; commit {commit}",
        "# backlog runs: contestant ready (group stable, all partitions assigned), then all requests produced at once",
        "# (in 'prod s'); results/s = results seen by a read_committed reader (own process) per second from the moment",
        "# the last request was acknowledged to the last result (the backlog drain); 'f->l/s' = over first -> last result;",
        "# drain = first request produced -> last result seen. cpu/broker = % of one core during the run.",
        "",
        f"{'contestant':<24}{'procs':>6}{'requests':>10}{'results':>9}{'results/s':>11}{'f->l/s':>9}{'prod s':>8}"
        f"{'drain s':>9}{'cpu %':>7}{'broker %':>9}  note",
    ]
    for key in ("null", "null_tuned", "sie", "sie_other", "sie2", "naive", "faust", "quix", "quix_tuned"):
        ph = phases.get(key)
        if ph is None:
            continue
        note = ph.error or ph.subset_note
        if ph.expired:
            note = f"{note}; {ph.expired} EXPIRED results".strip("; ")
        lines.append(f"{ph.label:<24}{ph.processes:>6}{ph.offered:>10,}{ph.results:>9,}{ph.rate:>11,.0f}"
                     f"{ph.rate_first_to_last:>9,.0f}{ph.burst_s:>8.1f}{ph.drain_s:>9.1f}{ph.cpu_contestant_pct:>7.0f}"
                     f"{ph.cpu_broker_pct:>9.0f}  {note}")
    lat_phases = [ph for k, ph in phases.items() if k.startswith("lat_")]
    if lat_phases:
        lines += ["", "controlled rate, same run; end-to-end = request record timestamp (set when handed to the client, "
                      "linger.ms 1) -> result visible to a read_committed reader; steady state = after a "
                      f"{args.latency_warmup_seconds:g}s warm-up:",
                  f"  {'contestant @ rate':<36}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
                  f"{'results':>9}{'cpu %':>7}{'broker %':>9}  note"]
    for lat in lat_phases:
        L = lat.latency
        if not L:
            lines.append(f"  {lat.label:<36}{'':>8}{'':>9}{'':>9}{'':>9}{lat.results:>9,}{'':>16}  "
                         f"{lat.error or 'no results'}")
            continue
        lines.append(f"  {lat.label:<36}{L['achieved_rate']:>8,.0f}{L['steady_p50_ms']:>9.1f}{L['steady_p99_ms']:>9.1f}"
                     f"{L['steady_max_ms']:>9.1f}{lat.results:>9,}{lat.cpu_contestant_pct:>7.0f}{lat.cpu_broker_pct:>9.0f}"
                     f"  {lat.error}")
        if lat.split:
            lines.append("      " + split_line(lat.split))
        if lat.latency_timeline:
            lines.append("      p99 ms per second of the run: " + " ".join(f"{row[3]:.0f}" for row in lat.latency_timeline))

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, goal: float, fmt: str, higher_better: bool = True) -> None:
        if value is None:
            targets.append({"target": name, "value": None, "goal": goal, "met": None})
            lines.append(f"  {name:<52} {'n/a':>10}   goal {fmt.format(goal)}  NOT MEASURED")
            return
        met = value >= goal if higher_better else value <= goal
        targets.append({"target": name, "value": value, "goal": goal, "met": met})
        lines.append(f"  {name:<52} {fmt.format(value):>10}   goal {('>= ' if higher_better else '<= ') + fmt.format(goal)}"
                     f"  {'met' if met else 'MISSED'}")

    lines += ["", "targets:"]
    target(f"(a) / {best_null.label if best_null else '(b) null pipeline'} (faster null)",
           ratio(best_null.key) if best_null else None, TARGETS["vs_null"], "{:.2f}x")
    target("(a) / (c) naive consumer", ratio("naive"), TARGETS["vs_naive"], "{:.1f}x")
    target("(a) / (d) faust agent", ratio("faust"), TARGETS["vs_faust"], "{:.1f}x")
    for rate_key, goal in TARGETS["p99_ms"].items():
        ph = phases.get(f"lat_sie_{rate_key}")
        label = ph.settings.get("rate_label", rate_key) if ph else rate_key
        target(f"SIE p99 @ {label} (ms)", ph.latency.get("steady_p99_ms") if ph and ph.latency else None, goal,
               "{:.1f}", higher_better=False)
    comparisons = []
    for key in ("quix", "quix_tuned"):
        q = phases.get(key)
        if sie and q and q.rate and sie.rate:
            comparisons.append(f"  throughput (a) / {q.label}: {sie.rate / q.rate:.1f}x")
    for rate_key in TARGETS["p99_ms"]:
        s_ph = phases.get(f"lat_sie_{rate_key}")
        for qkey in ("lat_quix_", "lat_quixt_"):
            q_ph = phases.get(qkey + rate_key)
            if s_ph and q_ph and s_ph.latency and q_ph.latency:
                comparisons.append(f"  p99 {q_ph.label} / SIE: {q_ph.latency['steady_p99_ms'] / s_ph.latency['steady_p99_ms']:.1f}x "
                                   f"(p50 {q_ph.latency['steady_p50_ms'] / s_ph.latency['steady_p50_ms']:.1f}x)")
    if comparisons:
        lines += ["", "SIE vs Quix Streams EOS (same run; > 1 = SIE better):", *comparisons]
    other = phases.get("sie_other")
    if sie and other and sie.rate and other.rate:
        lines.append(f"  {other.label} / (a) SIE scorer (default): {other.rate / sie.rate:.2f}x (same run)")
    sie2 = phases.get("sie2")
    if sie and sie2 and sie.rate and sie2.rate:
        lines.append(f"  2 scorer processes / 1: {sie2.rate / sie.rate:.2f}x (no target; {os.cpu_count()} cores "
                     f"shared by broker, scorers and reader)")
    if sie:
        lines += ["", "scorer settings (sie score defaults): "
                  + ", ".join(f"{k}={v}" for k, v in sie.settings.items())]
    if SCORER_EXTRA or SCORER_ENTRY != ["-m", "sie"]:
        lines.append(f"NOT THE DEFAULT SCORER: entry {' '.join(SCORER_ENTRY)}, extra args {' '.join(SCORER_EXTRA)!r}")
    lines += ["", "baselines: (b) the scorer's own librdkafka settings and batching (max_batch, max_wait_ms above), one transaction per batch, "
                  "bytes copied; (b') the same with producer retry.backoff.ms=5 instead of 1; (c) json + 1-row infer + produce + flush + commit(sync) per message, no validation; "
                  "(d) faust-streaming agent, json serializer, validate + 1-row infer + send per event, at_least_once; "
                  "(e) Quix Streams Application, processing_guarantee exactly-once, json, validate + 1-row infer per message, "
                  "to_topic; commit_interval 5 s (its default) and tuned (e'), in its own virtualenv (confluent-kafka < 2.13)"]
    load_end = os.getloadavg()
    lines.append(f"{load_line(load_start, load_end)}; "
                 f"total time {time.time() - started:.0f}s; requests per backlog run {args.requests:,}")
    js = {"commit": commit, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "cores": os.cpu_count(),
          "python": platform.python_version(), "partitions": PARTITIONS, "requests": args.requests,
          "load_start": load_start, "load_end": load_end, "phases": {k: asdict(v) for k, v in phases.items()},
          "targets": targets}
    return {"text": "\n".join(lines), "json": js}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "_role":
        ROLES[sys.argv[2]](json.loads(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
