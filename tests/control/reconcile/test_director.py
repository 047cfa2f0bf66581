"""The traffic director's rule with a fake clock and synthetic signals: shift 30 % away from a hot replica,
hysteresis (no flapping), restore when cool, decisions carrying the numbers, and the in-process lever."""

from __future__ import annotations

import pytest

from sie.control.reconcile.director import DirectorPolicy, Extra, Signal, Track, direct, replica_lever
from sie.kernel.errors import ConfigError

POLICY = DirectorPolicy(sustain_s=2, hold_s=10, restore_after_s=30)


def hot(name="a", node=None):
    return Signal(name, 95.0, 80, 900.0, node)


def cool(name="b", node=None):
    return Signal(name, 30.0, 2, 40.0, node)


def run(frames, policy=POLICY, lever="weights", step=1.0):
    """``frames``: one list of signals per second of fake time; returns the tracks and every decision."""
    tracks: dict[str, Track] = {}
    decisions = []
    for i, signals in enumerate(frames):
        tracks, new = direct(signals, tracks, 1000.0 + i * step, policy, lever)
        decisions += new
    return tracks, decisions


def test_a_hot_replica_loses_30_percent_of_its_share_after_the_sustain_time_with_the_numbers():
    tracks, decisions = run([[hot(), cool()]] * 3)
    assert [(d.name, d.action) for d in decisions] == [("a", "shift_away")]
    d = decisions[0]
    assert d.at == 1002.0 and d.weight_before == 1.0 and d.weight_after == pytest.approx(0.7)
    assert "utilisation 95% > 85%" in d.reason and "queue 80 > 50" in d.reason and "p99 900 ms" in d.reason
    assert "b 30%/2/40 ms" in d.reason  # the others' numbers too
    assert tracks["a"].weight_multiplier == pytest.approx(0.7) and tracks["b"].weight_multiplier == 1.0


def test_both_thresholds_are_needed_and_a_blip_shorter_than_sustain_does_nothing():
    busy_short_queue = Signal("a", 99.0, 10, None)
    idle_long_queue = Signal("a", 50.0, 500, None)
    assert run([[busy_short_queue, cool()]] * 20)[1] == []
    assert run([[idle_long_queue, cool()]] * 20)[1] == []
    assert run([[hot(), cool()], [hot(), cool()], [cool("a"), cool()]] * 5)[1] == []  # hot 1 s at a time


def test_no_flapping_one_change_per_hold_and_no_restore_inside_the_band():
    # hot for 25 s: shifts at 2 s, 12 s, 22 s (hold 10 s), never faster
    _tracks, decisions = run([[hot(), cool()]] * 25)
    assert [d.at - 1000 for d in decisions] == [2.0, 12.0, 22.0]
    # hovering between the bands (70 %, queue 30): neither hot nor cool, the weight holds for good
    middle = Signal("a", 70.0, 30, None)
    tracks, decisions = run([[hot(), cool()]] * 3 + [[middle, cool()]] * 120)
    assert [d.action for d in decisions] == ["shift_away"] and tracks["a"].weight_multiplier == pytest.approx(0.7)


def test_weight_comes_back_one_step_per_restore_period_once_cool():
    frames = [[hot(), cool()]] * 13 + [[cool("a"), cool()]] * 100
    tracks, decisions = run(frames)
    assert [d.action for d in decisions] == ["shift_away", "shift_away", "restore", "restore"]
    restores = [d for d in decisions if d.action == "restore"]
    assert restores[0].at - 1000 == 13 + 30 and restores[1].at - restores[0].at == 30
    assert tracks["a"].weight_multiplier == pytest.approx(1.0)
    assert "cool for 30s" in restores[0].reason


def test_never_below_the_floor_and_never_shift_when_every_replica_is_hot():
    tracks, _ = run([[hot(), cool()]] * 200, DirectorPolicy(sustain_s=0, hold_s=0))
    assert tracks["a"].weight_multiplier == pytest.approx(0.1)
    assert run([[hot("a"), hot("b")]] * 30)[1] == []  # nowhere cooler to go: moving load only moves the problem


