"""The warm pool with real processes: an agent whose replica start takes a pre-started worker, on the real broker.

The pool's worker imported the runtime before the assignment existed; the assignment hands it the replica's
arguments and environment; it must end READY (real readiness inference, scorer subscribed), log to the
replica's log file, score, drain, and report its warm start.  And a warm worker applies the node's spec
policy exactly like a cold one: a spec naming arbitrary code is refused before anything of it is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sie.workers.agent import AgentConfig
from sie.workers.supervisor import MonotonicClock, SupervisorPolicy
from sie.workers.warm_pool import WarmPool
from tests.support.helpers import consume_all, produce_json, wait_until
from tests.workers.test_agent_kafka import cluster, publish_assignment, replica_assignment, run_agent  # noqa: F401

pytestmark = pytest.mark.kafka


def test_agent_starts_a_replica_in_a_warm_pool_worker(cluster: dict[str, Any]) -> None:  # noqa: F811
    settings, doc, tails = cluster["settings"], cluster["spec_doc"], cluster["tails"]
    status, beats = tails["replica-status"], tails["heartbeats"]
    config = AgentConfig(node="w1", simulate_gpus="1xL4-24GB", heartbeat_s=0.5, work_dir=cluster["work_dir"],
                         warm_pool=1, warm_pool_refill_s=0.5,
                         policy=SupervisorPolicy(startup_timeout_s=120, drain_grace_s=15))
    agent, stop, thread = run_agent(config, settings)
    try:
        beat = wait_until(lambda: [b for b in beats.find(node="w1") if b["warm_workers"] == 1], timeout=120,
                          message="a heartbeat with one warm pool worker")[-1]
        assert beat["reserved_memory_mb"] > 50  # an interpreter with torch imported, accounted for placement
        (pool_pid,) = [w.handle.pid for w in agent.pool._workers]  # noqa: SLF001 - which process is taken

        publish_assignment(settings, "w1", 1, [replica_assignment(doc)])
        ready = wait_until(lambda: status.find(replica_id="fraud-rules-0", state="READY"), timeout=60,
                           message=lambda: f"READY; seen {status.values()}")[0]
        assert ready["reason"] == "readiness inference passed (warm start)"
        current = agent.supervisor.table.current("fraud-rules-0")
        assert current.pid == pool_pid and current.warm and current.start_s is not None
        assert agent.metrics.registry.get_sample_value(
            "sie_replica_start_seconds_count", {"node": "w1", "model": "fraud-rules", "start": "warm"}) == 1

        example = doc["example_input"]
        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"w-{i}", "inputs": {**example, "amount": 10.0 + i}} for i in range(10)])
        assert len(consume_all(settings, doc["topics"]["results"], expected=10, timeout=30)) == 10
        log = Path(agent.commands.replica_dir("fraud-rules-0")) / "worker.log"
        wait_until(lambda: log.exists() and "scorer" in log.read_text(), timeout=10,
                   message="the warm worker logging to the replica's log file")

        # the pool refills (after its refill delay) while the replica serves
        wait_until(lambda: agent.pool.ready() == 1, timeout=120, message="the pool refilled")
        publish_assignment(settings, "w1", 1, [])
        stopped = wait_until(lambda: status.find(replica_id="fraud-rules-0", state="STOPPED"), timeout=30,
                             message="STOPPED")[0]
        assert stopped["reason"] == "drained" and stopped["exit_code"] == 0
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()


def test_a_warm_worker_applies_the_spec_policy_before_loading(cluster: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    settings, doc = cluster["settings"], cluster["spec_doc"]
    marker = tmp_path / "pwned"
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    evil = {**doc, "name": "evil", "backend": {**doc["backend"], "type": "torch", "callable": None, "format": "safetensors",
                                             "artifact": str(weights), "module_class": "subprocess:Popen",
                                             "module_kwargs": {"args": f"touch {marker}", "shell": True}}}
    spec_file = tmp_path / "evil.json"
    spec_file.write_text(json.dumps(evil))
    env = {**settings.worker_settings().to_env(), "PYTHONUNBUFFERED": "1"}
    import os

    pool = WarmPool(1, {**os.environ, **env}, tmp_path / "pool", clock=MonotonicClock())
    try:
        pool.maintain()
        handle = wait_until(lambda: (pool.maintain(), pool.take())[1], timeout=120, message="a warm worker")
        handle.assign({"args": ["--spec-file", str(spec_file), "--replica-id", "evil-0"], "env": {}, "log_path": None},
                      tmp_path / "evil.log")
        exit_info = wait_until(handle.poll, timeout=60, message="the warm worker refusing the spec")
        events = handle.events()
    finally:
        pool.close()
    assert exit_info.exit_code == 1
    errors = [e["detail"] for e in events if e.get("event") == "error"]
    assert errors and "subprocess" in errors[0] and "SIE_ALLOWED_MODULES" in errors[0], events
    assert not any(e.get("event") == "loading" for e in events)
    assert not marker.exists()
