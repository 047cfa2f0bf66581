"""The rollout campaign of issue 34: many rollouts on a real cluster, every committed answer checked against its
epoch's weight (``python bench/bench_rollout.py campaign --good 5 --bad 5``; results in
bench/results/rollout_campaign.txt).

Cluster (``tests/support/cluster_harness.py``): 2 ``sie control`` + 2 ``sie agent`` processes on one broker (started
here unless SIE_BOOTSTRAP_SERVERS names one).  Each rollout gets a model of its own (so its epochs are its own):

    apply v1.0.0 (a user's python model, ``tests/support/user_models.python_project``: its code names its version in
        every answer) with `sie apply` through the control API, 2 replicas, wait Ready
    keyed requests at --rate/s over --keys keys (keys repeat: a key's answers over time are compared)
    apply v1.1.0 with a rollout block (steps 10/50/100, --interval s each)
      good: different code; at the 10 % step SIGKILL stable worker <model>-0 (its agent restarts it), at the
            50 % step SIGKILL the leading `sie control` (the standby takes over; a new standby is started);
            with --phase-kills (default) also SIGKILL worker <model>-1 once in Surging and once in Draining
            (the stable worker beside the surge replica; a replica mid-way through its replacement); it must
            Complete
      bad:  different code that cannot score 1 row in 20 (dead letters); no kills; it must roll back
    stop the load (a few seconds after the rollout ended), read every result and dead letter (read_committed)
    exactly once: every request one output (lost / duplicated)
    every output: ``tests/support/rollout_checks.check_answers`` (its version is what its sie.routing.epoch's weight
        gives its key's bucket, no fallback, its code is its label; no key back to stable without a rollback;
        the canary answers nothing before its first canary step)
    delete the model (its replicas stop: the next run has the machine to itself)

A run that fails (a timeout, a rollout that ends otherwise than expected) is reported with its reason and the
campaign goes on.  Runs alternate good/bad until the counts are done or ``--budget-s`` would be exceeded by
another run (its estimate: the longest run so far).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from sie.kernel.settings import Settings
from tests.support.cluster_harness import Cluster, RequestStream, http, try_get, wait_for
from tests.support.rollout_checks import AnswerReport, check_answers, rollout_epochs
from tests.support.scorer_fixtures import CommittedReader, exactly_once_report
from tests.support.user_models import ALLOWED_MODULES, python_project

RESULTS = Path(__file__).resolve().parent / "results" / "rollout_campaign.txt"
INPUTS = {"tenure": 120.0, "spend": 40.0, "tickets": 1.0}
#: loose latency gates (a loaded 2-core machine), the error gate at its default: the bad canary fails on errors
GATES = {"minSamples": 10, "p99MaxMs": 60_000, "p99SlackMs": 30_000, "p99MaxRatio": 100}
TERMINAL = ("Complete", "RolledBack", "Failed")


def _rollout(c: Cluster, model: str) -> dict[str, Any] | None:
    try:
        return try_get(c.api(), f"/v1/rollouts/{model}")
    except AssertionError:  # no control plane answers this moment (a failover)
        return None


def _apply(c: Cluster, spec_file: Path) -> None:
    done = c.sie("apply", "--control-url", f"http://127.0.0.1:{c.api()}", "-f", str(spec_file), timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"sie apply {spec_file}: {done.stdout}{done.stderr}")


class Campaign:
    def __init__(self, settings: Settings, root: Path, args: argparse.Namespace) -> None:
        self.args, self.root = args, root
        self.c = Cluster(settings, root / "cluster", extra_env={"SIE_ALLOWED_MODULES": ALLOWED_MODULES})
        self.controls = 0
        for _ in range(2):
            self._start_control()
        for i in range(2):  # separate caches: each agent fetches what `sie apply` uploaded
            self.c.start_agent(f"node-{'ab'[i]}", gpus=None, env={"SIE_CACHE_DIR": str(root / f"cache-{i}")})
        self.c.wait_leader(120)

    def _start_control(self) -> None:
        self.controls += 1
        self.c.start_control(f"cp-{self.controls}")

    def close(self) -> None:
        self.c.close()

    def run(self, kind: str, index: int) -> dict[str, Any]:
        """One rollout (module docstring); its figures, findings included."""
        c, args = self.c, self.args
        model = f"churn-{kind[0]}{index}-{uuid.uuid4().hex[:4]}"
        src = self.root / "src" / model
        out: dict[str, Any] = {"kind": kind, "model": model, "findings": []}
        started = time.monotonic()
        stream: RequestStream | None = None
        try:
            _apply(c, python_project(src, "1.0.0", name=model, replicas=2, load_s=args.load_s))
            c.wait_ready(model, 2, timeout=300)
            topics = c.spec_topics(model)
            stream = RequestStream(c.settings, topics["requests"], INPUTS, f"q{uuid.uuid4().hex[:6]}",
                                   rate_per_s=args.rate, keys=args.keys,
                                   vary=lambda n: {"tenure": float(n % 1000)}).start()
            load_began = time.monotonic()
            rollout = {"steps": [10, 50, 100], "intervalSeconds": args.interval, "surgeTimeoutSeconds": 300,
                       "gates": GATES}
            _apply(c, python_project(src, "1.1.0", name=model, replicas=2, load_s=args.load_s, rollout=rollout,
                                     fails_one_in=20 if kind == "bad" else 0))
            applied = time.monotonic()
            final = self._drive(model, kind, out, applied)
            out["phase"] = final["phase"]
            out["rollout_s"] = time.monotonic() - applied
            out["events"] = [f"{e['from']} -> {e['to']} ({e['weight_bp'] / 100 if 'weight_bp' in e else '?'}%): "
                             f"{e['reason']}"[:300] for e in final["events"]]
            want = "Complete" if kind == "good" else "RolledBack"
            if final["phase"] != want:
                out["findings"].append(f"the rollout ended {final['phase']}, not {want}: {final.get('reason')}")
            # a few seconds of load after the end: answers under the final epoch are checked too
            end = time.monotonic() + args.after
            wait_for(lambda: time.monotonic() >= end, args.after + 5, "the load after the rollout")
            tag, sent = stream.tag, stream.stop()
            out["rate"] = sent / max(1e-9, time.monotonic() - load_began)
            stream = None
            out["requests"] = sent
            self._check(model, topics, {f"{tag}-{n}" for n in range(sent)}, out)
        except Exception as exc:  # a run that cannot finish is a finding, the campaign goes on
            out["findings"].append(f"run failed: {type(exc).__name__}: {str(exc)[:1500]}")
            out["trace"] = traceback.format_exc()[-3000:]
        finally:
            if stream is not None:
                try:
                    stream.stop()
                except Exception:  # the producer's own error is already in the findings
                    pass
            out["wall_s"] = time.monotonic() - started
            try:
                http(c.api(), "DELETE", f"/v1/models/{model}")
            except Exception as exc:  # the next run still has its own model and topics
                out["findings"].append(f"delete {model}: {exc}")
        return out

    def _drive(self, model: str, kind: str, out: dict[str, Any], applied: float) -> dict[str, Any]:
        """Wait for the rollout's end; a good one gets the worker SIGKILL at 10 % and the leader SIGKILL at 50 %
        (and, with --phase-kills, a worker SIGKILL in Surging and one in Draining)."""
        c, killed_worker, killed_leader = self.c, False, False
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            r = _rollout(c, model)
            if r is not None:
                if r["phase"] == "Canary" and "surging_s" not in out:
                    out["surging_s"] = time.monotonic() - applied
                if r["phase"] in TERMINAL:
                    return r
                weight = float(r.get("weight_percent") or 0)
                phase_kill = f"{r['phase'].lower()}_kill"
                if (kind == "good" and self.args.phase_kills and r["phase"] in ("Surging", "Draining")
                        and phase_kill not in out):
                    out[phase_kill] = f"in {r['phase']}: " + self._kill_worker(f"{model}-1")
                elif kind == "good" and not killed_worker and r["phase"] == "Canary" and weight >= 10:
                    killed_worker = True
                    out["worker_kill"] = self._kill_worker(f"{model}-0")
                elif kind == "good" and not killed_leader and r["phase"] == "Canary" and weight >= 50:
                    killed_leader = True
                    out["leader_kill"] = self._kill_leader()
            time.sleep(0.2)  # a poll interval, not synchronisation: the deadline above bounds the wait
        raise TimeoutError(f"rollout of {model} not ended within {self.args.timeout:g}s: {_rollout(c, model)}\n"
                           f"{c.logs(lines=15)}")

    def _kill_worker(self, replica: str) -> str:
        c = self.c
        workers = {rid: pid for rid, (_n, pid) in c.all_workers().items()}
        pid = workers.get(replica)
        if pid is None:
            return f"no worker {replica} found: {sorted(workers)}"
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        wait_for(lambda: (p := c.all_workers().get(replica)) and p[1] != pid, 120,
                 lambda: f"{replica} restarted: {c.all_workers()}")
        return f"SIGKILL {replica} (pid {pid}); its agent restarted it {time.monotonic() - t:.1f}s later"

    def _kill_leader(self) -> str:
        c = self.c
        lead = c.leader()
        if lead is None:
            return "no leader to kill at this moment"
        lead.kill(signal.SIGKILL)
        t = time.monotonic()
        new = wait_for(lambda: (p := c.leader()) is not None and p is not lead and p, 120,
                       lambda: f"a new leader after {lead.name}'s SIGKILL\n{c.logs('control')}")
        took = time.monotonic() - t
        self._start_control()  # a standby again, for the next run's leader kill
        return f"SIGKILL leader {lead.name} (pid {lead.pid}); {new.name} led {took:.1f}s later"

    def _check(self, model: str, topics: dict[str, str], ids: set[str], out: dict[str, Any]) -> None:
        c = self.c
        results, dead = CommittedReader(c.settings, topics["results"]), CommittedReader(c.settings,
                                                                                         topics["dead_letters"])
        try:
            try:
                wait_for(lambda: results.count() + dead.count() >= len(ids), 180,
                         lambda: f"{len(ids)} outputs (have {len(results.records)} + {len(dead.records)})")
            except AssertionError as exc:
                out["findings"].append(str(exc))
            results.read_to_end(), dead.read_to_end()
            eo = exactly_once_report(results.records, dead.records, ids)
            out["lost"], out["duplicated"] = eo["missing_count"], eo["duplicate_count"]
            if eo["missing_count"] or eo["duplicate_count"] or eo["unexpected"]:
                out["findings"].append(f"exactly once: {eo}")
            report: AnswerReport = check_answers(results.records, dead.records, rollout_epochs(c.settings, model),
                                                 "1.0.0", "1.1.0")
            out["report"] = report
            out["findings"] += report.findings(10)
            out["canary_dead_letters"] = sum(1 for m in dead.records
                                             if dict(m.headers() or []).get("sie.version") == b"1.1.0")
        finally:
            results.close()
            dead.close()


def _run_lines(n: int, r: dict[str, Any]) -> list[str]:
    rep: AnswerReport | None = r.get("report")
    rep_epochs = sorted((rep.by_epoch if rep is not None else {}).items(), key=lambda kv: int(kv[0].split()[1]))
    lines = [f"run {n}: {r['kind']} {r['model']}: {r.get('phase', '?')} in {r.get('rollout_s', 0):.1f}s "
             f"(Surging {r.get('surging_s', 0):.1f}s; run {r['wall_s']:.0f}s), {r.get('requests', 0)} requests at "
             f"{r.get('rate', 0):.0f}/s, lost {r.get('lost', '?')}, duplicated {r.get('duplicated', '?')}"]
    if rep is not None:
        lines.append(f"  {rep.summary()}; canary dead letters {r.get('canary_dead_letters', 0)}")
        lines.append("  by epoch: " + ", ".join(f"{k}: {v}" for k, v in rep_epochs))
    for key in ("surging_kill", "worker_kill", "leader_kill", "draining_kill"):
        if key in r:
            lines.append(f"  {r[key]}")
    lines += [f"  event: {e}" for e in r.get("events", [])]
    lines += [f"  FINDING: {f}" for f in r["findings"]]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_rollout.py campaign", description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=5, help="good rollouts (worker SIGKILL at 10 %%, leader at 50 %%)")
    parser.add_argument("--bad", type=int, default=5, help="bad-canary rollouts (1 row in 20 fails; must roll back)")
    parser.add_argument("--phase-kills", action=argparse.BooleanOptionalAction, default=True,
                        help="good rollouts: also SIGKILL worker <model>-1 in Surging and in Draining")
    parser.add_argument("--rate", type=float, default=100.0, help="keyed requests per second during each rollout")
    parser.add_argument("--keys", type=int, default=500, help="distinct request keys")
    parser.add_argument("--interval", type=float, default=10.0, help="intervalSeconds of each canary step")
    parser.add_argument("--load-s", type=float, default=3.0, help="seconds each version takes to load")
    parser.add_argument("--after", type=float, default=3.0, help="seconds of load after each rollout ended")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds a rollout may take to end")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run that would end past this")
    parser.add_argument("--no-write", action="store_true", help="print only (do not replace the results file)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file (default %(default)s)")
    args = parser.parse_args(argv)
    command = "python bench/bench_rollout.py campaign " + shlex.join(argv)
    began, load_start = time.monotonic(), os.getloadavg()
    print(f"{command}\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load_start[0]:.1f}",
          flush=True)
    kafka = None
    base = Settings()
    tmp = Path(tempfile.mkdtemp(prefix="rollout-campaign-"))
    if os.environ.get("SIE_BOOTSTRAP_SERVERS"):
        settings = base
    else:
        from sie.infra.kafka.local import LocalKafka, free_base_port

        kafka = LocalKafka(base, brokers=1, base_port=free_base_port(2), data_dir=tmp / "kafka", detach=False)
        kafka.up(timeout=180)
        settings = base.with_overrides(bootstrap_servers=kafka.bootstrap_servers)
    runs: list[dict[str, Any]] = []
    campaign = None
    try:
        campaign = Campaign(settings, tmp, args)
        order = [k for i in range(max(args.good, args.bad)) for k, n in (("good", args.good), ("bad", args.bad))
                 if i < n]
        longest = 0.0
        for n, kind in enumerate(order, 1):
            if args.budget_s is not None and time.monotonic() - began + max(longest, 120.0) > args.budget_s:
                print(f"budget: {args.budget_s:g}s would be exceeded by run {n}; stopping", flush=True)
                break
            r = campaign.run(kind, sum(1 for x in runs if x["kind"] == kind) + 1)
            runs.append(r)
            longest = max(longest, r["wall_s"])
            print("\n".join(_run_lines(n, r)), flush=True)
            if "trace" in r:
                print(r["trace"], flush=True)
    finally:
        if campaign is not None:
            campaign.close()
        if kafka is not None:
            kafka.down()
    text = _report(command, runs, load_start, os.getloadavg(), args)
    print(text)
    if not args.no_write:
        args.out.write_text(text, encoding="utf-8")
    return 0 if runs and all(not r["findings"] for r in runs) else 1


def _report(command: str, runs: list[dict[str, Any]], load_start: tuple[float, float, float],
            load_end: tuple[float, float, float], args: argparse.Namespace) -> str:
    from bench.common import git_commit, load_line

    def total(key: str) -> int:
        return sum(int(r.get(key) or 0) for r in runs)

    reports = [r["report"] for r in runs if r.get("report") is not None]
    good = [r for r in runs if r["kind"] == "good"]
    bad = [r for r in runs if r["kind"] == "bad"]
    lines = [f"rollout campaign (issue 34), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
             f"{git_commit()}, {os.cpu_count()} CPUs, {load_line(load_start, load_end)}",
             f"command: {command}",
             f"2 sie control + 2 sie agent, one broker; per run a model of its own (python, uploaded by sie apply, "
             f"2 replicas, each version {args.load_s:g}s to load), steps 10/50/100 at {args.interval:g}s, "
             f"{args.rate:g} keyed requests/s over {args.keys} keys",
             "",
             f"ran: {len(good)} good of {args.good} asked (worker SIGKILL at 10 %, leader SIGKILL at 50 %"
             + (", a worker SIGKILL in Surging and in Draining" if args.phase_kills else "")
             + f"), {len(bad)} bad of {args.bad} asked (1 row in 20 fails)",
             f"good Complete: {sum(1 for r in good if r.get('phase') == 'Complete')}/{len(good)}; "
             f"bad RolledBack: {sum(1 for r in bad if r.get('phase') == 'RolledBack')}/{len(bad)}",
             f"requests {total('requests')}, lost {total('lost')}, duplicated {total('duplicated')}",
             f"answers off their epoch's weight {sum(len(x.off_weight) for x in reports)}, keys flipping back "
             f"{sum(len(x.flip_back) for x in reports)}, canary answers before its canary step "
             f"{sum(len(x.canary_before_step) for x in reports)} (over {sum(x.answers for x in reports)} results + "
             f"{sum(x.dead_letters for x in reports)} dead letters, each checked)",
             f"runs with findings: {sum(1 for r in runs if r['findings'])}",
             ""]
    for n, r in enumerate(runs, 1):
        lines += _run_lines(n, r)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