def test_in_process_scorers_get_an_add_a_replica_decision_naming_the_coolest_node():
    frames = [[hot("m-0", "node-a"), Signal("m-1", 50.0, 5, 20.0, "node-b"), cool("m-2", "node-c")]] * 3
    tracks, decisions = run(frames, lever="replicas")
    (d,) = decisions
    assert d.action == "add_replica" and d.name == "m-0" and d.reason.endswith("add a replica on the cooler node node-c")
    assert tracks["m-0"].weight_multiplier == 1.0  # no weight to turn: Kafka's assignment decides the share


def test_policy_checks_its_numbers():
    with pytest.raises(ConfigError, match="director.shift_fraction"):
        DirectorPolicy(shift_fraction=1.5)
    with pytest.raises(ConfigError, match="hysteresis band"):
        DirectorPolicy(cool_utilisation_pct=90)
    with pytest.raises(ConfigError, match="director.bogus: unknown"):
        DirectorPolicy.from_document({"bogus": 1})
    assert DirectorPolicy.from_document({"sustain_s": 1}).sustain_s == 1.0


def lever_run(frames, count=2, max_replicas=3, held=None, policy=POLICY):
    """Drive ``direct`` + ``replica_lever`` one second per frame; returns the floor after each frame
    (None: no extra replica) and every decision."""
    tracks: dict[str, Track] = {}
    extra: Extra | None = None
    floors, decisions = [], []
    for i, signals in enumerate(frames):
        now = 1000.0 + i
        tracks, new = direct(signals, tracks, now, policy, "replicas")
        extra, out = replica_lever(extra, new, signals, count, max_replicas, now, policy, held)
        floors.append(None if extra is None else extra.floor)
        decisions += out
    return floors, decisions


def test_a_hot_replica_adds_one_replica_as_a_floor_on_the_named_node_with_the_numbers():
    frames = [[hot("m-0", "node-a"), cool("m-1", "node-b")]] * 5
    floors, decisions = lever_run(frames, count=2, max_replicas=3)
    assert floors == [None, None, 3, 3, 3]  # hot for sustain_s (2 s), then count 2 + 1
    (d,) = decisions
    assert d.action == "add_replica" and d.node == "node-b" and d.name == "m-0"
    assert "utilisation 95% > 85%" in d.reason and "desired replicas 2 -> 3 (max 3)" in d.reason


def test_the_floor_is_bounded_by_the_maximum_and_held_during_a_rollout():
    frames = [[hot("m-0", "node-a"), cool("m-1", "node-b")]] * 5
    floors, decisions = lever_run(frames, count=3, max_replicas=3)
    assert floors == [None] * 5
    assert [d.action for d in decisions] == ["add_replica_blocked"]
    assert "3 replicas is the spec's maximum (3)" in decisions[0].reason
    floors, decisions = lever_run(frames, held="rollout of m to 2.0.0 in progress (canary)")
    assert floors == [None] * 5 and [d.action for d in decisions] == ["add_replica_held"]
    assert decisions[0].reason.endswith("not now: rollout of m to 2.0.0 in progress (canary)")


def test_the_floor_is_released_after_every_replica_stayed_cool_for_the_restore_time():
    frames = [[hot("m-0", "node-a"), cool("m-1", "node-b")]] * 3 + [[cool("m-0", "node-a"), cool("m-1", "node-b")]] * 40
    floors, decisions = lever_run(frames)
    assert [d.action for d in decisions] == ["add_replica", "release_replica"]
    release = decisions[1]
    assert release.at - 1000 == 3 + 30  # cool from t=3, restore_after_s=30
    assert floors[32] == 3 and floors[33] is None and floors[-1] is None
    assert "every replica cool for 30s" in release.reason and "m-0 30%/2/40 ms" in release.reason
    assert "floor 3 lifted (the autoscaler's count 2 stands)" in release.reason


