"""The real-server tooling without a real server: ``scripts/real_llm/vllm_entry.py`` maps the launcher's real
SGLang command line to ``vllm serve`` (and refuses a flag it cannot map), and what vLLM taught the fake: a
request for a model the server does not serve is a 404 whose message the pool's ejection names."""

from __future__ import annotations

import importlib.util
import queue
import sys
import threading

import pytest

from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.pool import Endpoint, EndpointPool
from sie.streams.llm.protocols import LLMMapping, Protocol
from sie.workers.backends.base import BackendConfig
from sie.workers.sglang_launcher import build_launch
from tests.fakes import fake_llm_server
from tests.support.helpers import REPO_ROOT, wait_until

_spec = importlib.util.spec_from_file_location("vllm_entry", REPO_ROOT / "scripts" / "real_llm" / "vllm_entry.py")
assert _spec is not None and _spec.loader is not None
vllm_entry = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_entry)


def test_the_launchers_command_line_becomes_vllm_serve():
    entry = ["/venv/bin/python", "vllm_entry.py", "--enforce-eager"]  # the node's own vLLM flag, in its entry
    config = BackendConfig(type="sglang", model_path="/models/tiny", model_id="llm-x:1", config={
        "server_entry": entry, "max_seq_len": 512, "extra_args": ["--max-running-requests", "4", "--dtype", "float32"]})
    argv = list(build_launch(config, port=31000, free_mb=lambda _i: None, python=sys.executable).argv)
    assert argv[:3] == entry
    out = vllm_entry.vllm_argv(argv[2:], "/venv/bin/vllm")
    assert out[:3] == ["/venv/bin/vllm", "serve", "/models/tiny"]
    pairs = {out[i]: out[i + 1] for i in range(3, len(out) - 1, 2)}
    assert pairs == {"--host": "127.0.0.1", "--port": "31000", "--tensor-parallel-size": "1",
                     "--served-model-name": "llm-x", "--max-model-len": "512", "--max-num-seqs": "4",
                     "--dtype": "float32"}
    assert out[-1] == "--enforce-eager"  # before --model-path: the entry's own, passed through


def test_a_flag_without_a_vllm_meaning_is_refused_by_name():
    with pytest.raises(SystemExit, match="--chunked-prefill-size has no vLLM mapping"):
        vllm_entry.vllm_argv(["--model-path", "m", "--chunked-prefill-size", "512"], "vllm")
    with pytest.raises(SystemExit, match="--model-path is required"):
        vllm_entry.vllm_argv(["--port", "1"], "vllm")


def test_a_wrong_model_name_ejects_the_endpoint_with_the_servers_own_message():
    """vLLM answers a ``model`` it does not serve with 404 and a message naming the valid one; the fake does the
    same when given ``--served-model-name``.  Not the request's fault: the endpoint is ejected (never a dead
    letter) and its last error says what to fix."""
    srv = fake_llm_server.serve(fake_llm_server.parse(["--slots", "2", "--mean-s", "0.01", "--p99-s", "0.02",
                                                       "--served-model-name", "tiny"]))
    url = f"http://127.0.0.1:{srv.server_port}"
    pool = EndpointPool([Endpoint(url, 2)], backoff_s=0.01, backoff_max_s=0.05)
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    wrong = Protocol("openai-completions", LLMMapping([("answer", "string")], {}), {})  # asks for "default"
    d = Dispatcher(pool, wrong, 1, stop, on_done=done.put, is_current=lambda job: True)
    d.start()
    try:
        d.submit(Job(("req", 0), 0, 0, None, wrong.request("hello", "r0")))
        wait_until(lambda: "does not exist" in pool.endpoints[0].last_error, 10,
                   message=lambda: f"the ejection's reason (have {pool.endpoints[0].last_error!r})")
        assert "HTTP 404 on /v1/completions: The model `default` does not exist" in pool.endpoints[0].last_error
        assert done.empty()  # not answered, not dead-lettered: it waits for a server that serves it
    finally:
        stop.set()
        d.close()
        srv.shutdown()
    right = Protocol("openai-completions", LLMMapping([("answer", "string")], {}), {"served_model_name": "tiny"})
    assert right.request("hello", "r")["model"] == "tiny"
