"""Streaming: the three protocols' server-sent events read into the same Generation as without streaming
(against the fake LLM server in this process, on real HTTP), time to first token measured by the
dispatcher and exported by the scorer, a stream cut before [DONE] re-dispatched, a bad event an error."""

from __future__ import annotations

import queue
import threading

import httpx
import orjson
import pytest

from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.pool import Endpoint, EndpointPool
from sie.streams.llm.protocols import BadOutput, LLMMapping, Protocol, StreamReader
from tests.fakes import fake_llm_server
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, question

TEXT = [("answer", "string"), ("completion_tokens", "int")]
SSE = {"content-type": "text/event-stream"}


@pytest.fixture(scope="module")
def server():
    args = fake_llm_server.parse(["--slots", "8", "--mean-s", "0.2", "--p99-s", "0.4", "--ttft-frac", "0.5"])
    srv = fake_llm_server.serve(args)
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def dispatch(url: str, protocol: Protocol, prompts: list[str]) -> list[Job]:
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    d = Dispatcher(EndpointPool([Endpoint(url, 4)]), protocol, 4, stop, on_done=done.put,
                   is_current=lambda job: True)
    d.start()
    try:
        for i, p in enumerate(prompts):
            d.submit(Job(("req", 0), i, 0, None, protocol.request(p, f"r{i}")))
        jobs = [done.get(timeout=10) for _ in prompts]
    finally:
        stop.set()
        d.close()
    return sorted(jobs, key=lambda j: j.offset)


@pytest.mark.parametrize("name", ["sglang", "openai-completions", "openai-chat"])
def test_a_streamed_answer_is_the_same_generation_and_its_first_token_is_timed(server, name):
    plain = Protocol(name, LLMMapping(TEXT, {}), {})
    streamed = Protocol(name, LLMMapping(TEXT, {}), {"stream": True})
    body = streamed.request("how are you today", "r")
    assert body["stream"] is True
    if name != "sglang":  # the token counts come in a last chunk only when asked for
        assert body["stream_options"] == {"include_usage": True} and "stream" not in plain.request("x", "r")
    prompts = [f"question number {i} here" for i in range(3)]
    want = dispatch(server, plain, prompts)
    got = dispatch(server, streamed, prompts)
    for w, g in zip(want, got, strict=True):
        assert g.error is None and g.generation is not None, g.error
        assert (g.generation.text, g.generation.prompt_tokens, g.generation.completion_tokens) == \
            (w.generation.text, w.generation.prompt_tokens, w.generation.completion_tokens)
        assert w.first_token is None  # not streamed: no first token to time
        # the fake sends its first token after half the generation time, the last at its end
        assert g.first_token is not None and g.sent < g.first_token < g.finished
        assert g.first_token - g.sent < 0.8 * (g.finished - g.sent)


def test_stream_events_are_read_per_protocol():
    chat = StreamReader(Protocol("openai-chat", LLMMapping(TEXT, {}), {"stream": True}))
    lines = ['data: {"choices": [{"delta": {"role": "assistant"}}]}', "",  # no text yet: not the first token
             'data: {"choices": [{"delta": {"content": "Hel"}}]}', ": keep-alive comment",
             'data: {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}',
             'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}', "data: [DONE]"]
    assert [chat.feed(line) for line in lines] == [False, False, True, False, True, False, False]
    gen = chat.result()
    assert chat.done and (gen.text, gen.prompt_tokens, gen.completion_tokens) == ("Hello", 5, 2)
    assert gen.meta == {"finish_reason": "stop"}
    sglang = StreamReader(Protocol("sglang", LLMMapping(TEXT, {}), {"stream": True}))
    assert sglang.feed('data: {"text": "", "meta_info": {}}') is False
    assert sglang.feed('data: {"text": "a b", "meta_info": {"prompt_tokens": 2, "completion_tokens": 2}}')
    assert sglang.feed("data: [DONE]") is False and sglang.result().text == "a b"
    with pytest.raises(BadOutput, match="not JSON"):
        sglang.feed("data: {oops")


