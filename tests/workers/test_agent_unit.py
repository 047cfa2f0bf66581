"""Supervisor state machine with a fake process wrapper and a fake clock: no Kafka, no processes, no sleeps."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from sie.schemas.replica_state import TRANSITIONS, ReplicaTransitionError
from sie.workers.process import LaunchSpec, describe_exit
from sie.workers.replica import DesiredReplica, ReplicaState
from sie.workers.supervisor import Supervisor, SupervisorPolicy
from tests.fakes.workers import FakeClock, FakeLauncher


def replica(index: int = 0, spec_json: str = '{"v": 1}', epoch: int = 1) -> DesiredReplica:
    return DesiredReplica(
        replica_id=f"fraud-scorer-{index}", model="fraud-scorer", version="1.0.0", template_json=spec_json, epoch=epoch
    )


@pytest.fixture
def env() -> tuple[Supervisor, FakeLauncher, FakeClock]:
    clock, launcher = FakeClock(), FakeLauncher()
    policy = SupervisorPolicy(
        backoff_initial_s=1, backoff_max_s=4, max_crashes=3, crash_window_s=60, immediate_first_restart=False,
        startup_timeout_s=20, liveness_timeout_s=10, drain_grace_s=5,
    )
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("worker", d.replica_id)), clock, policy)
    return sup, launcher, clock


def states(changes: list[Any]) -> list[str]:
    return [c.state.value for c in changes]


def start_ready(sup: Supervisor, launcher: FakeLauncher, desired: list[DesiredReplica]) -> None:
    sup.set_desired(desired)
    sup.update()
    for handle in launcher.started[-len(desired):]:
        handle.emit(event="ready")
    sup.update()


def test_start_then_ready_one_step_per_update(env: Any) -> None:
    sup, launcher, _ = env
    sup.set_desired([replica()])
    assert states(sup.update()) == ["PENDING", "STARTING"]
    assert len(launcher.started) == 1 and launcher.last.spec.argv == ("worker", "fraud-scorer-0")
    assert states(sup.update()) == []  # no event yet: still STARTING, nothing to report
    launcher.last.emit(event="ready")
    changes = sup.update()
    assert states(changes) == ["READY"] and changes[0].pid == 100


def test_same_assignment_twice_changes_nothing(env: Any) -> None:
    sup, launcher, _ = env
    start_ready(sup, launcher, [replica()])
    sup.set_desired([replica()])
    sup.set_desired([replica(epoch=2)])  # replayed by a new leader: new epoch, same target
    assert sup.update() == []
    assert len(launcher.started) == 1 and launcher.last.signals == []
    assert sup.table.current("fraud-scorer-0").desired.epoch == 2


def test_crash_restarts_with_exponential_backoff_then_failed(env: Any) -> None:
    sup, launcher, clock = env
    start_ready(sup, launcher, [replica()])
    launcher.last.exit(-signal.SIGKILL)
    changes = sup.update()
    assert states(changes) == ["CRASHED"]
    assert changes[0].signal == signal.SIGKILL
    assert "killed by SIGKILL (OOM killer or operator)" in changes[0].reason and "restarting in 1s" in changes[0].reason

    clock.advance(0.9)
    assert sup.update() == [] and len(launcher.started) == 1  # backoff not over yet
    clock.advance(0.2)
    changes = sup.update()
    assert states(changes) == ["STARTING"] and changes[0].restarts == 1 and len(launcher.started) == 2

    launcher.last.exit(3)
    changes = sup.update()
    assert changes[0].exit_code == 3 and "exited with code 3; restarting in 2s" in changes[0].reason
    clock.advance(1.5)
    assert sup.update() == []
    clock.advance(0.6)
    assert states(sup.update()) == ["STARTING"]

    launcher.last.exit(1)
    changes = sup.update()
    assert states(changes) == ["FAILED"] and "crashed 3 times within 60s" in changes[0].reason
    clock.advance(1000)
    assert sup.update() == [] and len(launcher.started) == 3  # FAILED is terminal


def test_crashes_outside_the_window_do_not_accumulate(env: Any) -> None:
    sup, launcher, clock = env
    start_ready(sup, launcher, [replica()])
    for _ in range(5):
        launcher.last.exit(-signal.SIGKILL)
        assert states(sup.update()) == ["CRASHED"]
        clock.advance(61)
        assert states(sup.update()) == ["STARTING"]
    assert sup.table.current("fraud-scorer-0").restarts == 5


def test_backoff_is_capped() -> None:
    policy = SupervisorPolicy(backoff_initial_s=1, backoff_max_s=30, immediate_first_restart=False)
    assert [policy.backoff(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]


def test_first_crash_in_the_window_restarts_at_once_then_backs_off() -> None:
    policy = SupervisorPolicy(backoff_initial_s=1, backoff_max_s=30)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0, 2, 4, 8]


def test_worker_error_event_is_the_crash_reason(env: Any) -> None:
    sup, launcher, _ = env
    sup.set_desired([replica()])
    sup.update()
    launcher.last.emit(event="error", detail="readiness: output field 'fraud_probability' missing")
    launcher.last.exit(1)
    changes = sup.update()
    assert states(changes) == ["CRASHED"]
    assert changes[0].reason.startswith("readiness: output field 'fraud_probability' missing (exited with code 1)")


def test_removed_replica_is_drained_then_stopped(env: Any) -> None:
    sup, launcher, clock = env
    start_ready(sup, launcher, [replica(0), replica(1)])
    worker0 = launcher.started[0]
    sup.set_desired([replica(1)])
    changes = sup.update()
    assert [(c.replica_id, c.state.value) for c in changes] == [("fraud-scorer-0", "DRAINING")]
    assert worker0.signals == ["TERM"]
    clock.advance(1)
    assert sup.update() == []  # still draining within the grace period
    worker0.exit(0)
    changes = sup.update()
    assert states(changes) == ["STOPPED"] and changes[0].reason == "drained"
    assert sup.table.current("fraud-scorer-0") is None and len(sup.table) == 1
    assert launcher.started[1].signals == []


def test_drain_escalates_to_sigkill_after_grace(env: Any) -> None:
    sup, launcher, clock = env
    start_ready(sup, launcher, [replica()])
    sup.set_desired([])
    sup.update()
    clock.advance(5.1)
    sup.update()
    assert launcher.last.signals == ["TERM", "KILL"]
    launcher.last.exit(-signal.SIGKILL)
    changes = sup.update()
    assert states(changes) == ["STOPPED"] and "drain took longer than 5s" in changes[0].reason
    assert sup.all_stopped() and len(sup.table) == 0


def test_hung_worker_is_killed_and_restarted(env: Any) -> None:
    sup, launcher, clock = env
    start_ready(sup, launcher, [replica()])
    for _ in range(3):  # progress lines keep it alive
        clock.advance(5)
        launcher.last.emit(event="progress", records=7)
        assert sup.update() == []
    clock.advance(10.5)
    sup.update()
    assert launcher.last.signals == ["KILL"]
    launcher.last.exit(-signal.SIGKILL)
    changes = sup.update()
    assert states(changes) == ["CRASHED"] and changes[0].reason.startswith("hung: no progress report for 10s")
    assert changes[0].records == 7


def test_startup_timeout_kills(env: Any) -> None:
    sup, launcher, clock = env
    sup.set_desired([replica()])
    sup.update()
    clock.advance(20.5)
    sup.update()
    assert launcher.last.signals == ["KILL"]
    launcher.last.exit(-signal.SIGKILL)
    assert "not ready within 20s" in sup.update()[0].reason


def test_changed_target_drains_old_before_starting_new(env: Any) -> None:
    sup, launcher, _ = env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    changes = sup.update()
    assert [c.state.value for c in changes] == ["PENDING", "DRAINING"]
    assert len(launcher.started) == 1  # the new one waits for the old one's GPU memory
    assert sup.update() == [] and len(launcher.started) == 1
    old.exit(0)
    assert states(sup.update()) == ["STOPPED", "STARTING"] and len(launcher.started) == 2


# --- replace in place: the hand-over (sie.workers.supervisor module docstring) ---------------------------

@pytest.fixture
def worker_env() -> tuple[Supervisor, FakeLauncher, FakeClock]:
    """Like ``env``, but the launches are dedicated worker processes (``warm_args``): they can start in standby."""
    clock, launcher = FakeClock(), FakeLauncher()
    policy = SupervisorPolicy(immediate_first_restart=False, startup_timeout_s=20, liveness_timeout_s=10,
                              drain_grace_s=5, max_crashes=3, crash_window_s=60)
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("worker", d.replica_id),
                                                    warm_args=("--replica-id", d.replica_id)), clock, policy)
    return sup, launcher, clock


def test_a_replica_replaced_in_place_serves_until_its_successor_is_loaded_then_hands_over(worker_env: Any) -> None:
    sup, launcher, _ = worker_env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    changes = sup.update()
    # the successor starts next to the serving old worker, in standby; the old one got no signal yet
    assert states(changes) == ["PENDING", "STARTING", "DRAINING"]
    new = launcher.last
    assert new is not old and new.spec.argv[-1] == "--standby" and new.spec.warm_args[-1] == "--standby"
    assert "handing over: serving until its successor" in changes[2].reason
    assert old.signals == [] and new.signals == []
    old.emit(event="progress", records=10)  # still serving meanwhile
    assert sup.update() == [] and old.signals == []
    new.emit(event="standby")  # loaded and proven
    changes = sup.update()
    assert old.signals == ["USR2"] and new.signals == []  # hand over: commit, keep the membership
    assert "SIGUSR2" in changes[0].reason
    old.emit(event="released")  # its consumer and producer are closed: the successor may take the id now
    sup.update()
    assert new.signals == ["USR1"]
    old.exit(0)
    new.emit(event="ready")
    assert states(sup.update()) == ["STOPPED", "READY"]
    assert sup.update() == [] and new.signals == ["USR1"]  # told once


def test_a_successor_that_crashes_while_loading_stops_the_old_worker_the_classic_way(worker_env: Any) -> None:
    sup, launcher, clock = worker_env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    sup.update()
    new = launcher.last
    new.exit(1)
    assert states(sup.update()) == ["CRASHED"]
    changes = sup.update()
    assert old.signals == ["TERM"]  # no hand-over any more: a planned stop, the old worker leaves the group
    assert "its successor is CRASHED" in changes[0].reason
    clock.advance(10)
    assert sup.update() == [] and len(launcher.started) == 3 - 1  # the relaunch waits for the old one to exit
    old.exit(0)
    assert states(sup.update()) == ["STOPPED", "STARTING"]
    assert launcher.last.spec.argv[-1] != "--standby"  # nothing serves now: a plain start


def test_a_successor_not_loaded_within_the_startup_timeout_ends_the_hand_over(worker_env: Any) -> None:
    sup, launcher, clock = worker_env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    sup.update()
    for _ in range(4):  # the old worker serves on (progress keeps it alive) while the new one loads
        clock.advance(5)
        old.emit(event="progress")
        sup.update()
    clock.advance(1)
    sup.update()
    assert old.signals == ["TERM"] and launcher.last.signals == ["KILL"]


def test_a_successor_whose_launch_is_deferred_leaves_the_old_worker_serving(worker_env: Any) -> None:
    from sie.workers.process import LaunchDeferred

    sup, launcher, _ = worker_env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    launcher.fail_next = LaunchDeferred("fetching artifacts")
    changes = sup.update()
    assert states(changes) == ["PENDING", "PENDING"] and "fetching artifacts" in changes[1].reason
    assert old.signals == [] and sup.snapshots()[0].state == ReplicaState.READY


def test_an_agent_stopping_during_a_hand_over_stops_both_workers(worker_env: Any) -> None:
    sup, launcher, _ = worker_env
    start_ready(sup, launcher, [replica()])
    old = launcher.last
    sup.set_desired([replica(spec_json='{"v": 2}')])
    sup.update()
    new = launcher.last
    sup.set_desired([])  # the agent's shutdown
    sup.update()
    assert old.signals == ["TERM"] and new.signals == ["TERM"]  # the standby one never serves
    old.exit(0)
    new.exit(0)
    assert states(sup.update()) == ["STOPPED", "STOPPED"] and len(sup.table) == 0


def test_a_removed_replica_is_stopped_at_once(worker_env: Any) -> None:
    """No successor (scale-down, delete): SIGTERM at once, the worker leaves its group."""
    sup, launcher, _ = worker_env
    start_ready(sup, launcher, [replica(0), replica(1)])
    sup.set_desired([replica(0)])
    assert states(sup.update()) == ["DRAINING"] and launcher.last.signals == ["TERM"]


def test_launch_failure_counts_as_crash(env: Any) -> None:
    sup, launcher, _ = env
    launcher.fail_next = OSError("No such file or directory: 'python'")
    sup.set_desired([replica()])
    changes = sup.update()
    assert states(changes) == ["PENDING", "CRASHED"]
    assert "could not start worker: No such file" in changes[1].reason


def test_unexpected_clean_exit_is_a_crash(env: Any) -> None:
    sup, launcher, _ = env
    start_ready(sup, launcher, [replica()])
    launcher.last.exit(0)
    changes = sup.update()
    assert states(changes) == ["CRASHED"] and changes[0].exit_code == 0


def test_unassigned_failed_replica_is_forgotten(env: Any) -> None:
    sup, launcher, _ = env
    sup.set_desired([replica()])
    sup.update()
    for _ in range(3):
        launcher.last.exit(1)
        sup.update()
        sup.table.current("fraud-scorer-0").next_start_at = 0  # skip the backoff; tested above
        sup.update()
    assert sup.table.current("fraud-scorer-0").state == ReplicaState.FAILED
    sup.set_desired([])
    assert states(sup.update()) == ["STOPPED"] and len(sup.table) == 0


def test_disallowed_transition_raises_and_changes_nothing(env: Any) -> None:
    sup, launcher, _ = env
    start_ready(sup, launcher, [replica()])
    actual = sup.table.current("fraud-scorer-0")
    reason = actual.reason
    with pytest.raises(ReplicaTransitionError, match=r"replica fraud-scorer-0: transition READY -> PENDING is not allowed"):
        sup._transition(actual, ReplicaState.PENDING, "a bug")  # noqa: SLF001 - the enforcement point itself
    assert actual.state == ReplicaState.READY and actual.reason == reason
    assert sup.update() == []  # nothing was queued for publishing


def test_update_raises_on_a_disallowed_transition_after_moving_the_others(env: Any) -> None:
    """A STOPPED replica left in the table (a bug) is not re-STOPPED and re-published; the rest still move."""
    sup, launcher, _ = env
    sup.set_desired([replica(0), replica(1)])
    sup.update()  # both STARTING
    broken = sup.table.current("fraud-scorer-0")
    broken.state, broken.handle, broken.retiring = ReplicaState.STOPPED, None, True
    launcher.started[1].emit(event="ready")
    with pytest.raises(ReplicaTransitionError, match=r"STOPPED -> STOPPED is not allowed.*none \(STOPPED is terminal\)"):
        sup.update()
    assert sup.table.current("fraud-scorer-1").state == ReplicaState.READY  # moved despite the bug
    sup.table.remove(broken)
    assert [(c.replica_id, c.state.value) for c in sup.update()] == [("fraud-scorer-1", "READY")]  # still queued


class RecordingSupervisor(Supervisor):
    """Records every (old, new) transition it makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.edges: set[tuple[ReplicaState, ReplicaState]] = set()

    def _transition(self, replica: Any, state: ReplicaState, reason: str) -> None:
        self.edges.add((replica.state, state))
        super()._transition(replica, state, reason)


