"""The node agent on the real broker with real worker processes (no control plane: assignments are produced here).

Assignment for node n1 -> worker READY (seen on replica-status) -> requests scored -> SIGKILL the worker ->
CRASHED with the signal, restarted, READY again -> empty assignment -> drained and STOPPED.
Uses the python rules model (examples/fraud-rules.yaml): no torch import, a worker is ready in ~1-2 s.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sie.kernel.admin import ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import encode
from sie.schemas.spec import load
from sie.workers.agent import Agent, AgentConfig
from sie.workers.supervisor import SupervisorPolicy
from tests.support.helpers import REPO_ROOT, TopicTail, consume_all, produce_json, wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture
def cluster(kafka_settings: Settings, tmp_path: Any) -> Iterator[dict[str, Any]]:
    """Unique system topic prefix + unique model topics, so parallel runs never meet."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = kafka_settings.with_overrides(topic_prefix=prefix)
    ensure_topics(settings, system_topics(prefix), replication_factor=1)
    doc = load(REPO_ROOT / "examples" / "fraud-rules.yaml").to_document()
    doc["topics"] = {
        "requests": f"{prefix}.model.fraud-rules.requests",
        "results": f"{prefix}.model.fraud-rules.results",
        "dead_letters": f"{prefix}.model.fraud-rules.dlq",
        "backfill": f"{prefix}.model.fraud-rules.backfill",
    }
    doc["group_id"] = f"{prefix}.scorer.fraud-rules"
    tails = {name: TopicTail(settings, f"{prefix}.{name}") for name in ("replica-status", "heartbeats", "nodes")}
    try:
        yield {"settings": settings, "prefix": prefix, "spec_doc": doc, "tails": tails, "work_dir": tmp_path}
    finally:
        for tail in tails.values():
            tail.close()


def publish_assignment(settings: Settings, node: str, epoch: int, replicas: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(settings.kafka_client_config(**{"acks": "all"}))
    record = {"node": node, "epoch": epoch, "issued_at_ms": int(time.time() * 1000), "replicas": replicas}
    producer.produce(f"{settings.topic_prefix}.assignments", key=node.encode(), value=encode("Assignment", record))
    assert producer.flush(10) == 0


def replica_assignment(doc: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {
        "replica_id": f"fraud-rules-{index}", "model": "fraud-rules", "version": doc["version"],
        "gpu_indices": [], "gpu_memory_mb": 0, "spec_json": json.dumps(doc),
    }


def run_agent(config: AgentConfig, settings: Settings) -> tuple[Agent, threading.Event, threading.Thread]:
    agent = Agent(config, settings)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), name="agent", daemon=True)
    thread.start()
    wait_until(agent.ready.is_set, timeout=20, message="agent registered")
    return agent, stop, thread


