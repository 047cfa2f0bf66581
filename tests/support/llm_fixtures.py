"""LLM specs and the fake LLM server for the window's tests and the bench."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.support.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVER = REPO / "tests" / "fakes" / "fake_llm_server.py"


def llm_spec_doc(endpoints: list[Any], name: str | None = None, protocol: str = "sglang", sla: dict | None = None,
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
            "sla": {"p99_latency_ms": 10_000, **(sla or {})},
            "exampleInput": {"question": "hi"},
        },
    }


def llm_spec(endpoints: list[Any], name: str | None = None, protocol: str = "sglang", sla: dict | None = None,
             **config: Any):
    from sie.schemas.spec import load

    return load(llm_spec_doc(endpoints, name, protocol, sla, **config))


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

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"fake LLM server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(listening, timeout=20,
                   message=lambda: f"the fake LLM server to listen: {self.log_path.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


# --- the LLM scorer on fake Kafka clients and fake endpoints (unit tests) ------------------------------------

import threading  # noqa: E402
from collections import Counter  # noqa: E402

import httpx  # noqa: E402
import orjson  # noqa: E402

from tests.fakes.kafka_clients import NOW_MS, FakeAdmin, FakeConsumer, FakeMessage, FakeProducer, fake_clients  # noqa: E402


def question(i: int, text: str | None = None) -> bytes:
    return orjson.dumps({"id": f"q{i}", "inputs": {"question": text or f"question {i} please"}})


def sglang_answer(request: httpx.Request) -> httpx.Response:
    body = orjson.loads(request.read())
    return httpx.Response(200, json={"text": "answer to " + body["text"],
                                     "meta_info": {"prompt_tokens": 3, "completion_tokens": 4}})


def settled_group(topics: dict[str, int]) -> FakeAdmin:
    """The broker describes the fake consumer's group as stable with the fake consumer alone in it, owning every
    partition of ``topics`` (a hand-over then keeps the static membership, ``sie.streams.eos.stage.leaves_group``)."""
    from confluent_kafka import ConsumerGroupState

    return FakeAdmin(topics=topics, groups={"*": (ConsumerGroupState.STABLE, ["fake-member"])})


class Harness:
    """An LLMScorer on a thread over ``values`` spread round-robin on ``partitions`` partitions."""

    def __init__(self, values, handler, partitions=1, faults=None, concurrency=4, consumer_class=FakeConsumer,
                 endpoints=None, stop: threading.Event | None = None, headers=None, sla=None, ts_ms=NOW_MS,
                 wall_clock=None, **cfg) -> None:
        self.spec = llm_spec(endpoints or [{"url": "http://fake", "concurrency": concurrency}], sla=sla,
                             commit_interval_ms=20, **cfg)
        topic = self.spec.topics.requests
        self.records = [FakeMessage(topic, i % partitions, i // partitions, f"k{i}".encode(), v, ts_ms,
                                    headers[i] if headers else None)
                        for i, v in enumerate(values)]
        self.n = len(values)
        self.stop = stop if stop is not None else threading.Event()
        self.consumer = consumer_class(self.records, partitions={topic: partitions})
        self.producers: list[FakeProducer] = []

        def make_producer(_cfg):
            self.producers.append(FakeProducer(faults, consumer=self.consumer))
            return self.producers[-1]

        from sie.kernel.settings import Settings
        from sie.streams.llm.config import LLMConfig
        from sie.streams.llm.stage import LLMScorer
        from sie.streams.scorer.config import ScorerConfig

        config = ScorerConfig(settings=Settings(), spec=self.spec, instance="t-0", retry_backoff_s=0.0)
        self.scorer = LLMScorer(config, LLMConfig.from_backend_config(self.spec.backend.config),
                                clients=fake_clients(consumer=self.consumer, producer=make_producer,
                                                     admin=settled_group({topic: partitions})).clients,
                                http_client=httpx.Client(transport=httpx.MockTransport(handler)),
                                wall_clock=wall_clock or (lambda: NOW_MS / 1000 + 0.5))
        self.summary = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.summary = self.scorer.run(self.stop)

    def visible(self, topic=None):
        return [r for p in self.producers for r in p.visible if topic is None or r[0] == topic]

    def committed(self, partition=0) -> int:
        return self.consumer.committed_offsets.get((self.spec.topics.requests, partition), 0)

    def all_committed(self, partitions=1) -> bool:
        return sum(self.committed(p) for p in range(partitions)) == self.n

    def close(self):
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()
        return self.summary


def ids(records) -> Counter:
    return Counter(orjson.loads(v)["id"] for _t, v, _k, _h in records)
