"""The control plane against faults of its inputs, on the real broker (issue 9, cases 3 and 9).

* one heartbeat with an unreadable key neither stops the state reader nor empties any assignment;
* every node going silent at once is held (nothing removed), said (event + health), and released when
  heartbeats flow again;
* agents whose clocks are ten minutes behind or ahead stay online;
* a leader elected after the control-leader topic was recreated is still followed by the agents.

Agents are faked at the Kafka level (``FakeAgent``: registration + heartbeats) except in the last test,
where a real ``Agent`` (with a fake process launcher) has to follow the assignments.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sie.control.reconcile.config import ControlConfig
from sie.control.service import ControlService
from sie.kernel.admin import delete_topics, ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import encode
from sie.schemas.spec import load
from sie.schemas.spec_store import publish_spec
from tests.control.test_control_kafka import AssignmentReader, FakeAgent, _producer
from tests.support.helpers import wait_until

pytestmark = pytest.mark.kafka

TIMEOUT_S = 3.0  # node timeout of these tests: short, so "two timeouts passed" is quick


@pytest.fixture()
def settings(kafka_settings: Settings) -> Settings:
    prefix = f"flt{uuid.uuid4().hex[:8]}"
    s = kafka_settings.with_overrides(topic_prefix=prefix)
    ensure_topics(s, system_topics(prefix))
    return s


@pytest.fixture()
def running() -> Iterator[list[Any]]:
    """Everything a test starts (services, fake agents, readers), stopped at the end whatever happened."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        try:
            thing.close() if isinstance(thing, AssignmentReader) else thing.stop()
        except Exception:
            pass


def apply(settings: Settings, name: str, replicas: int = 1) -> None:
    doc = {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": name},
           "spec": {"model": {"name": name, "version": "1.0.0"}, "priorityLevel": "P1",
                    "backend": {"type": "python", "callable": "models.fraud.rules:score"},
                    "resources": {"gpuMemoryMb": 4096, "cpu": 1},
                    "sla": {"min_replicas": replicas, "max_replicas": replicas}}}
    publish_spec(settings, load(doc, topic_prefix=settings.topic_prefix), timeout=15, ensure_topic=False)


def control(settings: Settings, running: list[Any], instance: str = "solo") -> ControlService:
    svc = ControlService(settings, ControlConfig(node_timeout_s=TIMEOUT_S, reconcile_interval_s=0.3),
                         instance_id=instance, http_port=None).start()
    running.append(svc)
    wait_until(lambda: svc.elector.is_leader, 30, message=f"{instance} to lead")
    return svc


def agents(settings: Settings, running: list[Any], *nodes: str, skew_s: float = 0.0) -> list[FakeAgent]:
    made = [FakeAgent(settings, node, skew_s=skew_s).start() for node in nodes]
    running.extend(made)
    return made


def placed(reader: AssignmentReader, *nodes: str) -> dict[str, list[str]]:
    latest = reader.poll()
    return {n: [r["replica_id"] for r in latest[n]["replicas"]] for n in nodes if n in latest}


def emptied(reader: AssignmentReader, *nodes: str) -> list[dict]:
    """Every Assignment published that took ALL replicas away from one of ``nodes``."""
    reader.poll()
    return [a for a in reader.history if a["node"] in nodes and not a["replicas"]]


def passes_after(svc: ControlService, at: float) -> None:
    """Until the leader ran a reconcile pass at (its clock) ``at`` or later."""
    wait_until(lambda: (r := svc.controller.last_report) is not None and r.at >= at,
               max(10.0, at - time.time() + 10 * TIMEOUT_S), message=f"a reconcile pass at {at:.1f} or later")


def heard_since(svc: ControlService, node: str, since: float) -> bool:
    """The control plane applied a heartbeat of ``node`` that the agent sent at or after ``since``."""
    hb = svc.state.snapshot().heartbeats.get(node)
    return hb is not None and hb.sent_at >= since


