"""A real node agent runs an sglang spec's replica whose server is a REAL vLLM on CPU: the worker launches it
through the launcher's configurable entry point (``server_entry`` = ``scripts/real_llm/vllm_entry.py`` in the
server's own virtualenv, which maps SGLang's launch flags to ``vllm serve``; the node allows that entry with
``SIE_SGLANG_SERVER_ENTRIES``), proves readiness with a real generation (``/health``, then the spec's example
input through ``/v1/completions``), becomes READY and serves the request topic through the LLM window at the
server's ``--max-running-requests``: the server runs several generations at once, every request is answered
exactly once (read_committed), and an empty assignment drains the replica and its server.

Skips, saying why, where vLLM is not installed (``scripts/real_llm/setup.sh``)."""

from __future__ import annotations

import json
import re
import shlex
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sie.kernel.admin import delete_topics
from sie.kernel.topics import system_topics
from sie.schemas.spec import load
from sie.workers.agent import AgentConfig
from sie.workers.supervisor import SupervisorPolicy
from tests.support.helpers import REPO_ROOT, consume_all, produce_json, wait_until
from tests.support.llm_fixtures import llm_spec_doc
from tests.support.real_llm import require_vllm
from tests.workers.test_agent_kafka import cluster, pid_alive, publish_assignment, run_agent  # noqa: F401  (fixture)

pytestmark = pytest.mark.kafka

SLOTS = 4
N = 60
#: long enough that the server runs SLOTS generations at once for seconds, which the 0.2 s sampling of its
#: running gauge sees (with tests.support.real_llm's 8 tokens a loaded CI run finished between two samples: [0.0, 0.0])
TOKENS = 48
ENTRY = REPO_ROOT / "scripts" / "real_llm" / "vllm_entry.py"


def _spec_doc(prefix: str, install: dict[str, str]) -> dict[str, Any]:
    doc = llm_spec_doc([], name="llm-vllm", protocol="openai-completions")
    doc["spec"]["backend"]["model_path"] = install["model"]
    config = doc["spec"]["backend"]["config"]
    del config["endpoints"]  # nothing named: the replica's own server is the window's only endpoint
    # vLLM's own flags are the node's choice, in the entry it allows; the spec's extra_args are SGLang options
    # the node's policy allows (--max-running-requests, --dtype), mapped by the entry
    config.update(server_entry=[install["python"], str(ENTRY), "--enforce-eager", "--disable-uvicorn-access-log"],
                  extra_args=["--max-running-requests", str(SLOTS), "--dtype", "float32"], max_seq_len=512,
                  sampling_params={"max_new_tokens": TOKENS}, extra_body={"ignore_eos": True},
                  output_mode="text", startup_timeout_s=600, commit_interval_ms=50)
    spec = load(doc).to_document()
    spec["topics"] = {kind: f"{prefix}.model.llm-vllm.{kind}" for kind in ("requests", "results", "dead_letters",
                                                                           "backfill")}
    spec["group_id"] = f"{prefix}.scorer.llm-vllm"
    return spec


@pytest.mark.timeout(1200)
def test_an_agent_run_replica_launches_a_real_vllm_and_serves_through_the_window(cluster: dict[str, Any]) -> None:  # noqa: F811
    install = require_vllm()
    settings, prefix, work_dir = cluster["settings"], cluster["prefix"], cluster["work_dir"]
    status = cluster["tails"]["replica-status"]
    doc = _spec_doc(prefix, install)
    rid = "llm-vllm-0"
    publish_assignment(settings, "n1", 1, [{"replica_id": rid, "model": doc["name"], "version": doc["version"],
                                            "gpu_indices": [], "gpu_memory_mb": 0, "spec_json": json.dumps(doc)}])
    config = AgentConfig(node="n1", heartbeat_s=0.5, work_dir=work_dir,
                         policy=SupervisorPolicy(backoff_initial_s=0.2, startup_timeout_s=900, liveness_timeout_s=60,
                                                 drain_grace_s=30))
    entry = doc["backend"]["config"]["server_entry"]
    node_settings = settings.with_overrides(sglang_server_entries=[shlex.join(entry)],
                                            model_roots=[str(Path(install["model"]).parent)])
    agent, stop, thread = run_agent(config, node_settings)
    try:
        wait_until(lambda: status.find(replica_id=rid, state="READY"), timeout=900, interval=1.0,
                   message=lambda: f"READY; seen {status.values()}; log: {_log(work_dir, rid)[-4000:]}")
        log_text = _log(work_dir, rid)
        assert "serving through the LLM window" in log_text
        # the launcher's command ran the entry point the spec names, with the window's C as the server's own limit
        assert "vllm_entry.py --enforce-eager" in log_text and "--max-running-requests 4" in log_text, log_text[-3000:]
        server = f"http://127.0.0.1:{_server_port(log_text)}"

        running: list[float] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.2):  # a sampling period, not a synchronisation
                try:
                    text = httpx.get(f"{server}/metrics", timeout=5).text
                except httpx.HTTPError:
                    continue
                running.extend(float(line.rpartition(" ")[2]) for line in text.splitlines()
                               if line.startswith("vllm:num_requests_running"))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"q-{i}", "inputs": {"question": f"question {i} please"}} for i in range(N)])
        results = consume_all(settings, doc["topics"]["results"], expected=N, timeout=300)
        sampling.set()
        sampler.join(10)
        ids = [r.json()["id"] for r in results]
        assert sorted(ids) == sorted(f"q-{i}" for i in range(N))  # each exactly once, read_committed
        assert all(r.json()["usage"]["completion_tokens"] == TOKENS for r in results)
        assert consume_all(settings, doc["topics"]["dead_letters"], timeout=10) == []
        # several generations at once, never more than the server's own concurrency
        assert running and 2 <= max(running) <= SLOTS, running[-20:]

        current = agent.supervisor.table.current(rid)
        assert current is not None
        worker_pid = current.pid
        publish_assignment(settings, "n1", 2, [])
        stopped = wait_until(lambda: status.find(replica_id=rid, state="STOPPED"), timeout=60,
                             message="STOPPED status")[0]
        assert stopped["exit_code"] == 0, stopped
        assert worker_pid is not None and not pid_alive(worker_pid)
        wait_until(lambda: not _answers(server), 60, message="the server gone with its worker")
    finally:
        stop.set()
        thread.join(60)
        delete_topics(settings, list(doc["topics"].values()) + [t.name for t in system_topics(prefix)])
    assert not thread.is_alive()


def _answers(server: str) -> bool:
    try:
        httpx.get(f"{server}/health", timeout=2)
        return True
    except httpx.TransportError:
        return False


def _server_port(log_text: str) -> int:
    ports = re.findall(r"starting SGLang: .*--port (\d+)", log_text)
    assert ports, log_text[-2000:]
    return int(ports[-1])


def _log(work_dir: Any, rid: str) -> str:
    logs = list(work_dir.glob(f"*/{rid}/worker.log"))  # <work_dir>/<node>/<replica>/
    return logs[0].read_text(errors="replace") if logs else ""