def test_every_edge_of_the_transition_table_is_a_real_supervisor_path() -> None:
    """The table lists exactly what the supervisor does: no path missing (it would raise), none unused."""
    clock, launcher = FakeClock(), FakeLauncher()
    build = lambda d: LaunchSpec(name=d.replica_id, argv=("worker",))  # noqa: E731
    common = dict(backoff_initial_s=1, backoff_max_s=4, crash_window_s=60, immediate_first_restart=False)
    sup = RecordingSupervisor(launcher, build, clock, SupervisorPolicy(max_crashes=3, **common))
    once = RecordingSupervisor(launcher, build, clock, SupervisorPolicy(max_crashes=1, **common))

    def after_backoff(s: Supervisor) -> list[Any]:
        clock.advance(10)
        return s.update()

    # PENDING->STARTING->READY->CRASHED->STARTING->CRASHED->(launch fails: 3rd crash) FAILED->STOPPED
    start_ready(sup, launcher, [replica(0)])
    launcher.last.exit(1)
    sup.update()
    after_backoff(sup)
    launcher.last.exit(1)
    sup.update()
    launcher.fail_next = OSError("gone")
    assert states(after_backoff(sup)) == ["FAILED"]
    sup.set_desired([])
    assert states(sup.update()) == ["STOPPED"]
    # PENDING->(launch fails) CRASHED->(relaunch fails) CRASHED->STOPPED
    sup.set_desired([replica(1)])
    launcher.fail_next = OSError("gone")
    sup.update()
    launcher.fail_next = OSError("gone")
    assert states(after_backoff(sup)) == ["CRASHED"]
    sup.set_desired([])
    assert states(sup.update()) == ["STOPPED"]
    # PENDING->STOPPED (unassigned before its launch)
    sup.set_desired([replica(2)])
    sup.set_desired([])
    assert states(sup.update()) == ["PENDING", "STOPPED"]
    # STARTING->DRAINING->STOPPED and READY->DRAINING
    sup.set_desired([replica(3)])
    sup.update()
    sup.set_desired([])
    sup.update()
    launcher.last.exit(0)
    assert states(sup.update()) == ["STOPPED"]
    start_ready(sup, launcher, [replica(4)])
    sup.set_desired([])
    assert states(sup.update()) == ["DRAINING"]
    # max_crashes=1: PENDING->FAILED, STARTING->FAILED, READY->FAILED
    launcher.fail_next = OSError("gone")
    once.set_desired([replica(5), replica(6), replica(7)])
    assert states(once.update()) == ["PENDING"] * 3 + ["FAILED", "STARTING", "STARTING"]
    worker6, worker7 = launcher.started[-2:]
    worker7.emit(event="ready")
    assert states(once.update()) == ["READY"]
    worker6.exit(1)
    worker7.exit(1)
    assert states(once.update()) == ["FAILED", "FAILED"]

    table_edges = {(old, new) for old, nexts in TRANSITIONS.items() for new in nexts}
    assert sup.edges | once.edges == table_edges