def test_one_unreadable_heartbeat_key_neither_stops_the_state_reader_nor_empties_any_assignment(settings, running):
    """Issue 9, case 3: ``msg.key().decode()`` sat outside the per-record guard; one non-UTF-8 key killed the
    reader, nothing restarted it, after the node timeout every node looked offline and the leader published
    empty assignments for every node (a total outage) while /healthz said ok."""
    agents(settings, running, "node-1", "node-2")
    svc = control(settings, running)
    reader = AssignmentReader(settings)
    running.append(reader)
    apply(settings, "scorer", replicas=2)
    wait_until(lambda: sorted(sum(placed(reader, "node-1", "node-2").values(), [])) == ["scorer-0", "scorer-1"],
               30, message="both replicas placed")

    producer = _producer(settings)
    bad_value = encode("Heartbeat", {"node": "node-1", "ts_ms": int(time.time() * 1000), "seq": 1, "gpus": [],
                                     "replicas": []})
    for partition in range(3):  # whichever partition the reader is on, it meets the bad key
        producer.produce(f"{settings.topic_prefix}.heartbeats", key=b"\xff\xfe\xfd", value=bad_value, partition=partition)
    assert producer.flush(10) == 0
    sent = time.time()
    passes_after(svc, sent + 3 * TIMEOUT_S)
    assert emptied(reader, "node-1", "node-2") == []  # three node timeouts later nothing was taken away
    assert svc.feeder.skipped == 3
    # heartbeats sent two node timeouts later were still read and applied: the reader never stopped
    wait_until(lambda: all(heard_since(svc, n, sent + 2 * TIMEOUT_S) for n in ("node-1", "node-2")),
               6 * TIMEOUT_S, message="heartbeats sent two timeouts after the bad records applied")
    assert sorted(sum(placed(reader, "node-1", "node-2").values(), [])) == ["scorer-0", "scorer-1"]
    health = svc.health()
    feeder = health["subsystems"]["state_feeder"]
    assert health["ok"], health["reasons"]
    assert feeder["skipped_records"] == 3 and feeder["restarts"] == 0
    assert f"{settings.topic_prefix}.heartbeats[" in feeder["last_skipped"]
    assert "key='\\\\xff\\\\xfe\\\\xfd': UnicodeDecodeError" in feeder["last_skipped"]


def test_every_node_going_silent_at_once_is_held_said_and_released_when_heartbeats_flow_again(settings, running):
    """Issue 9, case 3: nothing guarded against "every node offline at once"; a reader that died or lagged
    (or agents that lost the brokers) made the leader remove every replica of every node."""
    fakes = agents(settings, running, "node-1", "node-2")
    svc = control(settings, running)
    reader = AssignmentReader(settings)
    running.append(reader)
    apply(settings, "scorer", replicas=2)
    wait_until(lambda: sorted(sum(placed(reader, "node-1", "node-2").values(), [])) == ["scorer-0", "scorer-1"],
               30, message="both replicas placed")
    before = placed(reader, "node-1", "node-2")

    for fake in fakes:
        fake.stop()  # every heartbeat stops at once
    silent_since = time.time()
    passes_after(svc, silent_since + 3 * TIMEOUT_S)
    assert emptied(reader, "node-1", "node-2") == []  # three node timeouts into the silence nothing was removed
    assert placed(reader, "node-1", "node-2") == before
    guard = svc.health()["subsystems"]["liveness_guard"]
    assert guard["holding"] == ["node-1", "node-2"] and "no heartbeat has arrived from any node" in guard["detail"]
    assert any(r.startswith("liveness_guard: 2 of 2 nodes went offline or silent") for r in svc.health()["reasons"])
    wait_until(lambda: [e for e in svc.state.snapshot().events if e.kind == "liveness_guard"], 10,
               message="the liveness_guard event on the events topic")
    assert svc.controller.last_report.guard and svc.metrics.guard._value.get() == 1

    agents(settings, running, "node-1", "node-2")  # heartbeats flow again
    wait_until(lambda: [e for e in svc.state.snapshot().events if e.kind == "liveness_guard_released"], 10 * TIMEOUT_S,
               message="the guard released")
    released = [e for e in svc.state.snapshot().events if e.kind == "liveness_guard_released"][0]
    assert "2 of 2 held nodes are back" in released.detail
    assert svc.health()["subsystems"]["liveness_guard"]["ok"]
    assert emptied(reader, "node-1", "node-2") == [] and placed(reader, "node-1", "node-2") == before
    assert not [e for e in svc.state.snapshot().events if e.kind in ("moved", "node_offline")]


def test_agents_whose_clocks_are_ten_minutes_behind_or_ahead_stay_online(settings, running):
    """Issue 9, case 9: liveness used the agent's own timestamp: a clock more than the node timeout behind
    made its node permanently offline."""
    agents(settings, running, "behind", skew_s=-600.0)
    agents(settings, running, "ahead", skew_s=+600.0)
    svc = control(settings, running)

    def both_online() -> bool:
        views = {v.name: v.online for v in svc.state.snapshot().node_views(svc.clock(), TIMEOUT_S)}
        return views == {"behind": True, "ahead": True}

    wait_until(both_online, 10 * TIMEOUT_S, message="both skewed nodes online")
    start = time.time()
    seen_offline: list[float] = []

    def online_for_three_timeouts() -> bool:
        if not both_online():
            seen_offline.append(time.time() - start)
        return time.time() - start >= 3 * TIMEOUT_S and bool(svc.controller.last_report)

    wait_until(online_for_three_timeouts, 10 * TIMEOUT_S, interval=0.1, message="three timeouts observed")
    assert seen_offline == [], f"a skewed node looked offline at {seen_offline}"
    assert not [e for e in svc.state.snapshot().events if e.kind == "node_offline"]


