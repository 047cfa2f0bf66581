"""The LLM path's edges against a REAL vLLM 0.32.0 server on CPU (issue 41): a streamed event carrying raw
U+0085/U+2028/U+2029 inside its JSON string is read whole (httpx's ``iter_lines`` cut it and the window
dead-lettered a valid generation), and the example spec ``examples/llm/tiny-vllm.yaml`` passes ``sie validate
--load`` and answers ``sie predict`` with one real request through its configured protocol.

The prompt produces the characters for certain: ``echo: true`` makes vLLM stream the prompt back as the start
of the completion text (a random model's own output carries them only now and then).  One server for the
module; skips, saying why, where vLLM is not installed (``scripts/real_llm/setup.sh``)."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from sie.cli import main
from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.pool import Endpoint, EndpointPool
from sie.streams.llm.protocols import LLMMapping, Protocol, sse_lines
from tests.support.helpers import REPO_ROOT
from tests.support.real_llm import SERVED_NAME, VLLMServer, require_vllm

pytestmark = pytest.mark.real_llm

ODD = "one\u0085two\u2028three\u2029four"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = VLLMServer(tmp_path_factory.mktemp("vllm"), max_num_seqs=8, install=require_vllm()).start()
    try:
        yield s.wait_ready()
    finally:
        s.kill()


def test_a_streamed_event_with_nel_and_line_separators_in_its_text_is_one_event(server):
    proto = Protocol("openai-completions", LLMMapping([("answer", "string")], {}),
                     {"stream": True, "served_model_name": SERVED_NAME, "extra_body": {"echo": True, "ignore_eos": True},
                      "sampling_params": {"max_new_tokens": 4}})
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    d = Dispatcher(EndpointPool([Endpoint(server.url, 1)]), proto, 1, stop, on_done=done.put,
                   is_current=lambda job: True)
    d.start()
    try:
        d.submit(Job(("req", 0), 0, 0, None, proto.request(ODD, "r0")))
        job = done.get(timeout=120)
    finally:
        stop.set()
        d.close()
    # the server sends the characters raw (not as \u escapes): this is the stream httpx's iter_lines cut in two
    with httpx.stream("POST", f"{server.url}/v1/completions", json=proto.request(ODD, "raw"), timeout=60) as raw:
        body = raw.read()
    assert "\u0085".encode() in body and "\u2028".encode() in body
    assert len(list(httpx.Response(200, content=body).iter_lines())) > len(list(sse_lines([body])))
    assert job.error is None, job.error  # before: "streamed an event that is not JSON"
    assert job.generation is not None and job.generation.text.startswith(ODD)
    assert job.generation.completion_tokens == 4 and job.first_token is not None


def test_the_example_spec_validates_and_predicts_against_the_real_server(server, tmp_path, monkeypatch, capsys):
    doc = yaml.safe_load((REPO_ROOT / "examples" / "llm" / "tiny-vllm.yaml").read_text(encoding="utf-8"))
    doc["spec"]["backend"]["config"]["endpoints"][0]["url"] = server.url  # the README's port 8000, here a free one
    spec = Path(tmp_path) / "tiny-vllm.yaml"
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    monkeypatch.setenv("SIE_SGLANG_ENDPOINTS", "127.0.0.1")
    assert main(["validate", "--load", "-f", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"one request answered by {server.url}" in out and "(" in out and "8 completion tokens" in out
    assert main(["predict", "-f", str(spec), "--input", json.dumps({"question": "why is the sky blue?"})]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "ok" and result["usage"]["completion_tokens"] == 8
    assert result["outputs"]["completion_tokens"] == 8 and isinstance(result["outputs"]["answer"], str)
    assert 0 <= result["timings"]["first_token_ms"] <= result["timings"]["inference_ms"]
