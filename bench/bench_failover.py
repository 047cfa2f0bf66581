"""Failover timings with real processes: `sie control` + two `sie agent`s on a real broker.

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_failover.py [--repeats 3]

Cluster: one control plane (node timeout 6 s), node-a and node-b (heartbeat 2 s, simulated L4), the
fraud-scorer (torch, 2 replicas) and fraud-rules (python, 1 replica) examples. A steady request stream
(--rate per model) runs the whole time; a read_committed tail records when each result arrives.

- worker SIGKILL (a fraud-scorer worker, torch): kill -> READY again (the agent's replica-status
  record) and kill -> scoring resumed on every request partition (the end of each partition's longest
  gap after the kill); target <= 5 s.
- agent SIGKILL (the node with the most replicas): kill -> every replica it ran READY on the other
  node (target <= 10 s) and the longest stall of any request partition (target <= 15 s). The killed
  agent is then restarted (empty) for the next trial.

Every trial also checks that no request was lost or answered twice (exactly-once across the failure).
Results: bench/results/failover.txt.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sie.kernel.settings import Settings  # noqa: E402
from tests.support.cluster_harness import (  # noqa: E402
    Cluster,
    RequestStream,
    ResultTail,
    StatusTail,
    example_input,
    try_get,
    wait_for,
)

SCORER, RULES = "fraud-scorer", "fraud-rules"
TARGETS = {"worker_ready_s": 5.0, "worker_resume_s": 5.0, "agent_ready_s": 10.0, "agent_stall_s": 15.0}


def resume_after(tail: ResultTail, partition_of: dict[str, int], kill: float, window_end: float) -> tuple[float, float]:
    """(kill -> scoring resumed on every partition, longest per-partition gap around the kill).

    Per partition: the arrivals after the kill, plus the last one before it; the partition 'resumed'
    at the end of its longest gap after the kill."""
    with tail._lock:  # noqa: SLF001 - read-only snapshot
        order = list(tail.order)
    per: dict[int, list[float]] = {}
    for at, rid in order:
        p = partition_of.get(rid)
        if p is not None and at <= window_end:
            per.setdefault(p, []).append(at)
    resumed, stall = 0.0, 0.0
    for times in per.values():
        before = [t for t in times if t <= kill]
        after = [t for t in times if t > kill]
        seq = [before[-1] if before else kill, *after]
        if len(seq) < 2:
            resumed = stall = float("inf")
            continue
        gaps = [(b - a, b) for a, b in zip(seq, seq[1:])]
        gap, end = max(gaps)
        stall = max(stall, gap)
        resumed = max(resumed, end - kill)
    return resumed, stall


def setup(settings: Settings, root: Path) -> tuple[Cluster, dict, dict, StatusTail, Path]:
    c = Cluster(settings, root)
    c.start_control("cp-1")
    c.start_agent("node-a")
    c.start_agent("node-b")
    c.wait_leader(60)
    scorer = c.write_spec(SCORER, replicas=2, resources={"cpu": 0.5})
    rules = c.write_spec(RULES, resources={"cpu": 0.25})
    done = c.sie("apply", "-f", str(scorer), "-f", str(rules))
    assert done.returncode == 0, done.stderr
    c.wait_ready(SCORER, 2, timeout=120)
    c.wait_ready(RULES, 1, timeout=60)
    status = StatusTail(c.settings)
    tails, streams = {}, {}
    for model, tag in ((SCORER, "s"), (RULES, "r")):
        topics = c.spec_topics(model)
        tails[model] = ResultTail(c.settings, topics)
        streams[model] = RequestStream(c.settings, topics["requests"], example_input(scorer), tag, rate_per_s=ARGS.rate).start()
    wait_for(lambda: all(t.count() >= 40 for t in tails.values()), 60, "results flowing")
    return c, tails, streams, status, scorer


def steady(tails: dict, streams: dict | None = None, since: float | None = None) -> None:
    """Results keep coming (2 s worth more) and, after a kill at ``since``, every request partition
    answered again (so the measurement window holds the end of every stall)."""
    counts = {m: t.count() for m, t in tails.items()}
    wait_for(lambda: all(t.count() >= counts[m] + 2 * ARGS.rate for m, t in tails.items()), 60, "steady results")
    if since is None:
        return

    def every_partition_back() -> bool:
        for m, t in tails.items():
            with t._lock:  # noqa: SLF001
                back = {streams[m].partition_of.get(rid) for at, rid in t.order if at > since + 0.5}
            if not set(streams[m].partition_of.values()) <= back:
                return False
        return True

    wait_for(every_partition_back, 60, "every request partition answered after the kill")


def worker_trial(c: Cluster, tails: dict, streams: dict, status: StatusTail, trial: int) -> dict:
    steady(tails)
    rid = f"{SCORER}-{trial % 2}"  # alternate: 3 crashes of one replica within 300 s would make it FAILED
    node, pid = c.all_workers()[rid]
    kill_wall, kill_mono = time.time(), time.monotonic()
    os.kill(pid, signal.SIGKILL)
    ready_at = wait_for(lambda: status.ready_after(rid, kill_wall, node), 60, "replacement READY")
    steady(tails, streams, kill_mono)
    end = time.monotonic()
    resumed, stall = resume_after(tails[SCORER], streams[SCORER].partition_of, kill_mono, end)
    return {"worker_ready_s": ready_at - kill_wall, "worker_resume_s": resumed, "worker_stall_s": stall}


def agent_trial(c: Cluster, tails: dict, streams: dict, status: StatusTail) -> dict:
    steady(tails)
    where = c.all_workers()
    by_node: dict[str, list[str]] = {}
    for rid, (node, _) in where.items():
        by_node.setdefault(node, []).append(rid)
    victim = max(sorted(by_node), key=lambda n: len(by_node[n]))
    survivor = next(a.name for a in c.agents() if a.name != victim)
    moved = by_node[victim]
    kill_wall, kill_mono = time.time(), time.monotonic()
    c.agent(victim).kill(signal.SIGKILL)
    c.agent(victim).popen.wait(10)
    ready = wait_for(lambda: (r := [status.ready_after(rid, kill_wall, survivor) for rid in moved]) and all(r) and r,
                     90, lambda: f"{moved} READY on {survivor}\n{c.logs()}")
    steady(tails, streams, kill_mono)
    end = time.monotonic()
    stalls, resumes = [], []
    for model in (SCORER, RULES):
        resumed, stall = resume_after(tails[model], streams[model].partition_of, kill_mono, end)
        stalls.append(stall)
        resumes.append(resumed)
    # bring the node back (empty: placement is stable) for the next trial
    c.start_agent(victim)
    wait_for(lambda: any(n["name"] == victim and n["status"] == "online"
                         for n in (try_get(c.api(), "/v1/nodes") or {}).get("nodes", [])), 30, f"{victim} online again")
    return {"agent_ready_s": max(ready) - kill_wall, "agent_stall_s": max(stalls), "agent_resume_s": max(resumes),
            "moved": len(moved)}


def audit(tails: dict, streams: dict) -> dict:
    out = {}
    for model, tag in ((SCORER, "s"), (RULES, "r")):
        n = streams[model].stop()
        ids = [f"{tag}-{i}" for i in range(n)]
        wait_for(lambda: tails[model].count(ids) == n, 90, f"{model}: every request answered")
        lost, dups, _ = tails[model].audit(ids)
        out[model] = (n, len(lost), len(dups))
    return out


def row(name: str, values: list[float], target: float | None) -> str:
    med, worst = statistics.median(values), max(values)
    verdict = "" if target is None else ("met" if worst <= target else "MISSED")
    t = "" if target is None else f"<= {target:g} s"
    runs = ", ".join(f"{v:.2f}" for v in values)
    return f"| {name:<38} | {med:6.2f} | {worst:6.2f} | {t:<8} | {verdict:<6} | {runs} |"


def main() -> int:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s per model")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "failover.txt")
    ARGS = parser.parse_args()
    settings = Settings()
    root = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    c, tails, streams, status, _ = setup(settings, root)
    worker, agent = [], []
    try:
        for i in range(ARGS.repeats):
            worker.append(worker_trial(c, tails, streams, status, i))
            print("worker", i, {k: round(v, 2) for k, v in worker[-1].items()}, flush=True)
        for i in range(ARGS.repeats):
            agent.append(agent_trial(c, tails, streams, status))
            print("agent", i, {k: round(v, 2) for k, v in agent[-1].items()}, flush=True)
        eos = audit(tails, streams)
    finally:
        for t in tails.values():
            t.close()
        status.close()
        c.close()
    lines = [
        f"# bench_failover: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs (shared), broker {settings.bootstrap_servers}",
        f"# heartbeat 2 s, node timeout 6 s, scorer session.timeout.ms 10000, {ARGS.rate:g} req/s per model, {ARGS.repeats} runs each",
        "",
        "| measure                                | median |    max | target   | result | runs (s) |",
        "|----------------------------------------|--------|--------|----------|--------|----------|",
        row("worker SIGKILL -> READY again", [w["worker_ready_s"] for w in worker], TARGETS["worker_ready_s"]),
        row("worker SIGKILL -> scoring resumed", [w["worker_resume_s"] for w in worker], TARGETS["worker_resume_s"]),
        row("worker SIGKILL: longest partition stall", [w["worker_stall_s"] for w in worker], None),
        row("agent SIGKILL -> replicas READY elsewhere", [a["agent_ready_s"] for a in agent], TARGETS["agent_ready_s"]),
        row("agent SIGKILL: longest partition stall", [a["agent_stall_s"] for a in agent], TARGETS["agent_stall_s"]),
        row("agent SIGKILL -> scoring resumed", [a["agent_resume_s"] for a in agent], None),
        "",
        "exactly-once over all trials (requests, lost, duplicated): "
        + ", ".join(f"{m} {n}/{lost}/{dup}" for m, (n, lost, dup) in eos.items()),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    ARGS.out.parent.mkdir(parents=True, exist_ok=True)
    # keep a hand-written "## analysis" section of the previous file
    old = ARGS.out.read_text() if ARGS.out.exists() else ""
    analysis = old[old.index("\n## analysis"):] if "\n## analysis" in old else ""
    ARGS.out.write_text(text + analysis)
    return 0


ARGS: argparse.Namespace


if __name__ == "__main__":
    sys.exit(main())
