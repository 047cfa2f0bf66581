"""A rollout on a real broker: its timeline, the stable version's p99 during it vs before (same run), and
the time from a failing gate to 0 % canary.

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_rollout.py [--interval 5] [--rate 300]
        [--before 20] [--tick 1.0]
    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_rollout.py --handover [--rate 300]
        (planned handovers on sie control + 2 agents: bench/rollout_handover.py)

One in-process scorer (the echo model, 4 partitions) that follows the rollouts topic, requests at a steady
``--rate`` (keys repeat: stickiness), and the leader's ``RolloutDriver`` ticked every ``--tick`` seconds
(the control plane's default reconcile interval is 1 s), publishing through a fenced transactional
producer exactly as ``sie control`` does.

1. **Complete**: ``--before`` seconds of load on 1.0.0 alone, then a rollout to 1.1.0 with the default
   steps (10/20/50/100 %) and default gates but ``intervalSeconds`` = ``--interval`` (the default 20 s x 4
   steps is 80 s of waiting per run; the step length changes how long the timeline is, not what happens
   in it) and ``p99MaxMs`` 5000 (it defaults to the echo spec's SLA, 100 ms, which a shared 2-core
   machine's p99 crosses by itself; the relative p99 gate stays at its default).  Reported: the timeline (each transition, seconds from the start), and the stable version's
   p99 (queue + inference time, what the gates judge) over the rollout vs over the ``--before`` window.
2. **Rollback**: the same with a canary that dead-letters 1 row in 20 (``echo_canary``).  Reported: when
   the first canary step began, when the gate failed (the RollingBack event), the first answer scored
   under the rollback's weight epoch (the scorer applied 0 %) and the last answer by the canary (record
   timestamps, read_committed): the time from a failing gate to 0 %.

Each run ends with the exactly-once proof of the tests (every request one answer).  Results:
bench/results/rollout.txt, with the load average at start and end (2 shared cores).

``gates`` (issue 22: calibrated gates; ``gates_main``), results in bench/results/rollout_gates.txt::

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_rollout.py gates [--models 4] [--identical 20]
        [--slow 20] [--errors 20] [--rate 300] [--interval 5] [--raw answers.json]

``--models`` models roll out concurrently on one broker, each with its own ``sie score`` process (4
partitions, the real CLI) under ``--rate`` requests/s, the stable version ``paced`` (20 ms per model call).
Each model runs one rollout after another to a new canary version, with the default steps and the default
gates (no ``rollout.gates`` block; ``p99MaxMs`` is the spec's SLA, ``--sla-ms``), ``intervalSeconds``
``--interval``: identical code, a canary 3x slower per call (``paced_3x``), one failing 5 % of rows
(``paced_errors``).  Reported: how many completed / rolled back, the time from the canary's first step to
the failing gate, the step lengths, which gate decided, what the old single-ratio gate would have said on
the same windows, the load average during the run, and the exactly-once proof per model.

``campaign`` (issue 34's proof: good rollouts with a worker SIGKILL at 10 % and a leader SIGKILL at 50 %, bad
canaries that must roll back; every committed answer checked against its epoch's weight; sie control + 2 agents,
bench/rollout_campaign.py), results in bench/results/rollout_campaign.txt::

    python bench/bench_rollout.py campaign [--good 5] [--bad 5] [--rate 100] [--interval 10] [--budget-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from sie.control.rollout.driver import KafkaVersionWindows, RolloutDriver  # noqa: E402
from sie.control.rollout.machine import Phase  # noqa: E402
from sie.kernel.admin import ensure_topics  # noqa: E402
from sie.kernel.settings import Settings  # noqa: E402
from sie.kernel.topics import system_topics  # noqa: E402
from sie.schemas.spec import load  # noqa: E402
from sie.streams.scorer import ScorerConfig  # noqa: E402
from sie.streams.scorer.rollout import EPOCH_HEADER, run_rollout_scorer  # noqa: E402
from tests.control.rollout.test_rollout_kafka import Load, Publisher  # noqa: E402
from tests.support.scorer_fixtures import echo_version_spec, load_echo_backend, prove_exactly_once, topics_for  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.txt"


def p99(values: list[float]) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else None


def run(settings: Settings, canary_callable: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"br-{uuid.uuid4().hex[:8]}"
    stable = echo_version_spec(name, "1.0.0")
    # default steps and gates, but intervalSeconds shortened and the absolute p99 gate loosened: it defaults to
    # the echo spec's SLA (100 ms), which this shared machine's p99 itself crosses (the relative gate stays)
    canary = echo_version_spec(name, "1.1.0", canary_callable,
                               {"intervalSeconds": args.interval, "gates": {"p99MaxMs": 5000}})
    topics_for(settings, stable, partitions=4)
    stop, ready = threading.Event(), threading.Event()
    config = ScorerConfig(settings=settings, spec=stable, instance="br-0", max_wait_ms=10, session_timeout_ms=6000)
    scorer = threading.Thread(target=run_rollout_scorer, args=(config, load_echo_backend, stop),
                              kwargs={"on_ready": lambda _s: ready.set()}, daemon=True)
    scorer.start()
    publisher = Publisher(settings)
    windows = KafkaVersionWindows(settings, stable)
    load = None
    try:
        if not ready.wait(60):
            raise SystemExit("scorer not ready within 60 s")
        load = Load(settings, stable.topics.requests, rate=args.rate)
        t_load = time.time()
        time.sleep(args.before)  # the "before" window: steady load on the stable version alone
        driver = RolloutDriver(windows)
        entry, records = driver.begin(stable, canary)
        publisher.publish(records)
        driver.commit(entry)
        t0 = time.time()
        while not driver.get(name).rollout.terminal:
            if time.time() - t0 > 300:
                raise SystemExit(f"rollout not finished in 300 s: {driver.get(name).rollout.label}")
            driver.run_once(publisher)
            time.sleep(args.tick)  # the leader's tick
        t_end = time.time()
        time.sleep(2.0)  # a little traffic at the final weight
        ids = load.stop()
        load = None
        results, dead = prove_exactly_once(settings, stable, ids, timeout=90)
    finally:
        if load is not None:
            load.stop()
        stop.set()
        scorer.join(30)
        windows.close()
        publisher.close()
    rollout = driver.get(name).rollout
    rows = []  # (record ts s, version, latency ms or None)
    for m in results:
        doc = orjson.loads(m.value())
        t = doc.get("timings") or {}
        rows.append((m.timestamp()[1] / 1000.0, doc["version"],
                     float(t.get("queue_ms", 0.0)) + float(t.get("inference_ms", 0.0)) if doc.get("status") == "ok"
                     else None))
    for m in dead:
        rows.append((m.timestamp()[1] / 1000.0, dict(m.headers() or [])["sie.version"].decode(), None))
    # the first answer scored under the rollout's last weight epoch (after a rollback: canary 0 %)
    last_epoch = str(rollout.epoch).encode()
    first_final = min((m.timestamp()[1] / 1000.0 for m in results
                       if dict(m.headers() or []).get(EPOCH_HEADER) == last_epoch), default=None)
    before = [lat for ts, v, lat in rows if v == "1.0.0" and lat is not None and t_load + 2 <= ts < t0]
    during = [lat for ts, v, lat in rows if v == "1.0.0" and lat is not None and t0 <= ts < t_end]
    canary_last = max((ts for ts, v, _ in rows if v == "1.1.0"), default=None)
    return {"rollout": rollout, "t0_ms": t0 * 1000, "before": before, "during": during, "canary_last": canary_last,
            "first_final": first_final,
            "answers": len(results) + len(dead), "requests": len(ids), "dead": len(dead)}


def timeline(run_: dict[str, Any]) -> list[str]:
    """Each transition of the run's rollout, seconds from its start."""
    return [f"  +{(e.at_ms - run_['t0_ms']) / 1000:6.1f} s  {e.source} -> {e.target}  canary {e.weight_bp / 100:g}%  "
            f"({e.reason[:110]})" for e in run_["rollout"].events]


