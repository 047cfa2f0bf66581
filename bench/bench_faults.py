"""The fault campaign (issue 9) on a 3-broker cluster of its own, under a steady request load.

    python bench/bench_faults.py [--repeats 1] [--rate 40] [--faults a,b,c,d,d2,e,f]

Starts a 3-broker KRaft cluster on free loopback ports (model topics: replication factor 3,
min.insync.replicas 2), then runs the faults of tests/support/fault_campaign.py, each ``--repeats`` times:

- (a) SIGKILL + restart of the broker leading request partition 0 of a real ``sie score`` (echo model)
- (b) SIGKILL + restart of the scorer's transaction coordinator (leader of its __transaction_state partition)
- (c) SIGKILL + restart of the leader of the scorer group's __consumer_offsets partition (group coordinator)
- (d) SIGSTOP of the leader of request partition 0 past the scorer's session timeout (6 s), then SIGCONT
- (d2) the same for the scorer's transaction coordinator
- (e) the leading ``sie control`` SIGSTOPped past its group session (the standby takes over, a model is
  applied meanwhile), then SIGCONT: it must never write as leader again
- (f) the ``sie agent`` running a replica SIGSTOPped past the node timeout, then SIGCONT

Per fault: the longest stall of a request partition (gap between committed outputs), the recovery (fault ->
every partition answered a request produced after the fault), and the read_committed proof (lost, doubled).
A fault whose trial fails (a deadline reached, a request lost or doubled) gets a FAILED row saying why.
Results: bench/results/faults.txt (its hand-written "## analysis" section is kept).

    python bench/bench_faults.py --partitions [--repeats 3] [--rate 150] [--cases 1,4,4b,5,6,7,7b,2,3]

The partition campaign (issue 27, tests/support/partition_campaign.py; needs root: network namespaces): every broker,
scorer/agent node, control plane and the client on its own address of a private test network; the cases are
partitions (a link cut, packets dropped between nodes) instead of crashes.  Per case also the healthy scorer's
own partitions' stall and the time from the heal to every partition answering.  The defaults are the test's full
profile (``SIE_FAULT_CAMPAIGN=full``: 150 req/s, 60 s flaps, 4b = the partial partition that keeps none of the
scorer's coordinators, 7b = the flapping link of a partition leader), once each; a row over one of the campaign's
bounds (``tests.support.partition_campaign.held``) says OVER BOUND and the exit status is 1.  Results:
bench/results/partitions.txt (its "## analysis" section is kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sie.infra.kafka.local import LocalKafka, free_base_port  # noqa: E402
from sie.kernel.settings import Settings  # noqa: E402
from tests.support.fault_campaign import TABLE_HEADER, ControlRig, FaultResult, ScorerRig  # noqa: E402

SCORER_FAULTS = {
    "a": ("(a) SIGKILL + restart: leader of request partition 0", "request_leader", "kill"),
    "b": ("(b) SIGKILL + restart: transaction coordinator", "txn_coordinator", "kill"),
    "c": ("(c) SIGKILL + restart: __consumer_offsets leader", "offsets_leader", "kill"),
    "d": ("(d) SIGSTOP > session timeout, SIGCONT: leader of request partition 0", "request_leader", "pause"),
    "d2": ("(d2) SIGSTOP > session timeout, SIGCONT: transaction coordinator", "txn_coordinator", "pause"),
}


def _failed(fault: str, exc: BaseException) -> FaultResult:
    why = " ".join(str(exc).split())[:300].replace("|", "/")
    return FaultResult(fault, "-", float("nan"), float("nan"), 0, -1, -1, float("nan"), f"FAILED: {why}")


def summary(rows: list[FaultResult]) -> list[str]:
    """Per fault: trials, how many failed, lost and doubled in all, and the stall and recovery distributions."""
    import statistics

    def spread(values: list[float]) -> str:
        if not values:
            return "-"
        q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
        return (f"min {min(values):.1f} / median {statistics.median(values):.1f} / p90 {q[8]:.1f} / "
                f"max {max(values):.1f} s")

    out = []
    for fault in dict.fromkeys(r.fault for r in rows):
        mine = [r for r in rows if r.fault == fault]
        ok = [r for r in mine if r.lost >= 0]
        out.append(f"{fault}: {len(mine)} trials, {len(mine) - len(ok)} failed, "
                   f"{sum(r.lost for r in ok)} lost, {sum(r.doubled for r in ok)} doubled; "
                   f"stall {spread([r.stall_s for r in ok])}; recovery {spread([r.recovery_s for r in ok])}")
    return out + [""] if out else []


def run_scorer_faults(kafka: LocalKafka, root: Path, which: list[str], repeats: int, rate: float,
                      scorer_env: dict[str, str] | None = None) -> tuple[list, str]:
    rig = ScorerRig(kafka, root / "scorer", rate, scorer_env)
    rows = []
    try:
        for _ in range(repeats):  # the faults in turn, ``repeats`` rounds: a long loop mixes them evenly
            for key in which:
                name, target, kind = SCORER_FAULTS[key]
                try:
                    t = getattr(rig, target)()
                    row = rig.kill_and_restart(name, t) if kind == "kill" else rig.pause_and_resume(name, t)
                except AssertionError as exc:
                    row = _failed(name, exc)
                rows.append(row)
                print(row.row(), flush=True)
    finally:
        requests, lost, doubled = rig.close()
    return rows, f"scorer rig, whole run, fresh read_committed reader: {requests} requests, {lost} lost, {doubled} doubled"


def run_control_faults(kafka: LocalKafka, root: Path, which: list[str], repeats: int, rate: float) -> tuple[list, str]:
    rig = ControlRig(kafka, root / "control", rate)
    rows = []
    try:
        for key in which:
            for _ in range(repeats):
                try:
                    row = rig.leader_pause() if key == "e" else rig.agent_pause()
                except AssertionError as exc:
                    row = _failed(f"({key}) {'control-plane leader' if key == 'e' else 'agent'} SIGSTOP/SIGCONT", exc)
                rows.append(row)
                print(row.row(), flush=True)
    finally:
        requests, lost, doubled = rig.close()
    return rows, f"control rig, whole run, fresh read_committed reader: {requests} requests, {lost} lost, {doubled} doubled"


#: the partition campaign's cases: key -> (rig, method, keyword arguments)
PARTITION_CASES: dict[str, tuple[str, str, dict[str, object]]] = {
    "1": ("scorer", "cut_scorer", {}),
    "4": ("scorer", "partial", {"keep": "group"}),
    "4b": ("scorer", "partial", {"keep": "other"}),
    "5": ("scorer", "cut_client", {}),
    "6": ("scorer", "broker_minority", {}),
    "7": ("scorer", "flap", {"node": "a1", "duration_s": 60.0}),
    "7b": ("scorer", "flap", {"node": "leader", "duration_s": 60.0}),
    "2": ("control", "cut_agent", {}),
    "3": ("control", "cut_leader", {}),
}


def run_partitions(args: argparse.Namespace) -> int:
    from tests.support.netns import unavailable
    from tests.support.partition_campaign import TABLE_HEADER as PARTITION_HEADER
    from tests.support.partition_campaign import ControlNet, PartitionResult, ScorerNet, TestNet, held

    why = unavailable()
    if why is not None:
        print(f"the partition campaign needs network namespaces: {why}", file=sys.stderr)
        return 2
    which = [c.strip() for c in args.cases.split(",") if c.strip()]
    rate, control_rate = args.rate or 150.0, 20.0  # the test's full profile
    root = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    load_before = os.getloadavg()
    started = time.monotonic()
    rows: list[PartitionResult] = []
    proofs: list[str] = []
    net = TestNet(Settings(), root).start()
    try:
        for kind, factory in (("scorer", lambda: ScorerNet(net, root / "scorer", rate)),
                              ("control", lambda: ControlNet(net, root / "control", control_rate))):
            keys = [k for k in which if PARTITION_CASES[k][0] == kind]
            if not keys:
                continue
            rig = factory()
            try:
                for _ in range(args.repeats):
                    for key in keys:
                        _, method, kwargs = PARTITION_CASES[key]
                        try:
                            row = getattr(rig, method)(**kwargs)
                        except AssertionError as exc:
                            why_failed = " ".join(str(exc).split())[:300].replace("|", "/")
                            row = PartitionResult(f"{key} {method}", "-", float("nan"), None, float("nan"), None,
                                                  float("nan"), 0, -1, -1, f"FAILED: {why_failed}")
                        else:
                            try:  # the campaign's bounds (tests/test_partition_campaign.py judges them the same way)
                                held(row)
                            except AssertionError as exc:
                                over = " ".join(str(exc).split("PartitionResult(")[0].split())[:120] or "a bound"
                                row = dataclasses.replace(row, note=f"OVER BOUND ({over}): {row.note}")
                        rows.append(row)
                        print(row.row(), flush=True)
            finally:
                requests, lost, doubled = rig.close()
            proofs.append(f"{kind} rig, whole run, fresh read_committed reader: {requests} requests, {lost} lost, "
                          f"{doubled} doubled")
    finally:
        net.close()
    load_after = os.getloadavg()
    lines = [
        f"# bench_faults --partitions: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs (shared with other "
        f"engineers' tests), load average {load_before[0]:.1f} before / {load_after[0]:.1f} after, "
        f"{time.monotonic() - started:.0f} s",
        "# command: python bench/bench_faults.py " + " ".join(sys.argv[1:]),
        "# every node in its own network namespace (tests/support/netns.py): 3 brokers (KRaft), 2 scorers "
        "(sie score, 6 request partitions, session 10 s) or 2 agents + 2 control planes, the client; "
        f"{rate:g} req/s to the scorers, {control_rate:g} req/s to the control rig's model; "
        f"{args.repeats} trial(s) per case",
        "# stall: longest gap between committed outputs of one request partition around the fault; healthy stall: the "
        "same over the partitions of the scorer that was not cut;",
        "# recovery: fault -> every partition answered a request produced after the fault; after heal: heal -> the same;",
        "# lost/doubled: every request delivered so far has exactly one committed result or dead letter (read_committed)",
        "",
        PARTITION_HEADER,
        *(r.row() for r in rows),
        "",
        *proofs,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out if args.out != DEFAULT_OUT else Path(__file__).parent / "results" / "partitions.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    old = out.read_text() if out.exists() else ""
    analysis = old[old.index("\n## analysis"):] if "\n## analysis" in old else ""
    out.write_text(text + analysis)
    return 1 if any(r.lost != 0 or r.doubled != 0 or r.note.startswith("OVER BOUND") for r in rows) else 0


DEFAULT_OUT = Path(__file__).parent / "results" / "faults.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s to the scorer (default 40, the control rig half; with --partitions 150, the "
                             "control rig 20 as in the test's full profile)")
    parser.add_argument("--faults", default="a,b,c,d,d2,e,f")
    parser.add_argument("--scorer-kafka-extra", default="",
                        help="SIE_KAFKA_EXTRA for the sie score process (JSON librdkafka properties), for A/B runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results file (default faults.txt; with --partitions: partitions.txt)")
    parser.add_argument("--partitions", action="store_true",
                        help="the partition campaign on a private test network of namespaces (needs root)")
    parser.add_argument("--cases", default=",".join(PARTITION_CASES),
                        help="partition campaign cases (with --partitions)")
    args = parser.parse_args()
    if args.partitions:
        return run_partitions(args)
    which = [f.strip() for f in args.faults.split(",") if f.strip()]
    args.rate = args.rate or 40.0
    root = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    load_before = os.getloadavg()
    kafka = LocalKafka(Settings(), brokers=3, base_port=free_base_port(6), data_dir=root / "kafka", detach=False)
    kafka.up(timeout=180)
    rows: list[FaultResult] = []
    proofs = []
    started = time.monotonic()
    try:
        scorer_keys = [k for k in which if k in SCORER_FAULTS]
        control_keys = [k for k in which if k in ("e", "f")]
        if scorer_keys:
            env = {"SIE_KAFKA_EXTRA": args.scorer_kafka_extra} if args.scorer_kafka_extra else None
            r, proof = run_scorer_faults(kafka, root, scorer_keys, args.repeats, args.rate, env)
            rows += r
            proofs.append(proof)
        if control_keys:
            r, proof = run_control_faults(kafka, root, control_keys, args.repeats, args.rate / 2)
            rows += r
            proofs.append(proof)
    finally:
        kafka.down()
    load_after = os.getloadavg()
    command = "python bench/bench_faults.py " + " ".join(sys.argv[1:])
    lines = [
        f"# bench_faults: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs (shared with other engineers' "
        f"tests), load average {load_before[0]:.1f} before / {load_after[0]:.1f} after, {time.monotonic() - started:.0f} s",
        f"# command: {command}",
        f"# 3 brokers (KRaft, broker.session.timeout.ms 5000), model topics RF 3 + min.insync.replicas 2, 4 request "
        f"partitions; scorer session.timeout.ms 6000, txn hang watchdog 25 s; {args.rate:g} req/s to the scorer, "
        f"{args.rate / 2:g} req/s to the control rig's model; {args.repeats} trial(s) per fault"
        + (f"; scorer SIE_KAFKA_EXTRA={args.scorer_kafka_extra}" if args.scorer_kafka_extra else ""),
        "# stall: longest gap between committed outputs of one request partition around the fault;",
        "# recovery: fault -> every request partition answered a request produced after the fault;",
        "# lost/doubled: every request delivered so far has exactly one committed result or dead letter (read_committed)",
        "",
        TABLE_HEADER,
        *(r.row() for r in rows),
        "",
        *summary(rows),
        *proofs,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = args.out.read_text() if args.out.exists() else ""
    analysis = old[old.index("\n## analysis"):] if "\n## analysis" in old else ""
    args.out.write_text(text + analysis)
    failed = any(r.lost != 0 or r.doubled != 0 for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
