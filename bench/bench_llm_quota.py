"""LLM quotas (policy delay) and streaming: does a caller over its quota slow the others, and what does
streaming cost?  Same run, same fake LLM server (its own process), real broker, LLMScorer in-process.

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_llm_quota.py [--duration 20] [--rate 20]
        [--slots 8] [--mean-s 0.2] [--p99-s 1.0] [--greedy 300] [--greedy-tokens-per-s 70]
        [--runs "alone,delay,no quota,alone streamed"]

A "polite" caller sends ``--rate`` requests/s for ``--duration`` s to a server of ``--slots`` x ``1/mean``
requests/s (8 / 0.2 s = 40/s by default: half of it is the polite caller's).  Scenarios, each on fresh topics:

* ``alone``: only the polite caller;
* ``delay``: plus a "greedy" caller with a backlog of ``--greedy`` requests (7 tokens each: far over
  its ``--greedy-tokens-per-s`` quota) at the start, ``quotas.policy: delay`` (its held requests move to the
  deferred topic: ``sie.streams.llm.defer``);
* ``delay in window``: the same with ``defer: false`` (held requests stay in the window: the old behaviour);
* ``no quota``: the same two callers, no quotas (the greedy backlog competes for the server's slots);
* ``alone streamed``: ``alone`` with ``stream: true`` (time to first token; the cost of reading events).

Per caller: committed results, ``queue_ms`` p50/p99 (from the request's timestamp to its dispatch: the
wait for quota and for a slot) and the visible latency p50/p99 (request timestamp to the committed
result's timestamp: includes waiting behind an unfinished head of its partition).  Results:
bench/results/llm_quota.txt, with the load average (2 shared cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_llm  # noqa: E402  (its sibling: run as a script, bench/ is on sys.path)
import orjson  # noqa: E402

from sie.kernel.settings import Settings  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402
from tests.support.llm_fixtures import llm_spec  # noqa: E402
from tests.support.scorer_fixtures import CommittedReader, group_members, produce_requests, topics_for  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1)))] if values else float("nan")


def _value(caller: str, i: int) -> bytes:
    return orjson.dumps({"id": f"{caller}{i}", "inputs": {"question": f"q {i}"}, "metadata": {"caller": caller}})


def scenario(settings: Settings, url: str, args: argparse.Namespace, greedy: int, **config) -> dict:
    from sie.streams.llm.config import LLMConfig
    from sie.streams.llm.stage import LLMScorer
    from sie.streams.scorer.config import ScorerConfig

    spec = llm_spec([{"url": url, "concurrency": args.slots}], request_timeout_s=60, **config)
    topics_for(settings, spec)
    scorer = LLMScorer(ScorerConfig(settings=settings, spec=spec, instance="bench"),
                       LLMConfig.from_backend_config(spec.backend.config))
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: scorer.run(stop, ready.set), daemon=True)
    thread.start()
    ready.wait(60)
    reader = CommittedReader(settings, spec.topics.results)
    try:
        # the group has its member (asked of the broker: the scorer's consumer is its own thread's alone)
        wait_until(lambda: group_members(settings, spec.group_id) == 1, 60, message="the scorer in its group")
        greedy_at_ms = time.time() * 1000.0
        if greedy:
            produce_requests(settings, spec.topics.requests,
                             [(f"g{i}".encode(), _value("greedy", i)) for i in range(greedy)])
        from confluent_kafka import Producer

        producer = Producer(settings.kafka_client_config(**{"acks": "all", "linger.ms": 1}))
        n = int(args.rate * args.duration)
        sent_ms: dict[str, float] = {}
        t0 = time.monotonic()
        for i in range(n):  # the polite caller's steady rate
            time.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))  # pacing the offered load
            sent_ms[f"polite{i}"] = time.time() * 1000.0
            producer.produce(spec.topics.requests, _value("polite", i), f"p{i}".encode())
            producer.poll(0)
        producer.flush(30)
        wait_until(lambda: sum(1 for r in (reader.count(), reader.records)[1] if b'"polite' in r.value()) >= n,
                   args.duration * 4 + 60, message="every polite request answered")
        elapsed = time.monotonic() - t0
        reader.count()
        out: dict = {"elapsed_s": elapsed, "greedy_s": 0.0}
        for caller in ("polite", "greedy"):
            recs = [r for r in reader.records if f'"{caller}'.encode() in r.value()]
            docs = [orjson.loads(r.value()) for r in recs]
            visible = [r.timestamp()[1] - sent_ms[d["id"]] for r, d in zip(recs, docs, strict=True) if d["id"] in sent_ms]
            out[caller] = {"n": len(recs), "queue_ms": [d["timings"]["queue_ms"] for d in docs], "visible_ms": visible}
            if caller == "greedy" and recs:  # from its backlog's produce to its last committed result
                out["greedy_s"] = (max(r.timestamp()[1] for r in recs) - greedy_at_ms) / 1000.0
        labels = {"model_id": spec.name}
        m = scorer.metrics
        ttft_n = m.value("sie_llm_ttft_seconds_count", labels)
        gen_n = m.value("sie_llm_generation_seconds_count", labels)
        out["ttft_mean_ms"] = 1000 * m.value("sie_llm_ttft_seconds_sum", labels) / ttft_n if ttft_n else None
        out["gen_mean_ms"] = 1000 * m.value("sie_llm_generation_seconds_sum", labels) / gen_n if gen_n else None
        out["overruns"] = m.value("sie_llm_quota_overruns_total", labels)
        out["deferred"] = m.value("sie_llm_quota_deferred_total", labels)
        return out
    finally:
        stop.set()
        thread.join(60)
        reader.close()
        from confluent_kafka.admin import AdminClient

        from sie.streams.llm.config import deferred_topic

        names = [spec.topics.requests, spec.topics.results, spec.topics.dead_letters, deferred_topic(spec, settings.names)]
        for future in AdminClient(settings.kafka_client_config()).delete_topics([n for n in names if n]).values():
            future.exception(30)  # this run's topics: wait for the broker's answer (a failure is only left over)


def describe(name: str, r: dict, args: argparse.Namespace) -> str:
    p = r["polite"]
    line = (f"{name}: polite {p['n']} answered in {r['elapsed_s']:.1f} s (offered {args.rate}/s for "
            f"{args.duration:.0f} s); queue_ms p50 {_pct(p['queue_ms'], 0.5):.0f} p99 {_pct(p['queue_ms'], 0.99):.0f}; "
            f"visible p50 {_pct(p['visible_ms'], 0.5):.0f} ms p99 {_pct(p['visible_ms'], 0.99):.0f} ms")
    g = r["greedy"]
    if g["n"]:
        line += (f"; greedy {g['n']} answered in {r['greedy_s']:.1f} s = {7 * g['n'] / r['greedy_s']:.0f} tokens/s "
                 f"(quota {args.greedy_tokens_per_s:g}), queue_ms p50 {_pct(g['queue_ms'], 0.5):.0f}; "
                 f"overruns {r['overruns']:.0f}, deferred {r['deferred'] or 0:.0f}")
    if r["ttft_mean_ms"] is not None:
        line += f"; time to first token mean {r['ttft_mean_ms']:.0f} ms of generation mean {r['gen_mean_ms']:.0f} ms"
    elif r["gen_mean_ms"] is not None:
        line += f"; generation mean {r['gen_mean_ms']:.0f} ms"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--mean-s", type=float, default=0.2)
    parser.add_argument("--p99-s", type=float, default=1.0)
    parser.add_argument("--greedy", type=int, default=300)
    parser.add_argument("--greedy-tokens-per-s", type=float, default=70.0)
    parser.add_argument("--runs", default="alone,delay,no quota,alone streamed",
                        help="which scenarios, comma-separated, in this order")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "llm_quota.txt"))
    args = parser.parse_args()
    if not os.environ.get("SIE_BOOTSTRAP_SERVERS"):
        sys.exit("set SIE_BOOTSTRAP_SERVERS to a running broker")
    settings = Settings()
    load = os.getloadavg()
    lines = [f"bench_llm_quota: fake server {args.slots} slots, lognormal mean {args.mean_s} s p99 {args.p99_s} s, "
             f"first token at 20% of the generation; load average at start {load[0]:.2f} {load[1]:.2f} "
             f"{load[2]:.2f} (2 shared cores)"]
    print(lines[0], flush=True)
    quotas = {"policy": "delay", "callers": {"greedy": {"tokens_per_s": args.greedy_tokens_per_s}}}
    known = {"alone": (0, {}), "delay": (args.greedy, {"quotas": quotas}), "no quota": (args.greedy, {}),
             "delay in window": (args.greedy, {"quotas": {**quotas, "defer": False}}),
             "alone streamed": (0, {"stream": True})}
    runs = [(name, *known[name]) for name in args.runs.split(",")]
    def run(url: str, say: Callable[[str], None]) -> None:
        for name, greedy, config in runs:
            say(describe(name, scenario(settings, url, args, greedy, **config), args))

    bench_llm.with_fake_server(args, lines, run)
    return 0

if __name__ == "__main__":
    sys.exit(main())