def main() -> int:
    if sys.argv[1:2] == ["gates"]:
        return gates_main(sys.argv[2:])
    if sys.argv[1:2] == ["campaign"]:
        from bench.rollout_campaign import main as campaign_main

        return campaign_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="intervalSeconds of each canary step")
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second")
    parser.add_argument("--before", type=float, default=20.0, help="seconds of load before the rollout")
    parser.add_argument("--tick", type=float, default=1.0, help="the leader's tick (s)")
    parser.add_argument("--handover", action="store_true",
                        help="instead: planned handovers on sie control + 2 sie agent processes (the longest gap in "
                             "results during a rollout, a rollback, a version change, a scale-down; "
                             "bench/rollout_handover.py) -> bench/results/rollout_handover.txt")
    parser.add_argument("--steady", type=float, default=10.0, help="--handover: seconds of the steady window")
    args = parser.parse_args()
    if args.handover:
        from bench.rollout_handover import report

        text = report(args, Settings())
        print(text)
        (RESULTS.parent / "rollout_handover.txt").write_text(text, encoding="utf-8")
        return 0
    settings = Settings().with_overrides(topic_prefix=f"brl{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, [t for t in system_topics(settings.topic_prefix)
                             if t.name.rsplit(".", 1)[-1] in ("rollouts", "events", "specs")])
    load_start = os.getloadavg()[0]
    lines = [f"bench_rollout ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
             f"load average at start {load_start:.1f}{' (above 4: shared machine, read ratios only)' if load_start > 4 else ''})",
             f"one in-process scorer (echo model, 4 partitions), {args.rate:g} requests/s, leader tick {args.tick:g} s, "
             f"default steps 10/20/50/100 and gates except p99MaxMs 5000 (the echo SLA's 100 ms is below this machine's "
             f"p99), intervalSeconds {args.interval:g} (default 20: shortened)",
             "the scorer runs outside agents, so Surging ends on the in-process load (no agent replica plan: "
             "the readiness gate on a new-version replica is tested in tests/control/placement/test_rollout_capacity "
             "and tests/test_rollout_e2e.py)"]

    ok = run(settings, "echo", args)
    r = ok["rollout"]
    lines.append(f"\n1. a rollout that completes: {r.label}")
    lines += timeline(ok)
    b, d = p99(ok["before"]), p99(ok["during"])
    if b and d:
        lines.append(f"  stable 1.0.0 p99 (queue + inference): before {b:.1f} ms (n={len(ok['before'])}), during the "
                     f"rollout {d:.1f} ms (n={len(ok['during'])}): ratio {d / b:.2f}")
    lines.append(f"  exactly once: {ok['answers']} answers for {ok['requests']} requests, {ok['dead']} dead letters")

    bad = run(settings, "echo_canary", args)
    r = bad["rollout"]
    lines.append(f"\n2. a canary that dead-letters 5%: {r.label}")
    lines += timeline(bad)
    first = next((e for e in r.events if e.target is Phase.CANARY), None)
    failed = next((e for e in r.events if e.target is Phase.ROLLING_BACK), None)
    if first and failed:
        lines.append(f"  canary serving -> gate failed: {(failed.at_ms - first.at_ms) / 1000:.1f} s "
                     f"(minSamples 100 at {first.weight_bp / 100:g}% of {args.rate:g}/s, judged every tick)")
        if bad["first_final"] is not None:
            lines.append(f"  gate failed -> first answer under the 0% epoch (the scorer applied it): "
                         f"{bad['first_final'] - failed.at_ms / 1000:.2f} s")
        if bad["canary_last"] is not None:
            lines.append(f"  gate failed -> last answer by the canary (record timestamps; negative: none was "
                         f"produced after the failing tick): {bad['canary_last'] - failed.at_ms / 1000:+.2f} s")
    lines.append(f"  exactly once: {bad['answers']} answers for {bad['requests']} requests, {bad['dead']} dead letters")
    lines.append(f"\nload average at end {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.write_text(text, encoding="utf-8")
    return 0



# --- calibrated gates (issue 22): many rollouts of identical code and of worse canaries, default gates ------------

GATES_RESULTS = RESULTS.parent / "rollout_gates.txt"
#: canary kind -> the callable its version runs (the stable version runs ``paced``: 20 ms per model call)
CANARIES = {"identical": "paced", "slow3x": "paced_3x", "errors5": "paced_errors"}


class _Router:
    """The driver's ``Windows`` over one ``KafkaVersionWindows`` per model (as the control service's ModelWindows)."""

    def __init__(self) -> None:
        self.by_model: dict[str, KafkaVersionWindows] = {}

    def window(self, model: str, version: str, since_ms: int) -> Any:
        return self.by_model[model].window(model, version, since_ms)


def legacy_fails(canary: Any, stable: Any, sla_ms: float) -> str | None:
    """The gate before issue 22 (one ratio of two p99s of queue + inference, point error rates), on the same
    window: what it would have said, for comparison only."""
    if canary.requests < 100:
        return None
    stable_ok = stable.requests >= 100
    if canary.p99_ms is not None and canary.p99_ms > sla_ms:
        return f"p99 {canary.p99_ms:.1f} ms > p99MaxMs {sla_ms:g}"
    if stable_ok and canary.p99_ms is not None and stable.p99_ms is not None and canary.p99_ms > stable.p99_ms * 1.5 + 5:
        return f"p99 {canary.p99_ms:.1f} ms > stable {stable.p99_ms:.1f} ms x 1.5 + 5 ms"
    if canary.error_rate > (stable.error_rate if stable_ok else 0.0) + 0.01:
        return f"error rate {canary.error_rate:.2%}"
    if canary.expiry_rate > (stable.expiry_rate if stable_ok else 0.0) + 0.01:
        return f"expiry rate {canary.expiry_rate:.2%}"
    return None


class _Slot:
    """One model with its own scorer process and request load; it runs one rollout at a time, stable 1.0.0
    (``paced``) to a new canary version each time."""

    def __init__(self, settings: Settings, index: int, args: argparse.Namespace, workdir: Path) -> None:
        import yaml

        from tests.support.scorer_fixtures import ScorerProcess, echo_spec_doc

        self.name = f"bg{index}-{uuid.uuid4().hex[:6]}"
        self.settings, self.args = settings, args
        self.doc = echo_spec_doc(self.name)
        self.doc["spec"]["backend"]["callable"] = "tests.support.scorer_fixtures:paced"
        self.doc["spec"]["sla"] = {"p99_latency_ms": args.sla_ms}
        self.stable = load(self.doc, topic_prefix=settings.topic_prefix)
        topics_for(settings, self.stable, partitions=4)
        path = workdir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.doc), encoding="utf-8")
        # the canary version runs in a companion process (``sie.workers.versions``), started outside the repo:
        # PYTHONPATH makes the bench's model module importable there, as an installed package would be
        repo = str(Path(__file__).resolve().parent.parent)
        self.scorer = ScorerProcess(path, settings.bootstrap_servers, f"{self.name}-0", workdir,
                                    env={"SIE_TOPIC_PREFIX": settings.topic_prefix,
                                         "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH"))
                                                                       if p)})
        self.load: Any = None
        self.windows: KafkaVersionWindows | None = None
        self.serial = 0
        self.current: dict[str, Any] | None = None
        self.idle_since = 0.0

    def canary_spec(self, kind: str) -> Any:
        self.serial += 1
        doc = json.loads(json.dumps(self.doc))
        doc["spec"]["model"]["version"] = f"1.0.{self.serial}"
        doc["spec"]["backend"]["callable"] = f"tests.support.scorer_fixtures:{CANARIES[kind]}"
        doc["spec"]["rollout"] = {"intervalSeconds": self.args.interval}  # default steps and gates
        return load(doc, topic_prefix=self.settings.topic_prefix)