def pid_alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes, e.g. pid 1 in a container, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_agent_runs_restarts_and_drains_a_replica(cluster: dict[str, Any]) -> None:
    settings, doc, tails = cluster["settings"], cluster["spec_doc"], cluster["tails"]
    status = tails["replica-status"]
    publish_assignment(settings, "n1", 1, [replica_assignment(doc)])
    config = AgentConfig(
        node="n1", labels={"zone": "a"}, tier="tier-0", simulate_gpus="2xA100-80GB", heartbeat_s=0.5,
        work_dir=cluster["work_dir"],
        policy=SupervisorPolicy(backoff_initial_s=0.2, startup_timeout_s=60, liveness_timeout_s=15, drain_grace_s=15),
    )
    agent, stop, thread = run_agent(config, settings)
    try:
        # registration: inventory with simulated GPUs, labels and tier
        reg = wait_until(lambda: tails["nodes"].find(node="n1"), timeout=10, message="NodeRegistration")[0]
        assert reg["simulated"] and len(reg["gpus"]) == 2 and reg["gpus"][0]["memory_total_mb"] == 80 * 1024
        assert reg["labels"] == {"zone": "a"} and reg["tier"] == "tier-0" and reg["cpu_count"] >= 1

        # READY only after a real inference + the scorer subscribed
        wait_until(lambda: status.find(replica_id="fraud-rules-0", state="READY"), timeout=60,
                   message=lambda: f"READY status; seen {status.values()}")
        assert [v["state"] for v in status.values()][:3] == ["PENDING", "STARTING", "READY"]

        # requests get results
        example = doc["example_input"]
        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"r-{i}", "inputs": {**example, "amount": 10.0 + i}} for i in range(20)])
        results = consume_all(settings, doc["topics"]["results"], expected=20, timeout=30)
        assert len(results) == 20
        assert all(0.0 <= r.json()["outputs"]["risk_score"] <= 1.0 for r in results)

        # heartbeat carries the replica with its pid
        def ready_pid() -> int | None:
            for beat in reversed(tails["heartbeats"].find(node="n1")):
                for rep in beat["replicas"]:
                    if rep["replica_id"] == "fraud-rules-0" and rep["state"] == "READY" and rep["pid"]:
                        return rep["pid"]
            return None

        pid = wait_until(ready_pid, timeout=10, message="heartbeat with a READY replica")
        assert pid_alive(pid)

        # SIGKILL the worker: CRASHED with the signal and cause, restarted, READY again
        os.kill(pid, signal.SIGKILL)
        crashed = wait_until(lambda: status.find(replica_id="fraud-rules-0", state="CRASHED"), timeout=15,
                             message="CRASHED status")[0]
        assert crashed["signal"] == signal.SIGKILL and "killed by SIGKILL (OOM killer or operator)" in crashed["reason"]
        wait_until(lambda: [v for v in status.find(replica_id="fraud-rules-0", state="READY") if v["restarts"] == 1],
                   timeout=60, message="READY again after the restart")
        new_pid = wait_until(lambda: (p := ready_pid()) != pid and p, timeout=10, message="heartbeat with the new pid")
        assert pid_alive(new_pid)

        # the same assignment replayed (new epoch) changes nothing
        publish_assignment(settings, "n1", 2, [replica_assignment(doc)])
        wait_until(lambda: agent.supervisor.table.current("fraud-rules-0").desired.epoch == 2, timeout=10,
                   message="epoch 2 applied")
        assert agent.supervisor.table.current("fraud-rules-0").pid == new_pid

        # empty assignment: drained (SIGTERM, exit 0) and STOPPED
        publish_assignment(settings, "n1", 2, [])
        stopped = wait_until(lambda: status.find(replica_id="fraud-rules-0", state="STOPPED"), timeout=30,
                             message="STOPPED status")[0]
        assert stopped["reason"] == "drained" and stopped["exit_code"] == 0
        assert status.find(replica_id="fraud-rules-0", state="DRAINING")
        assert not pid_alive(new_pid)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()


def test_killing_the_agent_kills_its_workers(cluster: dict[str, Any]) -> None:
    """`sie agent` as a real process: SIGKILL it (node loss) and PR_SET_PDEATHSIG takes its worker down too."""
    import subprocess
    import sys

    settings, doc, tails = cluster["settings"], cluster["spec_doc"], cluster["tails"]
    publish_assignment(settings, "n2", 1, [replica_assignment(doc, 1)])
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "SIE_TOPIC_PREFIX": settings.topic_prefix}
    agent = subprocess.Popen(
        [sys.executable, "-m", "sie", "agent", "--node", "n2", "--heartbeat-s", "0.5",
         "--work-dir", str(cluster["work_dir"])],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        def worker_pid() -> int | None:
            for beat in reversed(tails["heartbeats"].find(node="n2")):
                for rep in beat["replicas"]:
                    if rep["state"] == "READY" and rep["pid"]:
                        return rep["pid"]
            return None

        pid = wait_until(worker_pid, timeout=60, message="READY worker in a heartbeat of n2")
        assert pid_alive(pid)
        agent.kill()
        agent.wait(10)
        wait_until(lambda: not pid_alive(pid), timeout=10, message="worker killed with its agent")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)


