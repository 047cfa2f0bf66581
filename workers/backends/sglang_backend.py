"""SGLang backend: the Backend interface over one SGLang server process per replica (HTTP on loopback).

NOT YET RUN AGAINST REAL SGLANG: there is no GPU on the development machines.
It speaks SGLang's documented native API and is tested against
``tests/fakes/fake_sglang.py`` (503 while starting, ``/generate`` with
``meta_info``, a crash control).  Run against a real vLLM on CPU with ``protocol: openai-completions``
(an agent-run replica launching it through ``server_entry``: tests/workers/test_agent_real_vllm.py).

Lifecycle (``load``):
  1. build the launch command (``sie.workers.sglang_launcher``: ``--mem-fraction-static`` from the
     replica's absolute budget and the free memory NVML measures right now);
  2. start the server as a child that dies with the worker (PR_SET_PDEATHSIG);
  3. poll ``GET /health_generate`` (503 while starting; 200 after a real one-token generation)
     until ``startup_timeout_s``; a server that exits meanwhile fails the load with its exit cause
     and log tail;
  4. the warm-up/readiness inference of the spec's example input (below).
  ``spec.backend.config.server_url`` skips 1-2 and uses an already running server.

Serving: the agent's worker proves the server with ONE generation through ``infer`` (readiness) and then
serves the replica through the LLM window (``sie.streams.llm``) with ``launched_url`` as an endpoint; the
per-row batch mapping below serves traffic only for ``sie score`` on a spec that names no servers.

Request -> prompt -> output mapping (``infer``), one request per row, in parallel (``max_concurrency``
threads), built and read by the LLM window's own ``sie.streams.llm.protocols`` (one mapping for both paths):
``config.protocol`` ``sglang`` (default: ``POST /generate`` ``{"text", "sampling_params", "rid"}``) or
``openai-completions`` / ``openai-chat`` (vLLM, llama.cpp server; readiness then polls ``/health``, which
only says the server is up, and the warm-up generation is the proof):
  * prompt: ``config.prompt_template.format(**inputs)``, default: the inputs as JSON;
  * ``output_mode: json`` (default unless the only output field besides token counts is one string):
    ``sampling_params.json_schema`` is generated from ``spec.outputSchema`` (types, required,
    ranges), so the server's constrained decoding can only emit e.g. ``{"score": 0.93}``; the text
    is parsed as JSON and each output field is cast to its declared type;
  * ``output_mode: text``: the one string output field receives the generated text;
  * output fields named ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
    ``finish_reason``, ``e2e_latency`` are filled from the answer's token counts / ``meta_info``.
  A row whose text is not valid JSON for the schema raises ``InferenceError`` (the scorer dead-letters
  that row); connection errors while the server process is gone make ``fatal_error()`` non-None,
  which the worker turns into an exit (the agent then restarts the replica).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sie.kernel.settings import child_environment
from sie.streams.llm import protocols as llm_protocols
from sie.workers.backends.base import BackendConfig, BackendError, InferenceError
from sie.workers.process import describe_exit, spawn_child
from sie.workers.sglang_launcher import build_launch

log = logging.getLogger(__name__)

META_FIELDS = llm_protocols.META_FIELDS


class SGLangHttpError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class SGLangClient:
    """The one wrapper for HTTP to an SGLang server: httpx, http(s) only, redirects never followed (a server that
    answers 3xx is an error naming it: a redirect would send the model's prompts to a host no one allowed)."""

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        from urllib.parse import urlsplit

        import httpx

        self.base_url = base_url.rstrip("/")
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise BackendError(f"SGLang server {self.base_url[:80]!r}: only http(s) URLs are used")
        self.timeout_s = timeout_s
        self._http = httpx.Client(follow_redirects=False)

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        import httpx

        try:
            response = self._http.request(method, self.base_url + path, json=body,
                                          timeout=timeout or self.timeout_s)
        except httpx.TransportError as exc:  # refused, reset, timed out: the server's side, like OSError before
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
        if response.is_redirect:
            raise SGLangHttpError(response.status_code, f"redirect to {response.headers.get('location', '?')[:100]!r} "
                                                        "not followed (SIE talks to the server it was given, only)")
        if response.status_code >= 400:
            raise SGLangHttpError(response.status_code, response.text)
        payload = response.content
        if not payload:
            return None
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            return payload.decode("utf-8", "replace")

    def health_generate(self, timeout: float = 10.0, path: str = "/health_generate") -> bool:
        """True once ``path`` answers 200, False on 503 or connection refused (still starting).  SGLang's
        ``/health_generate`` answers 200 after a real one-token generation; an OpenAI-compatible server's
        ``/health`` (vLLM, llama.cpp) says only that it is up, so readiness is proven by the warm-up
        generation that follows (``SGLangBackend.load``)."""
        try:
            self._request("GET", path, timeout=timeout)
            return True
        except SGLangHttpError as exc:
            if exc.status == 503:
                return False
            raise
        except OSError:  # connection refused while the server is still binding its port
            return False

    def generate(self, payload: Mapping[str, Any], path: str = "/generate") -> dict[str, Any]:
        return self._request("POST", path, dict(payload))

    def model_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_model_info")


def output_json_schema(fields: tuple[Any, ...], ranges: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """JSON schema of the output fields, for SGLang's constrained decoding (``sampling_params.json_schema``);
    the same schema the LLM window sends (``sie.streams.llm.protocols``)."""
    return llm_protocols.output_json_schema([(f.name, f.type) for f in fields], ranges)


class SGLangBackend:
    """One SGLang server (child process) per backend instance; see the module docstring for the mapping."""

    def __init__(
        self,
        config: BackendConfig,
        client_factory: Callable[[str], SGLangClient] = SGLangClient,
        spawn: Callable[..., Any] = spawn_child,
    ) -> None:
        self.config = config
        cfg = config.config
        self.device = "cuda" if cfg.get("gpu_indices") else "cpu"
        self._client_factory = client_factory
        self._spawn = spawn
        self._server: Any = None
        #: the URL of the server this backend started (None: none, ``server_url`` names a running one); the
        #: agent's worker serves the replica through the LLM window with it as an endpoint (worker_main)
        self.launched_url: str | None = None
        self._client: SGLangClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._seq = 0
        self._log_path: Path | None = Path(cfg["log_path"]) if cfg.get("log_path") else None
        fields = [(f.name, f.type) for f in config.output_fields]
        protocol = str(cfg.get("protocol") or "sglang")
        try:
            #: prompt and answer mapping, request body and answer shape: the LLM window's own (one mapping)
            self.mapping = llm_protocols.LLMMapping(fields, cfg)
            # a server this backend launches serves the model as the launcher names it (--served-model-name):
            # the OpenAI protocols must ask for that name (vLLM answers any other 404)
            served = cfg.get("served_model_name") or (None if cfg.get("server_url") else config.model_id.split(":")[0])
            self.protocol = llm_protocols.Protocol(protocol, self.mapping, {**cfg, "stream": False,
                                                                            "served_model_name": served})
        except ValueError as exc:
            raise BackendError(f"{config.model_id}: {exc}") from None
        self.output_mode = self.mapping.mode
        self.sampling_params = self.protocol.sampling
        #: the readiness endpoint: SGLang's /health_generate generates; an OpenAI-compatible server's /health
        #: only says it is up, and the warm-up generation (load) is what proves it serves
        self._health_path = "/health_generate" if protocol == "sglang" else "/health"

    # -- lifecycle -------------------------------------------------------------------------------------------
    def load(self) -> None:
        cfg = self.config.config
        url = cfg.get("server_url")
        if not url:
            launch = build_launch(self.config)
            log.info("%s: starting SGLang: %s", self.config.model_id, " ".join(launch.argv))
            # the server (third-party code, the model's own with trust_remote_code) gets no SIE setting: not the
            # worker's Kafka credentials, not any other credential-like variable
            self._server = self._spawn(launch.argv, env=child_environment(os.environ), log_path=self._log_path)
            url = self.launched_url = f"http://127.0.0.1:{launch.port}"
        self._client = self._client_factory(str(url))
        self._pool = ThreadPoolExecutor(max_workers=int(cfg.get("max_concurrency", 16)), thread_name_prefix="sglang")
        self._wait_ready(float(cfg.get("startup_timeout_s", 600)), float(cfg.get("health_poll_interval_s", 0.5)))
        try:
            self.infer([self.config.warmup_input()])
        except InferenceError as exc:
            raise BackendError(f"{self.config.model_id}: SGLang warm-up generation failed: {exc}") from exc

    def _wait_ready(self, timeout_s: float, interval_s: float) -> None:
        assert self._client is not None
        deadline = time.monotonic() + timeout_s
        while True:
            crashed = self.fatal_error()
            if crashed:
                raise BackendError(f"{self.config.model_id}: {crashed}")
            if self._client.health_generate(path=self._health_path):
                return
            if time.monotonic() >= deadline:
                raise BackendError(
                    f"{self.config.model_id}: SGLang at {self._client.base_url} not healthy after {timeout_s:g}s "
                    f"({self._health_path} kept answering 503 or refusing connections); raise "
                    f"spec.backend.config.startup_timeout_s"
                )
            time.sleep(interval_s)  # production polling pace while the server loads weights

    def fatal_error(self) -> str | None:
        """Why this backend can never serve again (its server process exited), else None."""
        if self._server is None:
            return None
        returncode = self._server.poll()
        if returncode is None:
            return None
        cause = describe_exit(returncode).cause
        tail = ""
        if self._log_path is not None and self._log_path.exists():
            tail = " | ".join(self._log_path.read_text(errors="replace").strip().splitlines()[-3:])
        return f"SGLang server (pid {self._server.pid}) {cause}" + (f"; last log lines: {tail}" if tail else "")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._server is not None and self._server.poll() is None:
            self._server.terminate()
            try:
                self._server.wait(timeout=float(self.config.config.get("shutdown_timeout_s", 30)))
            except Exception:
                self._server.kill()
                self._server.wait(timeout=10)
        self._server = None

    # -- inference ---------------------------------------------------------------------------------------------
    def _one(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        assert self._client is not None
        self._seq += 1
        proto = self.protocol
        try:
            prompt = self.mapping.prompt(inputs)
            payload = proto.request(prompt, f"{self.config.config.get('replica_id', 'sie')}-{uuid.uuid4().hex[:12]}")
            try:
                response = self._client.generate(payload, proto.path)
            except SGLangHttpError as exc:
                raise InferenceError(f"SGLang {proto.path}: {exc}") from exc
            except OSError as exc:
                raise InferenceError(f"SGLang {proto.path} unreachable: {exc}") from exc
            return self.mapping.outputs(proto.parse(response))
        except llm_protocols.BadOutput as exc:  # the batch path's error type for a row it cannot answer
            raise InferenceError(str(exc)) from exc

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._client is None or self._pool is None:
            raise InferenceError(f"{self.config.model_id}: backend is not loaded (call load() first)")
        if not inputs:
            return []
        if len(inputs) == 1:
            return [self._one(inputs[0])]
        return list(self._pool.map(self._one, inputs))