@pytest.mark.parametrize(
    ("returncode", "cause", "code", "sig"),
    [
        (-9, "killed by SIGKILL (OOM killer or operator)", None, 9),
        (-15, "killed by SIGTERM", None, 15),
        (0, "exited with code 0", 0, None),
        (2, "exited with code 2", 2, None),
    ],
)
def test_describe_exit(returncode: int, cause: str, code: int | None, sig: int | None) -> None:
    info = describe_exit(returncode)
    assert (info.cause, info.exit_code, info.signal) == (cause, code, sig)


# --- readiness and /metrics (pure functions, no processes) ------------------------------------------------------


def test_readiness_checks_output_fields() -> None:
    from sie.schemas.spec_models import FieldSpec, IOSchema
    from sie.workers.readiness import ReadinessError, check_outputs

    schema = IOSchema(fields=(FieldSpec(name="p", type="float", range=(0, 1)), FieldSpec(name="why", type="string")))
    check_outputs(schema, [{"p": 0.2, "why": "ok"}])
    for outputs, message in [
        ([{"why": "ok"}], "output field 'p' missing"),
        ([{"p": "high", "why": "ok"}], "'p' must be float"),
        ([{"p": 1.5, "why": "ok"}], r"'p' = 1.5 outside range \[0.0, 1.0\]"),
        ([], "expected a list with one output dict"),
    ]:
        with pytest.raises(ReadinessError, match=message):
            check_outputs(schema, outputs)


