"""A stdlib HTTP server that speaks the parts of SGLang's native API the SIE adapter uses.

    python tests/fakes/fake_sglang.py --model-path m --host 127.0.0.1 --port 30000 [--starting-requests 3]
        [--exit-after N] [any other sglang.launch_server flag, ignored]

Accepts the same command line as ``python -m sglang.launch_server`` (unknown flags are
ignored and recorded), so the adapter's real launch command can run it.  Behaviour:

* ``/health`` and ``/health_generate`` answer 503 for the first ``--starting-requests``
  health checks ("still loading"), then 200;
* ``POST /generate`` {"text", "sampling_params", "rid"} -> {"text", "output_ids", "meta_info"}.
  With ``sampling_params.json_schema`` the text is a JSON object matching the schema's
  properties (numbers = a deterministic score from the prompt); else an echo of the prompt.
  A list ``text`` gives a list of results (SGLang's batch form);
* ``GET /get_model_info``, ``GET /get_server_info`` (with the parsed args);
* ``POST /crash`` exits the process with code 3 after answering; ``--exit-after N``
  exits with code 4 after N generate requests (a crash under load).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def score_for(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:4], 16) / 0xFFFF


def fake_value(prop: dict[str, Any], text: str) -> Any:
    kind = prop.get("type")
    if kind == "number":
        low, high = prop.get("minimum", 0.0), prop.get("maximum", 1.0)
        return round(low + (high - low) * score_for(text), 6)
    if kind == "integer":
        return len(text)
    if kind == "boolean":
        return score_for(text) > 0.5
    return "ok"


class State:
    def __init__(self, args: argparse.Namespace, unknown: list[str]) -> None:
        self.args = args
        self.unknown = unknown
        self.health_checks = 0
        self.generated = 0
        self.lock = threading.Lock()


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            sys.stderr.write("fake_sglang: " + fmt % args + "\n")

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path in ("/health", "/health_generate"):
                with state.lock:
                    state.health_checks += 1
                    starting = state.health_checks <= state.args.starting_requests
                self._send(503, {"error": "server is starting"}) if starting else self._send(200, {})
            elif self.path == "/get_model_info":
                self._send(200, {"model_path": state.args.model_path, "is_generation": True,
                                 "tokenizer_path": state.args.model_path})
            elif self.path == "/get_server_info":
                self._send(200, {**vars(state.args), "unknown_args": state.unknown, "max_total_num_tokens": 4096,
                                 "health_checks": state.health_checks, "generated": state.generated})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/crash":
                self._send(200, {"crashing": True})
                self.wfile.flush()
                os._exit(3)
            if self.path != "/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            texts = body.get("text")
            if texts is None:
                self._send(400, {"error": "text is required"})
                return
            batch = texts if isinstance(texts, list) else [texts]
            params = body.get("sampling_params") or {}
            schema = params.get("json_schema")
            results = []
            for text in batch:
                start = time.perf_counter()
                if schema:
                    props = json.loads(schema).get("properties", {})
                    out = json.dumps({name: fake_value(prop, text) for name, prop in props.items()})
                else:
                    out = f"echo: {text}"[: int(params.get("max_new_tokens", 128))]
                results.append({
                    "text": out,
                    "output_ids": list(range(len(out))),
                    "meta_info": {"id": body.get("rid") or "r", "finish_reason": {"type": "stop"},
                                  "prompt_tokens": len(text.split()), "completion_tokens": len(out.split()),
                                  "cached_tokens": 0, "e2e_latency": time.perf_counter() - start},
                })
            with state.lock:
                state.generated += len(batch)
                exit_now = state.args.exit_after is not None and state.generated >= state.args.exit_after
            self._send(200, results if isinstance(texts, list) else results[0])
            if exit_now:
                self.wfile.flush()
                os._exit(4)

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--starting-requests", type=int, default=0)
    parser.add_argument("--exit-after", type=int, default=None)
    args, unknown = parser.parse_known_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(State(args, unknown)))
    sys.stderr.write(f"fake_sglang: serving {args.model_path} on {args.host}:{args.port}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
