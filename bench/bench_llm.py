"""LLM requests through Kafka: the continuous in-flight window vs the Little's-law bound and vs the batch
path, in the same run, against the fake LLM server (its own process) on a real broker.

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_llm.py [--duration 45] [--warmup 10]
        [--slots 64] [--mean-s 1.0] [--p99-s 5.0] [--batch-sizes 1024,64]

The server runs ``--slots`` generations at once (more wait in its queue, as in SGLang's scheduler), each
lognormal with the given mean and p99.  Little's law bounds any client at ``slots / mean`` requests/s.
Each path scores its own fresh topics (4 partitions) from a backlog large enough for the whole run:

* ``window``: ``LLMScorer`` (sie.streams.llm), concurrency = slots, commit cadence 100 ms;
* ``batch(max_batch=N)``: the current scorer (``run_scorer``) over the SGLang backend pointed at the same
  server with ``max_concurrency`` = slots threads: a batch of up to N rows is generated, then committed.

Throughput is measured on committed results (read_committed) in the ``duration`` seconds after a
``warmup``, between the first and the last change of the committed count (``measure``).  The window's broker-side transaction time
(produce + send_offsets + commit of one prefix) is reported as p50/p99.
Results: bench/results/llm.txt (with the load average at the start: 2 shared cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from sie.kernel.settings import Settings  # noqa: E402
from tests.llm_fixtures import FakeLLMProcess, llm_spec  # noqa: E402
from tests.scorer_fixtures import CommittedReader, produce_requests, topics_for  # noqa: E402


def backlog(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 509}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"question": f"question {i}"}}))
            for i in range(n)]


def measure(settings: Settings, spec, start, warmup: float, duration: float) -> float:
    """Committed results/s after ``warmup`` s, over ``duration`` s, after ``start()`` (it starts the scorer
    and returns its stop function).  Rate between the first and the last moment the committed count
    changed in the window: a batch path commits in steps of up to ``max_batch`` results, and a rate from
    fixed window edges would be off by up to a batch (falls back to the edges with fewer than 2 steps)."""
    reader = CommittedReader(settings, spec.topics.results)
    try:
        stop = start()
        time.sleep(warmup)  # a benchmark's warm-up, not a synchronisation
        c0, t0 = reader.count(), time.monotonic()
        steps: list[tuple[float, int]] = []
        last = c0
        while time.monotonic() - t0 < duration:
            time.sleep(0.1)  # sampling the committed count
            c = reader.count()
            if c != last:
                steps.append((time.monotonic(), c))
                last = c
        end = time.monotonic()
        stop()
        if len(steps) >= 3:
            (ta, ca), (tb, cb) = steps[0], steps[-1]
            return (cb - ca) / (tb - ta)
        return (last - c0) / (end - t0)
    finally:
        reader.close()


def run_window(settings: Settings, url: str, slots: int, n: int, warmup: float, duration: float) -> dict:
    from sie.streams.llm.config import LLMConfig
    from sie.streams.llm.stage import LLMScorer
    from sie.streams.scorer.config import ScorerConfig

    spec = llm_spec([{"url": url, "concurrency": slots}], request_timeout_s=120, output_mode="text")
    topics_for(settings, spec)
    produce_requests(settings, spec.topics.requests, backlog(n))
    scorer = LLMScorer(ScorerConfig(settings=settings, spec=spec, instance="bench"),
                       LLMConfig.from_backend_config(spec.backend.config))
    stop = threading.Event()
    ready = threading.Event()
    thread = threading.Thread(target=lambda: scorer.run(stop, ready.set), daemon=True)

    def start():
        thread.start()
        ready.wait(60)

        def halt():
            stop.set()
            thread.join(60)
        return halt

    rate = measure(settings, spec, start, warmup, duration)
    txn = sorted(scorer.txn_times)
    return {"rate": rate, "txn_p50_ms": 1000 * statistics.median(txn) if txn else None,
            "txn_p99_ms": 1000 * txn[int(0.99 * (len(txn) - 1))] if txn else None, "txns": len(txn)}


def run_batch(settings: Settings, url: str, slots: int, n: int, max_batch: int, warmup: float,
              duration: float) -> dict:
    from sie.streams.scorer import ScorerConfig, run_scorer
    from sie.workers.backends import backend_config_from_spec, create_backend

    spec = llm_spec([url], max_concurrency=slots, output_mode="text")
    # the batch path's own spelling of "that server": server_url
    spec.backend.config.pop("endpoints", None)
    spec.backend.config["server_url"] = url
    topics_for(settings, spec)
    produce_requests(settings, spec.topics.requests, backlog(n))
    config = ScorerConfig(settings=settings, spec=spec, instance="bench", max_batch=max_batch, max_wait_ms=50,
                          transaction_timeout_ms=300_000, max_poll_interval_ms=600_000)
    stop = threading.Event()
    ready = threading.Event()

    def factory(model_spec):
        backend = create_backend(backend_config_from_spec(model_spec))
        backend.load()
        return backend

    thread = threading.Thread(target=lambda: run_scorer(config, factory, stop, on_ready=lambda _s: ready.set()),
                              daemon=True)

    def start():
        thread.start()
        ready.wait(120)

        def halt():
            stop.set()
            thread.join(120)
        return halt

    rate = measure(settings, spec, start, warmup, duration)
    return {"rate": rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=45.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--mean-s", type=float, default=1.0)
    parser.add_argument("--p99-s", type=float, default=5.0)
    parser.add_argument("--batch-sizes", default="1024,64")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "llm.txt"))
    args = parser.parse_args()
    if not os.environ.get("SIE_BOOTSTRAP_SERVERS"):
        sys.exit("set SIE_BOOTSTRAP_SERVERS to a running broker")
    settings = Settings()  # SIE_* from the environment
    load = os.getloadavg()
    bound = args.slots / args.mean_s
    n = int(bound * (args.warmup + args.duration) * 1.5) + 2000
    lines = [f"bench_llm: fake server {args.slots} slots, lognormal mean {args.mean_s} s p99 {args.p99_s} s; "
             f"Little's-law bound {bound:.1f} req/s; warmup {args.warmup:.0f} s, measured {args.duration:.0f} s; "
             f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 shared cores)"]
    print(lines[0], flush=True)
    def run(url: str, say: Callable[[str], None]) -> None:
        w = run_window(settings, url, args.slots, n, args.warmup, args.duration)
        say(f"window: {w['rate']:.1f} req/s = {100 * w['rate'] / bound:.0f}% of the bound; transaction "
            f"p50 {w['txn_p50_ms']:.1f} ms p99 {w['txn_p99_ms']:.1f} ms over {w['txns']} transactions")
        for size in [int(s) for s in args.batch_sizes.split(",") if s]:
            b = run_batch(settings, url, args.slots, n, size, args.warmup, args.duration)
            say(f"batch(max_batch={size}, {args.slots} threads): {b['rate']:.1f} req/s = "
                f"{100 * b['rate'] / bound:.0f}% of the bound; window/batch = "
                f"{w['rate'] / b['rate'] if b['rate'] else float('inf'):.2f}x")

    with_fake_server(args, lines, run)
    return 0


def with_fake_server(args: argparse.Namespace, lines: list[str], run: Callable[[str, Callable[[str], None]], None],
                     ) -> None:
    """Start the fake server (``args.slots``, ``mean_s``, ``p99_s``), ``run(url, say)`` (``say`` prints a
    line and keeps it), stop the server, write ``lines`` and the load average at the end to ``args.out``."""
    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as tmp:
        server = FakeLLMProcess("--slots", str(args.slots), "--mean-s", str(args.mean_s), "--p99-s", str(args.p99_s),
                                log_dir=Path(tmp))
        try:
            run(server.url, say)
        finally:
            server.kill()
    lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")

if __name__ == "__main__":
    sys.exit(main())
