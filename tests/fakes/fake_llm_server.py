"""A fake LLM server with realistic timing: SGLang's native ``/generate`` and the OpenAI-compatible
``/v1/completions`` and ``/v1/chat/completions``, a lognormal generation time and a concurrency limit.

    python tests/fakes/fake_llm_server.py --port 30000 [--slots 64] [--mean-s 1.0] [--p99-s 5.0]
        [--seed 1] [--fail-after N] [--down-while FILE]

* ``--slots``: how many generations run at once (SGLang's running batch); further requests wait in a
  FIFO queue, as they do in SGLang's scheduler.  Connections are HTTP/1.1 keep-alive.
* the generation time of each request is lognormal with the given mean and p99 (``sigma`` solved from
  ``ln(p99/mean) = z99*sigma - sigma^2/2``), deterministic per ``--seed``;
* a JSON schema (``sampling_params.json_schema`` / ``response_format``) gives a JSON object of the
  schema's properties; else the prompt echoed.  Token counts: words of the prompt / of the text;
* a prompt containing ``POISON-400`` answers 400 (a request the server refuses);
* ``"stream": true``: server-sent events over chunked HTTP/1.1: the first token after ``--ttft-frac`` of
  the generation time, the other words spread over the rest.  ``/generate`` sends SGLang's events (the
  whole answer object with the text so far, cumulative) then ``data: [DONE]``; the OpenAI endpoints send
  ``chat.completion.chunk`` / ``text_completion`` chunks with deltas, a ``usage`` chunk when
  ``stream_options.include_usage`` is set, then ``data: [DONE]``;
* ``--served-model-name N`` (the launcher passes it): the OpenAI endpoints answer a request for another
  ``model`` 404 ``{"error": {"message": "The model `x` does not exist."}}``, as vLLM does;
* ``/health``, ``/health_generate`` 200; ``GET /stats`` -> counters (generated, max concurrent seen).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Z99 = 2.3263478740408408


def lognormal_params(mean_s: float, p99_s: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with this mean and p99 (the smaller sigma of the two solutions)."""
    ratio = math.log(p99_s / mean_s)
    disc = Z99 * Z99 - 2 * ratio
    sigma = Z99 - math.sqrt(disc) if disc > 0 else Z99
    return math.log(mean_s) - sigma * sigma / 2, sigma