def test_no_flapping_a_signal_oscillating_around_the_thresholds_adds_one_replica_and_keeps_it():
    around_hot = [Signal("m-0", 84.0, 60, None, "node-a"), Signal("m-0", 90.0, 60, None, "node-a")]
    frames = [[hot("m-0", "node-a"), cool("m-1", "node-b")]] * 3
    frames += [[around_hot[i % 2], cool("m-1", "node-b")] for i in range(300)]
    floors, decisions = lever_run(frames)
    assert floors[2:] == [3] * (len(frames) - 2)  # added once, never taken back inside the band
    assert [d.action for d in decisions].count("add_replica") == 1
    assert "release_replica" not in [d.action for d in decisions]
    # hot and cool in turns faster than restore_after_s: still one add and no release
    frames = [[hot("m-0", "node-a") if (i // 10) % 2 == 0 else cool("m-0", "node-a"), cool("m-1", "node-b")]
              for i in range(300)]
    floors, decisions = lever_run(frames)
    assert [d.action for d in decisions if d.action in ("add_replica", "release_replica")] == ["add_replica"]
    assert set(floors[2:]) == {3}


def test_the_controller_adds_a_replica_on_the_cooler_node_and_releases_it_after_the_cool_down():
    from sie.control.reconcile.config import ControlConfig
    from sie.control.reconcile.controller import Controller
    from sie.control.reconcile.ports import StaticLeadership
    from sie.control.reconcile.records import ClusterState
    from tests.control.reconcile.test_control_unit import (
        FakeClock,
        FakePublisher,
        gpu,
        heartbeat,
        register,
        spec_record,
    )

    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 3),
                     ControlConfig(node_timeout_s=6.0, director=DirectorPolicy(sustain_s=1, hold_s=10, restore_after_s=20)))
    state.apply_spec("m", spec_record("m", 6000, replicas=2, sla={"min_replicas": 2, "max_replicas": 3}))
    for node in ("node-a", "node-b", "node-c"):
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    ctl.reconcile(clock())
    nodes = {a["replica_id"]: r.key for r in pub.all("assignments") for a in r.value["replicas"]}
    assert sorted(nodes) == ["m-0", "m-1"] and len(set(nodes.values())) == 2
    hot_node, cool_node = nodes["m-0"], nodes["m-1"]
    idle_node = ({"node-a", "node-b", "node-c"} - {hot_node, cool_node}).pop()

    def beat(m0_hot: bool) -> None:
        clock.advance(1)
        for node, rid, busy in ((hot_node, "m-0", m0_hot), (cool_node, "m-1", False)):
            util, lag = (95.0, 400) if busy else (20.0, 3)
            heartbeat(state, node, clock(), [{**gpu(i), "utilization_pct": util} for i in (0, 1)],
                      [{"replica_id": rid, "model": "m", "version": "1.0.0", "state": "READY", "lag": lag,
                        "p99_ms": 900.0 if busy else 30.0}])
        heartbeat(state, idle_node, clock(), [gpu(0), gpu(1)])
        ctl.reconcile(clock())

    for _ in range(4):
        beat(True)
    events = [r.value for r in pub.all("events") if r.value["kind"] == "director"]
    assert len(events) == 1, events  # hysteresis: one decision per hold, not one per pass
    (e,) = events
    assert e["model"] == "m" and e["replica_id"] == "m-0" and e["node"] == cool_node
    assert e["detail"].startswith("add_replica: m-0: utilisation 95% > 85% and queue 400 > 50")
    assert f"add a replica on the cooler node {cool_node}" in e["detail"] and "p99 900 ms" in e["detail"]
    assert "desired replicas 2 -> 3 (max 3)" in e["detail"]
    # +1 desired replica, placed on the named cooler node (anti-affinity alone would pick the idle node)
    assert assigned_nodes(pub)["m-2"] == cool_node
    assert ctl.statuses["m"].desired_replicas == 3
    # cool from now on: released restore_after_s later, and the replica goes away
    for _ in range(25):
        beat(False)
    kinds = [r.value["detail"].split(":")[0] for r in pub.all("events") if r.value["kind"] == "director"]
    assert kinds == ["add_replica", "release_replica"]
    assert "m-2" not in assigned_nodes(pub) and ctl.statuses["m"].desired_replicas == 2
    removed = [r.value for r in pub.all("events") if r.value["kind"] == "removed"]
    assert [r["replica_id"] for r in removed] == ["m-2"]
    assert removed[0]["detail"].endswith("released by the traffic director (every replica cool)")


