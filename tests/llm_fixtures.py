"""LLM specs and the fake LLM server for the window's tests and the bench."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO / "tests" / "fakes" / "fake_llm_server.py"


def llm_spec_doc(endpoints: list[Any], name: str | None = None, protocol: str = "sglang",
                 **config: Any) -> dict[str, Any]:
    """A ModelService served through the window: one string input, a text answer plus token counts."""
    name = name or f"llm-{uuid.uuid4().hex[:10]}"
    return {
        "apiVersion": "sie.lmsys.org/v1",
        "kind": "ModelService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},
            "priorityLevel": "P1",
            "serviceType": "generation",
            "backend": {"type": "sglang", "model_path": "fake/model",
                        "config": {"endpoints": endpoints, "protocol": protocol, **config}},
            "resources": {"gpuMemoryMb": 0, "cpu": 0.5},
            "inputSchema": {"type": "json", "fields": [{"name": "question", "type": "string"}]},
            "outputSchema": {"type": "json", "fields": [{"name": "answer", "type": "string"},
                                                        {"name": "completion_tokens", "type": "int"}]},
            "sla": {"p99_latency_ms": 10_000},
            "exampleInput": {"question": "hi"},
        },
    }


def llm_spec(endpoints: list[Any], name: str | None = None, protocol: str = "sglang", **config: Any):
    from sie.schemas.spec import parse_spec

    return parse_spec(llm_spec_doc(endpoints, name, protocol, **config))


def write_llm_spec(directory: Path, endpoints: list[Any], **kw: Any) -> Path:
    doc = llm_spec_doc(endpoints, **kw)
    path = directory / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeLLMProcess:
    """``tests/fakes/fake_llm_server.py`` as a child process (killable like a real server)."""

    def __init__(self, *args: str, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"fake-llm-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(self.port), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"fake LLM server did not start: {self.log_path.read_text()[-2000:]}") from exc
                time.sleep(0.05)  # polling a port that is not bound yet: there is nothing to wait on

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