def fake_outputs(schema: dict[str, Any], prompt: str) -> str:
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type")
        h = (sum(prompt.encode()) % 1000) / 1000
        out[name] = (h if kind == "number" else len(prompt) if kind == "integer" else h > 0.5
                     if kind == "boolean" else "ok")
    return json.dumps(out)


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mu, self.sigma = lognormal_params(args.mean_s, args.p99_s)
        self.rng = random.Random(args.seed)
        self.slots = threading.Semaphore(args.slots)
        self.lock = threading.Lock()
        self.generated = 0
        self.running = 0
        self.max_running = 0

    def latency(self) -> float:
        with self.lock:
            return self.rng.lognormvariate(self.mu, self.sigma) * self.args.time_scale


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _event(self, doc: Any) -> None:
            self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

        def _stream(self, body: dict[str, Any], text: str, prompt_tokens: int, latency: float) -> None:
            """The answer as server-sent events (module docstring): the generation time was not slept yet."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            words = text.split(" ")
            first = latency * state.args.ttft_frac
            time.sleep(first)  # the fake's time to the first token (what it simulates, not synchronisation)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                     "total_tokens": prompt_tokens + len(words)}
            for n in range(1, len(words) + 1):
                if n > 1:
                    time.sleep((latency - first) / max(1, len(words) - 1))  # the fake's time per further token
                piece = " ".join(words[:n]) if self.path == "/generate" else (" " if n > 1 else "") + words[n - 1]
                last = n == len(words)
                if self.path == "/generate":
                    self._event({"text": piece, "output_ids": list(range(n)),
                                 "meta_info": {"id": body.get("rid"), "prompt_tokens": prompt_tokens,
                                               "completion_tokens": n, "cached_tokens": 0,
                                               "finish_reason": {"type": "stop"} if last else None}})
                elif self.path == "/v1/completions":
                    self._event({"id": "cmpl", "object": "text_completion", "choices": [
                        {"index": 0, "text": piece, "finish_reason": "stop" if last else None}]})
                else:
                    self._event({"id": "chat", "object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"content": piece}, "finish_reason": "stop" if last else None}]})
            if self.path != "/generate" and (body.get("stream_options") or {}).get("include_usage"):
                self._event({"id": "u", "object": "chat.completion.chunk", "choices": [], "usage": usage})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")  # the chunked body's end

        def do_GET(self) -> None:  # noqa: N802
            if self.path in ("/health", "/health_generate"):
                self._send(200, {})
            elif self.path == "/stats":
                self._send(200, {"generated": state.generated, "max_running": state.max_running,
                                 "running": state.running})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            down = state.args.down_while
            if down and os.path.exists(down):  # an outage the test switches: every generation refused, as a
                self._send(503, {"error": {"message": "fake outage: the engine is down"}})  # stopping server does
                return
            if self.path == "/generate":
                prompt = body.get("text")
                raw = (body.get("sampling_params") or {}).get("json_schema")
                schema = json.loads(raw) if raw else None
            elif self.path == "/v1/completions":
                prompt = body.get("prompt")
                schema = None
            elif self.path == "/v1/chat/completions":
                messages = body.get("messages") or [{}]
                prompt = messages[-1].get("content")
                fmt = body.get("response_format") or {}
                schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
            else:
                self._send(404, {"error": f"no route {self.path}"})
                return
            served = state.args.served_model_name
            if self.path != "/generate" and served and body.get("model") != served:  # as vLLM answers it
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError", "param": "model", "code": 404}})
                return
            if not isinstance(prompt, str):
                self._send(400, {"error": "prompt/text is required"})
                return
            if "POISON-400" in prompt:
                self._send(400, {"error": "the request is invalid"})
                return
            text = fake_outputs(schema, prompt) if schema else f"echo: {prompt}"
            with state.slots:  # the running batch: at most --slots generations at once
                with state.lock:
                    state.running += 1
                    state.max_running = max(state.max_running, state.running)
                if body.get("stream") is True:
                    try:
                        self._stream(body, text, len(prompt.split()), state.latency())
                    finally:
                        with state.lock:
                            state.running -= 1
                            state.generated += 1
                    return
                time.sleep(state.latency())  # the generation (a fake: sleeping is what it costs)
                with state.lock:
                    state.running -= 1
                    state.generated += 1
                    fail = state.args.fail_after is not None and state.generated > state.args.fail_after
            if fail:
                self._send(500, {"error": "fake failure"})
                return
            prompt_tokens, completion_tokens = len(prompt.split()), len(text.split())
            if self.path == "/generate":
                self._send(200, {"text": text, "output_ids": list(range(completion_tokens)),
                                 "meta_info": {"id": body.get("rid"), "finish_reason": {"type": "stop"},
                                               "prompt_tokens": prompt_tokens,
                                               "completion_tokens": completion_tokens, "cached_tokens": 0}})
                return
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if self.path == "/v1/completions":
                choice["text"] = text
                self._send(200, {"id": "cmpl", "object": "text_completion", "choices": [choice], "usage": usage})
            else:
                choice["message"] = {"role": "assistant", "content": text}
                self._send(200, {"id": "chat", "object": "chat.completion", "choices": [choice], "usage": usage})

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def serve(args: argparse.Namespace) -> Server:
    """A started server on a daemon thread (in-process use by tests and the bench)."""
    server = Server((args.host, args.port), make_handler(State(args)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--mean-s", type=float, default=1.0)
    parser.add_argument("--p99-s", type=float, default=5.0)
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every generation time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttft-frac", type=float, default=0.2,
                        help="streamed: the first token after this fraction of the generation time")
    parser.add_argument("--fail-after", type=int, default=None, help="answer 500 after N generations")
    parser.add_argument("--down-while", default=None, help="answer every generation 503 while this file exists")
    parser.add_argument("--model-path", default="fake")
    parser.add_argument("--served-model-name", default=None,
                        help="the OpenAI endpoints answer 404 to any other 'model' (as vLLM does)")
    args, _unknown = parser.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    server = Server((args.host, args.port), make_handler(State(args)))
    sys.stdout.write(f"fake_llm_server: serving on {args.host}:{server.server_port}\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