def test_a_rollout_in_progress_holds_the_director():
    from sie.control.reconcile.config import ControlConfig
    from sie.control.reconcile.controller import Controller
    from sie.control.reconcile.ports import NoRollouts, StaticLeadership
    from sie.control.reconcile.records import ClusterState
    from tests.control.reconcile.test_control_unit import (
        FakeClock,
        FakePublisher,
        gpu,
        heartbeat,
        register,
        spec_record,
    )

    class Rolling(NoRollouts):
        def in_progress(self, model: str) -> str | None:
            return "rollout of m to 2.0.0 in progress"

    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(director=DirectorPolicy(sustain_s=1)),
                     rollouts=Rolling())
    state.apply_spec("m", spec_record("m", 6000, replicas=2, sla={"min_replicas": 2, "max_replicas": 3}))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0)])
    for _ in range(4):
        clock.advance(1)
        for node, rid, util, lag in (("node-a", "m-0", 95.0, 400), ("node-b", "m-1", 20.0, 3)):
            heartbeat(state, node, clock(), [{**gpu(0), "utilization_pct": util}],
                      [{"replica_id": rid, "model": "m", "version": "1.0.0", "state": "READY", "lag": lag}])
        ctl.reconcile(clock())
    details = [r.value["detail"] for r in pub.all("events") if r.value["kind"] == "director"]
    assert len(details) == 1 and details[0].startswith("add_replica_held:"), details
    assert ctl.director_extra == {} and "m-2" not in assigned_nodes(pub)


def assigned_nodes(pub) -> dict[str, str]:
    """Replica id -> node, from the latest assignment published for each node."""
    latest = {r.key: r.value for r in pub.all("assignments")}
    return {a["replica_id"]: node for node, value in latest.items() for a in value["replicas"]}


def test_control_plane_config_sets_or_switches_off_the_director(tmp_path):
    from sie.control.reconcile.config import ControlConfig

    path = tmp_path / "control-plane-config.yaml"
    path.write_text("control:\n  director: {sustain_s: 3, hold_s: 20}\n", encoding="utf-8")
    config = ControlConfig.from_yaml(path)
    assert config.director is not None and (config.director.sustain_s, config.director.hold_s) == (3.0, 20.0)
    path.write_text("control:\n  director: false\n", encoding="utf-8")
    assert ControlConfig.from_yaml(path).director is None
    assert ControlConfig().director == DirectorPolicy()  # on by default, the design's rule


def test_the_llm_config_turns_the_director_on_for_two_endpoints_and_names_a_bad_key():
    from sie.streams.llm.config import LLMConfig

    one = LLMConfig.from_backend_config({"endpoints": ["http://a"]})
    two = LLMConfig.from_backend_config({"endpoints": ["http://a", "http://b"]})
    # the queue thresholds from the endpoints' slots (16 each by default): 85 % and 60 % of them (docs/llm.md)
    assert one.director is None and two.director == DirectorPolicy(hot_queue=13.6, cool_queue=9.6)
    assert LLMConfig.from_backend_config({"endpoints": ["http://a", "http://b"], "director": False}).director is None
    with pytest.raises(ConfigError, match=r"spec.backend.config.director.bogus: unknown"):
        LLMConfig.from_backend_config({"endpoints": ["http://a", "http://b"], "director": {"bogus": 1}})