def test_after_the_control_leader_topic_is_recreated_the_agents_still_follow_the_new_leader(settings, running, tmp_path):
    """Issue 9, case 9: the epoch restarted at 1 on a recreated control-leader topic, and every agent that
    had applied epoch N ignored every new assignment."""
    from confluent_kafka import Producer

    from sie.workers.agent import Agent, AgentConfig
    from sie.workers.gpu import host_inventory, parse_simulated_gpus
    from tests.fakes.workers import FakeLauncher

    leader_topic = f"{settings.topic_prefix}.control-leader"
    history = Producer(settings.kafka_client_config())
    history.produce(leader_topic, key=b"cluster", value=encode("LeaderEpoch", {"instance_id": "earlier", "epoch": 41,
                                                                              "ts_ms": 0}))
    assert history.flush(10) == 0  # an earlier incarnation's leaders had got to epoch 41

    launcher = FakeLauncher()
    agent = Agent(AgentConfig(node="n1", simulate_gpus="2xL4", heartbeat_s=0.5, work_dir=tmp_path, loop_interval_s=0.05),
                  settings, launcher=launcher,
                  inventory_probe=lambda: host_inventory(probe=lambda: parse_simulated_gpus("2xL4", node="n1")))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        first = control(settings, running, "cp-a")
        apply(settings, "one")
        wait_until(lambda: [h for h in launcher.started if h.spec.name == "one-0"], 30, message="one-0 launched")
        # the agent's heartbeats bring host memory and each replica's process into the control plane's view
        (one,) = [h for h in launcher.started if h.spec.name == "one-0"]

        def hosted() -> Any:
            hb = first.state.snapshot().heartbeats.get("n1")
            return hb is not None and [r.process for r in hb.replicas if r.replica_id == "one-0"] == [f"pid-{one.pid}"]

        wait_until(hosted, 10, message="a heartbeat naming one-0's process")
        n1 = first.state.snapshot().inventory(time.time(), 6.0).node("n1")
        assert n1.process_slots == 0 and n1.memory_mb > 0 and n1.memory_available_mb is not None
        first_epoch = first.elector.epoch
        first.stop()

        delete_topics(settings, [leader_topic])
        wait_until(lambda: leader_topic in ensure_topics(settings, system_topics(settings.topic_prefix)).created,
                   30, interval=0.5, message="control-leader recreated")
        second = control(settings, running, "cp-b")
        apply(settings, "two")
        wait_until(lambda: [h for h in launcher.started if h.spec.name == "two-0"], 30,
                   message=lambda: f"two-0 launched by the new leader (epoch {second.elector.epoch}, agent at "
                                   f"{agent._epoch})")
        assert second.elector.epoch > first_epoch > 41
    finally:
        stop.set()
        thread.join(30)


def test_health_names_a_dead_background_thread_until_it_runs_again(settings, running, monkeypatch):
    """Every background thread is supervised and shows in health: a reconcile loop that dies is restarted, and
    /healthz is not ok, naming it and why, until it runs again."""
    agents(settings, running, "node-1")
    svc = control(settings, running)
    wait_until(lambda: svc.health()["ok"], 30, message=lambda: f"healthy (reasons: {svc.health()['reasons']})")
    working = threading.Event()
    reconcile = svc.controller.reconcile

    def broken(now: float) -> Any:
        if not working.is_set():
            raise RuntimeError("reconcile blew up")
        return reconcile(now)

    monkeypatch.setattr(svc.controller, "reconcile", broken)
    wait_until(lambda: not svc.health()["ok"], 10, message="health to say the loop died")
    health = svc.health()
    assert health["status"] == "degraded"
    assert "reconcile_loop: loop thread restarting: RuntimeError: reconcile blew up" in health["reasons"]
    working.set()
    wait_until(lambda: svc.health()["ok"], 60, message=lambda: f"healthy again (reasons: {svc.health()['reasons']})")
    loop = svc.health()["subsystems"]["reconcile_loop"]
    assert loop["restarts"] >= 1 and loop["last_error"] == "RuntimeError: reconcile blew up"