def _outcome(kind: str, slot: _Slot, rollout: Any, legacy: str | None, started: float) -> dict[str, Any]:
    first = next((e for e in rollout.events if e.target is Phase.CANARY), None)
    failed = next((e for e in rollout.events if e.target is Phase.ROLLING_BACK), None)
    steps = [e for e in rollout.events if e.source is Phase.CANARY]
    return {"kind": kind, "model": slot.name, "version": rollout.canary_version, "phase": str(rollout.phase),
            "decision_s": (failed.at_ms - first.at_ms) / 1000 if failed and first else None,
            "duration_s": (rollout.events[-1].at_ms - rollout.started_ms) / 1000,
            "step_s": [round((e.at_ms - (prev.at_ms if prev else 0)) / 1000, 1)
                       for prev, e in zip([first, *steps], steps) if prev is not None],
            "reason": failed.reason if failed else (steps[-1].reason if steps else ""),
            "legacy": legacy, "started": started,
            "events": [(e.at_ms, str(e.source), str(e.target), e.weight_bp, e.reason) for e in rollout.events]}


def gates_main(argv: list[str]) -> int:
    """``bench_rollout.py gates``: see ``docs/rollouts.md`` "The gates" for what it shows."""
    parser = argparse.ArgumentParser(prog="bench_rollout.py gates",
                                     description="Rollouts of identical code and of worse canaries, default gates")
    parser.add_argument("--models", type=int, default=4, help="models rolling out concurrently (one scorer each)")
    parser.add_argument("--identical", type=int, default=20, help="rollouts of identical code")
    parser.add_argument("--slow", type=int, default=20, help="rollouts of a canary 3x slower per model call")
    parser.add_argument("--errors", type=int, default=20, help="rollouts of a canary failing 5 %% of rows")
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second per model")
    parser.add_argument("--interval", type=float, default=5.0, help="intervalSeconds of each step (default 20)")
    parser.add_argument("--tick", type=float, default=1.0, help="the leader's tick (s)")
    parser.add_argument("--sla-ms", type=float, default=1000.0, help="the models' sla.p99_latency_ms (p99MaxMs)")
    parser.add_argument("--warm", type=float, default=10.0, help="seconds of load before the first rollout")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between rollouts of one model")
    parser.add_argument("--raw", type=Path, help="write every answer and rollout as JSON here (offline analysis)")
    parser.add_argument("--no-write", action="store_true", help="print only (do not replace the results file)")
    args = parser.parse_args(argv)
    import tempfile

    from tests.support.helpers import wait_until

    settings = Settings().with_overrides(topic_prefix=f"bgt{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, [t for t in system_topics(settings.topic_prefix)
                             if t.name.rsplit(".", 1)[-1] in ("rollouts", "events", "specs")])
    plan = [k for i in range(max(args.identical, args.slow, args.errors))
            for k, n in (("identical", args.identical), ("slow3x", args.slow), ("errors5", args.errors)) if i < n]
    load_start, loads = os.getloadavg(), []
    t_begin = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="bench-gates-"))
    slots = [_Slot(settings, i, args, workdir) for i in range(args.models)]
    router, publisher = _Router(), Publisher(settings)
    driver = RolloutDriver(router)
    outcomes: list[dict[str, Any]] = []
    try:
        for slot in slots:
            wait_until(slot.scorer.ready, 120, interval=0.5, message=f"scorer {slot.name} ready")
            slot.windows = router.by_model[slot.name] = KafkaVersionWindows(settings, slot.stable, keep_s=3600)
            slot.load = Load(settings, slot.stable.topics.requests, rate=args.rate)
        time.sleep(args.warm)  # steady load on the stable version first (the rate, not synchronisation)
        pending = list(plan)
        while pending or any(s.current for s in slots):
            now = time.time()
            for slot in slots:
                if slot.current is None and pending and now - slot.idle_since >= args.settle:
                    kind = pending.pop(0)
                    entry, records = driver.begin(slot.stable, slot.canary_spec(kind))
                    publisher.publish(records)
                    driver.commit(entry)
                    slot.current = {"kind": kind, "legacy": None, "started": now - t_begin}
            driver.run_once(publisher)
            for slot in slots:
                if slot.current is None:
                    continue
                rollout = driver.get(slot.name).rollout
                if rollout.phase is Phase.CANARY and slot.current["legacy"] is None:
                    since = rollout.phase_since_ms
                    assert slot.windows is not None
                    slot.current["legacy"] = legacy_fails(
                        slot.windows.window(slot.name, rollout.canary_version, since),
                        slot.windows.window(slot.name, rollout.stable_version, since), args.sla_ms)
                if rollout.terminal:
                    outcomes.append(_outcome(slot.current["kind"], slot, rollout, slot.current["legacy"],
                                             slot.current["started"]))
                    print(f"{len(outcomes):3d}/{len(plan)} {outcomes[-1]['kind']:9s} {slot.name} "
                          f"{outcomes[-1]['phase']:10s} {outcomes[-1]['reason'][:150]}", flush=True)
                    slot.current, slot.idle_since = None, time.time()
                elif time.time() - rollout.started_ms / 1000 > 600:
                    raise SystemExit(f"{slot.name}: rollout not finished in 600 s: {rollout.label}")
            loads.append(os.getloadavg()[0])
            time.sleep(args.tick)  # the leader's tick
        t_end = time.time()
        answers = _collect(settings, slots)
    finally:
        for slot in slots:
            if slot.load is not None:
                slot.load.stop()
            slot.scorer.terminate() if slot.scorer.proc.poll() is None else None
            if slot.windows is not None:
                slot.windows.close()
        publisher.close()
    text = _gates_report(args, outcomes, answers, load_start[0], loads, os.getloadavg()[0], t_end - t_begin)
    print(text)
    if args.raw:
        args.raw.write_text(json.dumps({"outcomes": outcomes, "answers": answers}), encoding="utf-8")
    if not args.no_write:
        GATES_RESULTS.write_text(text, encoding="utf-8")
    return 0


