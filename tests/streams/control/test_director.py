"""The traffic director's rule with a fake clock and synthetic signals: shift 30 % away from a hot replica,
hysteresis (no flapping), restore when cool, decisions carrying the numbers, and the in-process lever."""

from __future__ import annotations

import pytest

from sie.kernel.errors import ConfigError
from sie.streams.control.director import DirectorPolicy, Signal, Track, direct

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


def test_the_controller_publishes_an_add_a_replica_event_for_a_hot_in_process_replica():
    from sie.streams.control.controller import ControlConfig, Controller, StaticLeadership
    from sie.streams.control.state import ClusterState
    from tests.streams.control.test_control_unit import FakeClock, FakePublisher, gpu, heartbeat, register, spec_record

    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 3),
                     ControlConfig(node_timeout_s=6.0, director=DirectorPolicy(sustain_s=1, hold_s=10)))
    state.apply_spec("m", spec_record("m", 12000, replicas=2))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0)])
        heartbeat(state, node, clock(), [gpu(0)])
    ctl.reconcile(clock())
    nodes = {a["replica_id"]: r.key for r in pub.all("assignments") for a in r.value["replicas"]}
    assert sorted(nodes) == ["m-0", "m-1"] and len(set(nodes.values())) == 2
    hot_node, cool_node = nodes["m-0"], nodes["m-1"]
    for _ in range(4):
        clock.advance(1)
        for node, rid, util, lag in ((hot_node, "m-0", 95.0, 400), (cool_node, "m-1", 20.0, 3)):
            heartbeat(state, node, clock(), [{**gpu(0), "utilization_pct": util}],
                      [{"replica_id": rid, "model": "m", "version": "1.0.0", "state": "READY", "lag": lag,
                        "p99_ms": 900.0 if rid == "m-0" else 30.0}])
        ctl.reconcile(clock())
    events = [r.value for r in pub.all("events") if r.value["kind"] == "director"]
    assert len(events) == 1, events  # hysteresis: one decision per hold, not one per pass
    (e,) = events
    assert e["model"] == "m" and e["replica_id"] == "m-0"
    assert e["detail"].startswith("add_replica: m-0: utilisation 95% > 85% and queue 400 > 50")
    assert e["detail"].endswith(f"add a replica on the cooler node {cool_node}") and "p99 900 ms" in e["detail"]


def test_control_plane_config_sets_or_switches_off_the_director(tmp_path):
    from sie.streams.control.controller import ControlConfig

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
    assert one.director is None and two.director == DirectorPolicy()
    assert LLMConfig.from_backend_config({"endpoints": ["http://a", "http://b"], "director": False}).director is None
    with pytest.raises(ConfigError, match=r"spec.backend.config.director.bogus: unknown"):
        LLMConfig.from_backend_config({"endpoints": ["http://a", "http://b"], "director": {"bogus": 1}})
