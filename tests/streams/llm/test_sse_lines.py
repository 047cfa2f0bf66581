"""Server-sent events end lines only at CR, LF or CRLF (issue 41, item 1): generated text carrying
U+0085 (NEL), U+2028 or U+2029 raw inside a JSON string (vLLM sends them unescaped: valid JSON) must reach
the JSON parser whole.  httpx's ``iter_lines`` splits like ``str.splitlines()`` and cut such an event in
two, dead-lettering a valid generation as "streamed an event that is not JSON"."""

from __future__ import annotations

import json
import queue
import threading

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.pool import Endpoint, EndpointPool
from sie.streams.llm.protocols import LLMMapping, Protocol, sse_lines

TEXT = [("answer", "string"), ("completion_tokens", "int")]
SSE = {"content-type": "text/event-stream"}
ODD = "a\u0085b\u2028c\u2029d\x0be\x0cf\x1cg\x1dh\x1ei"  # every character splitlines() splits at, CR/LF aside


def test_lines_end_only_at_cr_lf_and_crlf():
    body = ('data: {"text": "' + ODD + '"}\r\ndata: x\rdata: y\n\ndata: [DONE]').encode()
    assert list(sse_lines([body])) == ['data: {"text": "' + ODD + '"}', "data: x", "data: y", "", "data: [DONE]"]
    # httpx's own reader cuts the first event (what dead-lettered valid generations)
    cut = list(httpx.Response(200, content=body).iter_lines())
    assert len(cut) > 5 and cut[0] != 'data: {"text": "' + ODD + '"}'


@given(st.lists(st.text(alphabet=st.sampled_from(["a", "\u0085", "\u2028", "\u2029", "é", "\U0001f600", " "]),
                        max_size=12), min_size=1, max_size=5),
       st.sampled_from(["\n", "\r", "\r\n"]), st.integers(min_value=1, max_value=7))
def test_any_chunking_gives_the_same_lines(pieces, eol, size):
    """Chunk boundaries anywhere (inside a multi-byte character, between the CR and LF of a CRLF) change nothing."""
    lines = [f"data: {json.dumps({'text': p}, ensure_ascii=False)}" for p in pieces]
    body = (eol.join(lines) + eol).encode()
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    assert list(sse_lines(chunks)) == lines


@pytest.mark.parametrize("name", ["sglang", "openai-completions", "openai-chat"])
def test_a_streamed_generation_with_nel_and_line_separators_is_its_answer_not_a_dead_letter(name):
    """Through the dispatcher on HTTP, each protocol's event carrying the characters raw, in small chunks."""
    def events() -> list[bytes]:
        if name == "sglang":
            docs = [{"text": ODD[:3], "meta_info": {}},
                    {"text": ODD, "meta_info": {"prompt_tokens": 3, "completion_tokens": 4}}]
        elif name == "openai-completions":
            docs = [{"choices": [{"text": ODD[:3]}]}, {"choices": [{"text": ODD[3:], "finish_reason": "length"}]},
                    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
        else:
            docs = [{"choices": [{"delta": {"content": ODD[:3]}}]},
                    {"choices": [{"delta": {"content": ODD[3:]}, "finish_reason": "length"}]},
                    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
        # orjson writes U+0085/U+2028/U+2029 raw (as vLLM does), not as \u escapes
        return [b"data: " + orjson.dumps(d) + b"\n\n" for d in docs] + [b"data: [DONE]\n\n"]

    def handler(request: httpx.Request) -> httpx.Response:
        body = b"".join(events())
        assert "\u0085".encode() in body
        return httpx.Response(200, headers=SSE, content=[body[i:i + 5] for i in range(0, len(body), 5)])

    proto = Protocol(name, LLMMapping(TEXT, {}), {"stream": True})
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    d = Dispatcher(EndpointPool([Endpoint("http://e", 1)]), proto, 1, stop, on_done=done.put,
                   is_current=lambda job: True, client=httpx.Client(transport=httpx.MockTransport(handler)))
    d.start()
    try:
        d.submit(Job(("req", 0), 0, 0, None, proto.request("p", "r0")))
        job = done.get(timeout=10)
    finally:
        stop.set()
        d.close()
    assert job.error is None, job.error
    assert job.generation is not None and job.generation.text == ODD
    assert (job.generation.prompt_tokens, job.generation.completion_tokens) == (3, 4)
    assert job.first_token is not None