def _collect(settings: Settings, slots: list[_Slot]) -> dict[str, Any]:
    """Every request answered exactly once (per model), and every answer as (ts, version, kind, latency,
    inference, rows) for the report's per-version figures."""
    out: dict[str, Any] = {}
    for slot in slots:
        ids = slot.load.stop()
        slot.load = None
        results, dead = prove_exactly_once(settings, slot.stable, ids, timeout=180)
        rows = []
        for m in results:
            doc = orjson.loads(m.value())
            t = doc.get("timings") or {}
            rows.append((m.timestamp()[1], doc["version"], doc.get("status"), float(t.get("queue_ms", 0.0))
                         + float(t.get("inference_ms", 0.0)), float(t.get("inference_ms", 0.0)),
                         int(t.get("batch_size") or 0)))
        for m in dead:
            h = dict(m.headers() or [])
            rows.append((m.timestamp()[1], h["sie.version"].decode(), h.get("sie.reason", b"").decode(), 0.0, 0.0, 0))
        out[slot.name] = {"requests": len(ids), "answers": len(results) + len(dead), "rows": rows}
    return out


def _call_times(outcomes: list[dict[str, Any]], answers: dict[str, Any]) -> str:
    """The model-call (inference) time of canary and stable over each rollout's canary steps (each call once),
    the median over the rollouts: identical code, so any difference is how each version is called (the
    canary in a companion process: the pipe round trip and that process's wake-up)."""
    stats: dict[str, list[list[float]]] = {"canary": [[], []], "stable": [[], []]}
    for o in outcomes:
        t0 = next((e[0] for e in o["events"] if e[2] == "Canary"), None)
        if t0 is None:
            continue
        t1 = o["events"][-1][0]
        calls: dict[tuple[str, float, int], None] = {}
        for ts, version, status, _lat, inference, rows in answers[o["model"]]["rows"]:
            if status == "ok" and t0 <= ts <= t1 and version in ("1.0.0", o["version"]):
                calls[(version, inference, rows)] = None
        for who, version in (("canary", o["version"]), ("stable", "1.0.0")):
            mine = [c[1] for c in calls if c[0] == version]
            if mine:
                stats[who][0].append(_pct(mine, 0.5))
                stats[who][1].append(_pct(mine, 0.99))
    return ("model-call time over the canary steps (median over the rollouts): canary p50 "
            f"{_pct(stats['canary'][0], 0.5):.1f} / p99 {_pct(stats['canary'][1], 0.5):.1f} ms, stable p50 "
            f"{_pct(stats['stable'][0], 0.5):.1f} / p99 {_pct(stats['stable'][1], 0.5):.1f} ms (the canary runs in "
            f"a companion process)")