def test_a_stream_cut_before_done_is_sent_again_a_bad_or_error_event_is_an_error_a_whole_body_is_read():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        text = orjson.loads(request.read())["text"]
        if text == "bad":
            return httpx.Response(200, headers=SSE, content=b"data: [1, 2]\n\ndata: [DONE]\n\n")
        if text == "aborted":  # SGLang's error event mid-stream
            return httpx.Response(200, headers=SSE, content=b'data: {"text": "par"}\n\n'
                                  b'data: {"error": {"message": "aborted: out of memory"}}\n\ndata: [DONE]\n\n')
        answer = {"text": "ok", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}}
        if text == "whole":  # a server that ignores "stream": one JSON body
            return httpx.Response(200, json=answer)
        events = b"data: " + orjson.dumps(answer) + b"\n\n"
        if calls["n"] == 1:  # the first answer is cut: no [DONE]
            return httpx.Response(200, headers=SSE, content=events)
        return httpx.Response(200, headers=SSE, content=events + b"data: [DONE]\n\n")

    proto = Protocol("sglang", LLMMapping(TEXT, {}), {"stream": True})
    pool = EndpointPool([Endpoint("http://e", 2)], backoff_s=0.01, backoff_max_s=0.02)
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    d = Dispatcher(pool, proto, 1, stop, on_done=done.put, is_current=lambda job: True,
                   client=httpx.Client(transport=httpx.MockTransport(handler)))
    d.start()
    try:
        d.submit(Job(("req", 0), 0, 0, None, proto.request("fine", "r0")))
        ok = done.get(timeout=10)
        assert ok.generation is not None and ok.generation.text == "ok" and ok.attempts == 2
        assert pool.endpoints[0].served >= 1 and "_Incomplete" in pool.endpoints[0].last_error
        d.submit(Job(("req", 0), 1, 0, None, proto.request("bad", "r1")))
        bad = done.get(timeout=10)
        assert bad.generation is None and "not a JSON object" in (bad.error or "")
        d.submit(Job(("req", 0), 2, 0, None, proto.request("aborted", "r2")))
        aborted = done.get(timeout=10)
        assert aborted.generation is None and "streamed an error" in (aborted.error or "")
        assert "out of memory" in (aborted.error or "")
        d.submit(Job(("req", 0), 3, 0, None, proto.request("whole", "r3")))
        whole = done.get(timeout=10)
        assert whole.generation is not None and whole.generation.text == "ok" and whole.first_token is None
    finally:
        stop.set()
        d.close()


def test_the_scorer_exports_time_to_first_token_of_streamed_requests_and_commits_once():
    def handler(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.read())
        assert body["stream"] is True
        first = orjson.dumps({"text": "answer", "meta_info": {"prompt_tokens": 3, "completion_tokens": 1}})
        done = orjson.dumps({"text": "answer to it", "meta_info": {"prompt_tokens": 3, "completion_tokens": 3}})
        return httpx.Response(200, headers=SSE,
                              content=b"data: " + first + b"\n\ndata: " + done + b"\n\ndata: [DONE]\n\n")

    h = Harness([question(i) for i in range(6)], handler, stream=True)
    try:
        wait_until(h.all_committed, 10, message="all committed")
        h.close()
        results = h.visible(h.spec.topics.results)
        assert ids(results) == {f"q{i}": 1 for i in range(6)}
        doc = orjson.loads(results[0][1])
        assert doc["outputs"]["answer"] == "answer to it" and doc["usage"]["completion_tokens"] == 3
        for _t, value, _k, _h in results:  # the first token's time in the result too (issue 41), not only a metric
            timings = orjson.loads(value)["timings"]
            assert 0 <= timings["first_token_ms"] <= timings["inference_ms"]
        labels = {"model_id": h.spec.name}
        assert h.scorer.metrics.value("sie_llm_ttft_seconds_count", labels) == 6
        assert h.scorer.metrics.value("sie_tokens_total", {**labels, "kind": "completion"}) == 18
    finally:
        h.stop.set()
