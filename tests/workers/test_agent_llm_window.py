"""A real node agent runs an sglang spec's replica: the worker launches its own server (the fake LLM server,
through the launcher's real command line with ``server_entry``), proves it with a real generation, becomes
READY and then serves the request topic through the LLM window (issue 12), not the batch path: the server
sees several generations at once (in flight > 1), every request is answered exactly once (read_committed),
and an empty assignment drains the replica to STOPPED with its server."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sie.kernel.admin import delete_topics
from sie.kernel.topics import system_topics
from sie.schemas.spec import load
from sie.workers.agent import AgentConfig
from sie.workers.supervisor import SupervisorPolicy
from tests.support.helpers import consume_all, produce_json, wait_until
from tests.support.llm_fixtures import FAKE_SERVER, llm_spec_doc
from tests.workers.test_agent_kafka import cluster, pid_alive, publish_assignment, run_agent  # noqa: F401  (fixture)

pytestmark = pytest.mark.kafka

SLOTS = 8
N = 48


def _spec_doc(prefix: str) -> dict[str, Any]:
    doc = llm_spec_doc([], name="llm-agent")
    config = doc["spec"]["backend"]["config"]
    del config["endpoints"]  # nothing named: the replica's own server is the window's only endpoint
    config.update(server_entry=[sys.executable, str(FAKE_SERVER), "--slots", str(SLOTS), "--mean-s", "0.15",
                                "--p99-s", "0.5"],
                  extra_args=["--max-running-requests", str(SLOTS)], commit_interval_ms=50)
    spec = load(doc).to_document()
    spec["topics"] = {kind: f"{prefix}.model.llm-agent.{kind}" for kind in ("requests", "results", "dead_letters",
                                                                           "backfill")}
    spec["group_id"] = f"{prefix}.scorer.llm-agent"
    return spec


def test_an_agent_run_sglang_replica_serves_through_the_window_exactly_once(cluster: dict[str, Any]) -> None:  # noqa: F811
    settings, prefix, work_dir = cluster["settings"], cluster["prefix"], cluster["work_dir"]
    status = cluster["tails"]["replica-status"]
    doc = _spec_doc(prefix)
    rid = "llm-agent-0"
    publish_assignment(settings, "n1", 1, [{"replica_id": rid, "model": doc["name"], "version": doc["version"],
                                            "gpu_indices": [], "gpu_memory_mb": 0, "spec_json": json.dumps(doc)}])
    config = AgentConfig(node="n1", heartbeat_s=0.5, work_dir=work_dir,
                         policy=SupervisorPolicy(backoff_initial_s=0.2, startup_timeout_s=60, liveness_timeout_s=15, drain_grace_s=15))
    entry = doc["backend"]["config"]["server_entry"]
    # the fake server is a program the spec names: this node must allow it (the spec policy refuses it otherwise)
    agent, stop, thread = run_agent(config, settings.with_overrides(sglang_server_entries=[shlex.join(entry)]))
    try:
        wait_until(lambda: status.find(replica_id=rid, state="READY"), timeout=60,
                   message=lambda: f"READY; seen {status.values()}; log: {_log(work_dir, rid)[-3000:]}")
        log_text = _log(work_dir, rid)
        assert "serving through the LLM window" in log_text
        port = _server_port(log_text)
        server = f"http://127.0.0.1:{port}"

        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"q-{i}", "inputs": {"question": f"question {i} please"}} for i in range(N)])
        results = consume_all(settings, doc["topics"]["results"], expected=N, timeout=45)
        ids = [r.json()["id"] for r in results]
        assert sorted(ids) == sorted(f"q-{i}" for i in range(N))  # each exactly once, read_committed
        assert all(r.json()["outputs"]["answer"] for r in results)
        assert consume_all(settings, doc["topics"]["dead_letters"], timeout=10) == []

        # the window, not a batch: the server ran several generations at once, never more than its slots
        stats = httpx.get(f"{server}/stats", timeout=5).json()
        assert 1 < stats["max_running"] <= SLOTS, stats
        # the worker's /metrics (the port the agent advertises) are the window's
        current = agent.supervisor.table.current(rid)
        assert current is not None and current.metrics_port
        metrics = httpx.get(f"http://127.0.0.1:{current.metrics_port}/metrics", timeout=5).text
        count = re.search(r'sie_llm_generation_seconds_count\{model_id="[^"]+"\} (\S+)', metrics)
        assert count is not None and float(count.group(1)) >= N, metrics[:2000]
        # progress lines carry the window's committed records
        wait_until(lambda: (c := agent.supervisor.table.current(rid)) is not None and c.records >= N, timeout=10,
                   message="progress with the window's records")

        # the server dies: the worker says why and exits, the agent restarts the replica with a new server, and
        # what was not committed is answered by the new one: still exactly once over both rounds
        os.kill(_server_pid(port), signal.SIGKILL)
        crashed = wait_until(lambda: status.find(replica_id=rid, state="CRASHED"), timeout=20,
                             message=lambda: f"CRASHED; seen {status.values()}")[0]
        assert "SGLang server" in crashed["reason"], crashed
        wait_until(lambda: [v for v in status.find(replica_id=rid, state="READY") if v["restarts"] == 1],
                   timeout=60, message="READY again after the restart")
        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"r-{i}", "inputs": {"question": f"again {i}"}} for i in range(N)])
        results = consume_all(settings, doc["topics"]["results"], expected=2 * N, timeout=45)
        assert sorted(r.json()["id"] for r in results) == sorted([f"q-{i}" for i in range(N)]
                                                                 + [f"r-{i}" for i in range(N)])

        # empty assignment: drained (exit 0) and STOPPED; the server child goes with the worker
        current = agent.supervisor.table.current(rid)
        assert current is not None
        worker_pid = current.pid
        server = f"http://127.0.0.1:{_server_port(_log(work_dir, rid))}"
        publish_assignment(settings, "n1", 2, [])
        stopped = wait_until(lambda: status.find(replica_id=rid, state="STOPPED"), timeout=30,
                             message="STOPPED status")[0]
        assert stopped["exit_code"] == 0, stopped
        assert worker_pid is not None and not pid_alive(worker_pid)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server}/stats", timeout=2)
    finally:
        stop.set()
        thread.join(40)
        delete_topics(settings, list(doc["topics"].values()) + [t.name for t in system_topics(prefix)])
    assert not thread.is_alive()


def _server_port(log_text: str) -> int:
    """The port of the newest server the worker log says it started."""
    ports = re.findall(r"starting SGLang: .*--port (\d+)", log_text)
    assert ports, log_text[-2000:]
    return int(ports[-1])


def _server_pid(port: int) -> int:
    """The fake server process listening on ``port`` (it is the worker's child, not ours)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"fake_llm_server.py") for a in argv) and str(port).encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no fake LLM server on port {port}")


def _log(work_dir: Any, rid: str) -> str:
    logs = list(work_dir.glob(f"*/{rid}/worker.log"))  # <work_dir>/<node>/<replica>/
    return logs[0].read_text(errors="replace") if logs else ""