def _gate_of(reason: str) -> str:
    """Which gate a rollback reason names (the first failing one)."""
    if reason.startswith("no verdict"):
        return "no verdict in time"
    head = reason.split(": ", 1)[-1]
    for prefix, gate in (("inference p99", "inference p99 vs stable"), ("inference p50", "inference p50 vs stable"),
                         ("p99", "p99MaxMs"),
                         ("error rate", "error rate"), ("expiry rate", "expiry rate")):
        if head.startswith(prefix):
            return gate
    return head[:40]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def _gates_report(args: argparse.Namespace, outcomes: list[dict[str, Any]], answers: dict[str, Any],
                  load_start: float, loads: list[float], load_end: float, wall_s: float) -> str:
    lines = [f"bench_rollout gates ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
             f"load average at start {load_start:.1f}, during min {min(loads):.1f} / median "
             f"{_pct(loads, 0.5):.1f} / max {max(loads):.1f}, at end {load_end:.1f}; {wall_s:.0f} s)",
             "command: SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_rollout.py gates " + " ".join(sys.argv[2:]),
             f"{args.models} models rolling out concurrently on one broker, each with its own `sie score` process "
             f"(4 partitions) at {args.rate:g} requests/s; stable 1.0.0 = paced (20 ms per model call), each "
             f"rollout to a new canary version with the default steps 10/20/50/100 and default gates (no "
             f"rollout.gates block; p99MaxMs = sla.p99_latency_ms {args.sla_ms:g}), intervalSeconds "
             f"{args.interval:g} (default 20: the interval is not a gate), leader tick {args.tick:g} s",
             "canaries: identical = the same code (paced); slow3x = 3x per model call (paced_3x, 60 ms); "
             "errors5 = paced failing 1 row in 20 (paced_errors)", ""]
    for kind, want in (("identical", "Complete"), ("slow3x", "RolledBack"), ("errors5", "RolledBack")):
        mine = [o for o in outcomes if o["kind"] == kind]
        if not mine:
            continue
        good = sum(o["phase"] == want for o in mine)
        legacy = sum(o["legacy"] is not None for o in mine)
        lines.append(f"{kind}: {good} of {len(mine)} {want} (target >= {len(mine) - 1}); "
                     f"the old single-ratio gate on the same windows would have failed {legacy} of {len(mine)}")
        if kind == "identical":
            lines.append("  " + _call_times(mine, answers))
            durations = [o["duration_s"] for o in mine if o["phase"] == want]
            steps = [s for o in mine if o["phase"] == want for s in o["step_s"]]
            if durations:
                lines.append(f"  start -> Complete: median {_pct(durations, 0.5):.1f} s, max {max(durations):.1f} s; "
                             f"step length (interval {args.interval:g} s + waiting for evidence): median "
                             f"{_pct(steps, 0.5):.1f} s, p90 {_pct(steps, 0.9):.1f} s, max {max(steps):.1f} s")
        else:
            times = [o["decision_s"] for o in mine if o["decision_s"] is not None]
            if times:
                lines.append(f"  canary 10 % -> gate failed (time to decision): median {_pct(times, 0.5):.1f} s, "
                             f"p90 {_pct(times, 0.9):.1f} s, max {max(times):.1f} s")
            gates: dict[str, int] = {}
            for o in mine:
                if o["phase"] == want:
                    gates[_gate_of(o["reason"])] = gates.get(_gate_of(o["reason"]), 0) + 1
            lines.append(f"  failed by: {', '.join(f'{g} {n}' for g, n in sorted(gates.items()))}")
        for o in mine:
            if o["phase"] != want:
                lines.append(f"  NOT {want}: {o['model']} {o['version']} {o['phase']}: {o['reason'][:300]}")
        example = next((o for o in mine if o["phase"] == want), None)
        if example:
            lines.append(f"  e.g. {example['reason'][:300]}")
        lines.append("")
    lines.append("per model: exactly once (every request one answer, read_committed)")
    for name, a in answers.items():
        lines.append(f"  {name}: {a['answers']} answers for {a['requests']} requests")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