def test_metrics_expose_gpus_and_replica_states(env: Any) -> None:
    from sie.workers.gpu import host_inventory, parse_simulated_gpus
    from sie.workers.metrics import AgentMetrics

    sup, launcher, _ = env
    start_ready(sup, launcher, [replica()])
    metrics = AgentMetrics("n1")
    metrics.observe_inventory(host_inventory(probe=lambda: parse_simulated_gpus("1xL4", node="n1")), "tier-0")
    metrics.observe_replicas(sup.snapshots())
    text = metrics.render().decode()
    assert 'sie_gpu_memory_bytes{gpu="0",kind="total",node="n1",product="NVIDIA L4-24GB (simulated)",simulated="true"' in text
    assert 'sie_replica_state{model="fraud-scorer",node="n1",replica="fraud-scorer-0",state="READY"} 1.0' in text
    assert 'sie_replica_state{model="fraud-scorer",node="n1",replica="fraud-scorer-0",state="STARTING"} 0.0' in text
    metrics.observe_replicas([])  # replica gone: its series disappear
    assert "fraud-scorer-0" not in metrics.render().decode()


def test_a_spec_the_node_policy_refuses_fails_at_once_and_never_launches(tmp_path) -> None:
    """The agent's command builder checks the spec exactly as the API does; a refusal is FAILED with the
    reason, not a crash loop, and no process is ever started."""
    import json

    from sie.schemas.spec import load
    from sie.schemas.spec_policy import SpecPolicy
    from sie.workers.agent.launch import WorkerCommandBuilder

    good = load({"name": "ok", "version": "1", "backend": {"type": "python", "callable": "models.fraud.rules:score"}})
    evil_doc = good.to_document()
    evil_doc["backend"]["callable"] = "os:system"
    builder = WorkerCommandBuilder(tmp_path, base_env={}, spec_policy=SpecPolicy(("models.fraud",), (tmp_path,)))
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, builder, clock, SupervisorPolicy(immediate_first_restart=True))
    sup.set_desired([DesiredReplica("evil-0", "evil", "1", json.dumps(evil_doc)),
                     DesiredReplica("ok-0", "ok", "1", json.dumps(good.to_document()))])
    changes = sup.update() + sup.update()
    evil = [c for c in changes if c.replica_id == "evil-0"]
    assert states(evil) == ["PENDING", "FAILED"]
    assert evil[-1].reason.startswith("spec refused: spec.backend.callable: module 'os' is not in this node's allowed")
    assert [h.spec.name for h in launcher.started] == ["ok-0"]  # the allowed one runs; the refused one never did
    assert not (tmp_path / "evil-0").exists()  # not even its spec file was written