def test_agent_refuses_an_assignment_whose_spec_names_arbitrary_code(cluster: dict[str, Any]) -> None:
    """Written straight to the assignments topic (past the API and the control plane): the agent checks the
    spec exactly as the API does, publishes FAILED with the reason, and never starts a process."""
    settings, doc, tails = cluster["settings"], cluster["spec_doc"], cluster["tails"]
    marker = cluster["work_dir"] / "pwned"
    weights = cluster["work_dir"] / "w.safetensors"
    weights.write_bytes(b"x")
    evil = {**doc, "name": "evil", "backend": {**doc["backend"], "type": "torch", "callable": None, "format": "safetensors",
                                             "artifact": str(weights), "module_class": "subprocess:Popen",
                                             "module_kwargs": {"args": f"touch {marker}", "shell": True}}}
    publish_assignment(settings, "n2", 1, [{**replica_assignment(evil), "replica_id": "evil-0", "model": "evil"}])
    config = AgentConfig(node="n2", simulate_gpus="1xL4-24GB", heartbeat_s=0.5, work_dir=cluster["work_dir"])
    agent, stop, thread = run_agent(config, settings)
    status = tails["replica-status"]
    try:
        failed = wait_until(lambda: status.find(replica_id="evil-0", state="FAILED"), timeout=20,
                            message=lambda: f"FAILED status; seen {status.values()}")[0]
        assert "spec refused: spec.backend.moduleClass: module 'subprocess' is not in this node's allowed modules" \
            in failed["reason"]
        assert "spec.backend.artifact" in failed["reason"]  # the work dir is not a model root
        assert [v["state"] for v in status.find(replica_id="evil-0")] == ["PENDING", "FAILED"]  # never STARTING
        assert agent.supervisor.table.current("evil-0").handle is None
    finally:
        stop.set()
        thread.join(30)
    assert not marker.exists()


def test_a_restarted_agent_replays_the_assignments_to_their_end_before_it_launches_anything(cluster: dict[str, Any]) -> None:
    """Issue 9, case 9: the compacted topic still holds an older record of the node; an agent that acted on each
    batch as it came launched that stale replica and drained it again when the newer record arrived."""
    from confluent_kafka import Producer

    from sie.workers.gpu import host_inventory, parse_simulated_gpus
    from tests.fakes.workers import FakeLauncher

    settings = cluster["settings"]
    topic = f"{settings.topic_prefix}.assignments"

    def record(epoch: int, replica_id: str) -> bytes:
        return encode("Assignment", {"node": "n9", "epoch": epoch, "issued_at_ms": 0, "replicas": [{
            "replica_id": replica_id, "model": "m", "version": "1", "gpu_indices": [], "gpu_memory_mb": 0,
            "spec_json": json.dumps(cluster["spec_doc"])}]})  # a spec the node's policy accepts

    producer = Producer(settings.kafka_client_config(**{"acks": "all", "linger.ms": 20}))
    producer.produce(topic, key=b"n9", value=record(1, "stale-0"), partition=0)
    for i in range(1200):  # more than one consume() batch of other nodes' records between the two
        producer.produce(topic, key=f"other-{i}".encode(), value=None, partition=0)
    producer.produce(topic, key=b"n9", value=record(2, "current-0"), partition=0)
    assert producer.flush(30) == 0

    launcher = FakeLauncher()
    agent = Agent(AgentConfig(node="n9", simulate_gpus="1xL4", heartbeat_s=0.5, work_dir=cluster["work_dir"]),
                  settings, launcher=launcher,
                  inventory_probe=lambda: host_inventory(probe=lambda: parse_simulated_gpus("1xL4", node="n9")))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), name="agent", daemon=True)
    thread.start()
    try:
        wait_until(lambda: launcher.started, timeout=30, message="a replica launched")
        assert launcher.started[0].spec.name == "current-0"  # the first launch is already the newest record's
        wait_until(lambda: "current-0" in [s["replica_id"] for s in cluster["tails"]["replica-status"].values()],
                   timeout=10, message="current-0 reported")
        assert [h.spec.name for h in launcher.started] == ["current-0"] and not agent.replaying
        assert not cluster["tails"]["replica-status"].find(replica_id="stale-0")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
