"""The agent's shared multi-model processes (sie.workers.agent.shared) against fakes: which launches share, how
replicas map onto processes and ``models.json``, how ``health.json`` lane states become the supervisor's
events and exits, and that a crashed shared process is restarted once for all of its replicas."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sie.schemas.replica_state import ReplicaState
from sie.schemas.spec import load
from sie.schemas.spec_models import may_share_process
from sie.workers.agent.launch import WorkerCommandBuilder, may_share
from sie.workers.agent.shared import SharedLauncher, SharedProcesses
from sie.workers.multimodel.desired import HEALTH_FILE, read_desired, write_atomic
from sie.workers.replica import DesiredReplica
from sie.workers.supervisor import Supervisor, SupervisorPolicy
from tests.fakes.workers import FakeClock, FakeLauncher
from tests.support.helpers import REPO_ROOT


def _doc(**changes: Any) -> dict[str, Any]:
    doc = load(REPO_ROOT / "examples" / "fraud-rules.yaml").to_document()
    doc.update(changes)
    return doc


def _desired(rid: str, doc: dict[str, Any]) -> DesiredReplica:
    return DesiredReplica(replica_id=rid, model=doc["name"], version=doc["version"], template_json=json.dumps(doc),
                          gpu_indices=(), gpu_memory_mb=0, epoch=1)


def _health(state_dir: Path, lanes: dict[str, str], *, at: float | None = None, port: int = 9123, rss: float = 600.0,
            draining: tuple[str, ...] = (), refused: dict[str, str] | None = None, **lane: Any) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_dir / HEALTH_FILE, {
        "at": time.time() if at is None else at, "metrics_port": port, "rss_mb": rss,
        "lanes": {rid: {"state": state, "records": 7, "lag": 0, "p99_ms": 1.5, "rate": 2.0,
                        "last_error": lane.get("last_error")} for rid, state in lanes.items()},
        "draining": {rid: {} for rid in draining}, "refused": refused or {},
    })


@pytest.fixture
def rig(tmp_path: Path) -> dict[str, Any]:
    clock = FakeClock()
    inner = FakeLauncher()
    pool = SharedProcesses(2, tmp_path, "python", {}, launcher=inner, clock=clock.monotonic, stale_s=10)
    return {"clock": clock, "inner": inner, "pool": pool, "launcher": SharedLauncher(pool, inner), "dir": tmp_path}


def test_the_rule_is_one_predicate_the_builder_and_placement_share() -> None:
    assert may_share_process("P1", "torch", 0) and may_share_process("P2", "python", 0)
    assert not may_share_process("P0", "torch", 0)
    assert not may_share_process("P1", "sglang", 0)
    assert not may_share_process("P1", "torch", 1)
    assert may_share(_doc()) and not may_share(_doc(priority_level="P0")) and not may_share({"name": "x"})


def test_the_builder_marks_only_eligible_worker_launches_shared(tmp_path: Path) -> None:
    shared = WorkerCommandBuilder(tmp_path, base_env={}, shared_processes=4)
    spec = shared(_desired("fraud-rules-0", _doc()))
    assert spec.shared_spec is not None and spec.shared_spec["name"] == "fraud-rules"
    assert "--metrics-port" not in spec.argv  # served by the shared process's /metrics
    assert shared(_desired("p0-0", _doc(priority_level="P0"))).shared_spec is None
    assert WorkerCommandBuilder(tmp_path, base_env={})(_desired("fraud-rules-0", _doc())).shared_spec is None


def test_replicas_fill_a_process_then_a_second_one_starts(rig: dict[str, Any]) -> None:
    launcher, inner, pool = rig["launcher"], rig["inner"], rig["pool"]
    builder = WorkerCommandBuilder(rig["dir"] / "replicas", base_env={}, shared_processes=2)
    handles = [launcher.start(builder(_desired(f"m{i}-0", _doc(name=f"m{i}")))) for i in range(3)]
    assert len(inner.started) == 2, "two replicas share one process; the third starts the second"
    assert [h.process_id for h in handles] == ["shared-0", "shared-0", "shared-1"]
    assert handles[0].pid == handles[1].pid == inner.started[0].pid
    argv = inner.started[0].spec.argv
    assert argv[argv.index("-m") + 1] == "sie.workers.multimodel" and "--state-dir" in argv
    assert set(read_desired(rig["dir"] / "shared" / "shared-0")) == {"m0-0", "m1-0"}
    assert pool.by_replica() == {"m0-0": "shared-0", "m1-0": "shared-0", "m2-0": "shared-1"}
    # a launch that may not share goes to the dedicated launcher
    launcher.start(builder(_desired("p0-0", _doc(priority_level="P0"))))
    assert len(inner.started) == 3 and inner.last.spec.name == "p0-0"


def test_lane_states_become_ready_then_progress_events(rig: dict[str, Any]) -> None:
    handle = rig["launcher"].start(WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)(
        _desired("m-0", _doc())))
    state_dir = rig["dir"] / "shared" / "shared-0"
    assert handle.events() == [] and handle.poll() is None  # no health yet
    _health(state_dir, {"m-0": "STARTING"}, at=1.0)
    assert [e["event"] for e in handle.events()] == ["loading"]
    _health(state_dir, {"m-0": "STARTING"}, at=1.5)
    assert handle.events() == []
    _health(state_dir, {"m-0": "READY"}, at=2.0)
    ready = handle.events()
    assert ready[0]["event"] == "ready" and ready[0]["metrics_port"] == 9123 and ready[0]["records"] == 7
    assert handle.events() == [], "the same health twice is no new progress"
    _health(state_dir, {"m-0": "READY"}, at=3.0)
    assert [e["event"] for e in handle.events()] == ["progress"]
    _health(state_dir, {"m-0": "CRASHED"}, at=4.0, last_error="boom")
    assert handle.events() == [{"event": "error", "detail": "lane crashed: boom"}]


def test_terminate_drains_the_lane_and_exits_once_health_no_longer_lists_it(rig: dict[str, Any]) -> None:
    builder = WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)
    a, b = (rig["launcher"].start(builder(_desired(f"m{i}-0", _doc(name=f"m{i}")))) for i in range(2))
    state_dir = rig["dir"] / "shared" / "shared-0"
    a.terminate()
    assert set(read_desired(state_dir)) == {"m1-0"}
    _health(state_dir, {"m1-0": "READY"}, draining=("m0-0",))
    assert a.poll() is None, "still draining"
    _health(state_dir, {"m1-0": "READY"})
    exit_info = a.poll()
    assert exit_info is not None and exit_info.exit_code == 0
    assert b.poll() is None and rig["inner"].last.signals == [], "the process keeps its other replica"
    b.terminate()
    rig["pool"].maintain()
    assert rig["inner"].last.signals == ["TERM"], "a process hosting nothing is stopped"


def test_a_failed_or_refused_lane_is_an_exit_of_that_replica_only(rig: dict[str, Any]) -> None:
    builder = WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)
    a, b = (rig["launcher"].start(builder(_desired(f"m{i}-0", _doc(name=f"m{i}")))) for i in range(2))
    _health(rig["dir"] / "shared" / "shared-0", {"m0-0": "FAILED", "m1-0": "READY"}, last_error="hung: 31s")
    exit_info = a.poll()
    assert exit_info is not None and "FAILED: hung: 31s" in exit_info.cause
    assert b.poll() is None and rig["pool"].by_replica() == {"m1-0": "shared-0"}
    relaunched = rig["launcher"].start(builder(_desired("m0-0", _doc(name="m0"))))
    assert relaunched.process_id == "shared-1", "the process with the FAILED lane takes no new replica"
    assert len(rig["inner"].started) == 2


def test_kill_removes_the_replica_and_kills_a_process_whose_health_went_stale(rig: dict[str, Any]) -> None:
    builder = WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)
    a, b = (rig["launcher"].start(builder(_desired(f"m{i}-0", _doc(name=f"m{i}")))) for i in range(2))
    a.kill()
    assert a.poll() is not None and rig["inner"].last.signals == [], "a fresh process: only the lane goes"
    assert rig["pool"].processes["shared-0"].sealed
    rig["clock"].advance(11)
    b.kill()
    assert rig["inner"].last.signals == ["KILL"], "no health for 11s: the process is hung as a whole"


def test_a_crashed_shared_process_crashes_every_replica_and_is_restarted_once(rig: dict[str, Any]) -> None:
    clock, inner = rig["clock"], rig["inner"]
    builder = WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)
    sup = Supervisor(rig["launcher"], builder, clock, SupervisorPolicy())
    sup.set_desired([_desired(f"m{i}-0", _doc(name=f"m{i}")) for i in range(2)])
    sup.update()
    state_dir = rig["dir"] / "shared" / "shared-0"
    _health(state_dir, {"m0-0": "READY", "m1-0": "READY"})
    sup.update()
    assert {s.state for s in sup.snapshots()} == {ReplicaState.READY} and len(inner.started) == 1
    assert {s.metrics_port for s in sup.snapshots()} == {9123}

    inner.last.exit(-9)  # the shared process is SIGKILLed
    changes = sup.update()
    crashed = [c for c in changes if c.state == ReplicaState.CRASHED]
    assert len(crashed) == 2 and all("shared process shared-0" in c.reason and "SIGKILL" in c.reason for c in crashed)
    sup.update()
    assert len(inner.started) == 2, "one restart of the process for both replicas"
    assert set(read_desired(state_dir)) == {"m0-0", "m1-0"}
    assert {s.state for s in sup.snapshots()} == {ReplicaState.STARTING}
    assert {s.pid for s in sup.snapshots()} == {inner.last.pid}
    _health(state_dir, {"m0-0": "READY", "m1-0": "READY"})
    sup.update()
    assert {(s.state, s.restarts) for s in sup.snapshots()} == {(ReplicaState.READY, 1)}


def test_the_runtime_of_a_shared_process_is_reported_as_held_memory(rig: dict[str, Any]) -> None:
    builder = WorkerCommandBuilder(rig["dir"] / "r", base_env={}, shared_processes=2)
    a, _b = (rig["launcher"].start(builder(_desired(f"m{i}-0", _doc(name=f"m{i}")))) for i in range(2))
    assert rig["pool"].held_memory_mb(25) == 0, "no health yet: nothing measured"
    _health(rig["dir"] / "shared" / "shared-0", {"m0-0": "READY", "m1-0": "READY"}, rss=1000.0)
    a.events()  # the health is read
    # placement charges each replica its declared 256 MiB + 25 MiB: the rest of the RSS is the runtime
    assert rig["pool"].held_memory_mb(25) == 1000 - 2 * (256 + 25)


def _bundled(name: str, sha: str) -> dict[str, Any]:
    """A model whose own package ``churnpkg`` came as a module archive ``sha`` (as ``sie apply`` uploads it)."""
    doc = _doc(name=name)
    doc["backend"] = {**doc["backend"], "callable": "churnpkg.rules:score",
                      "modules": {"sha256": sha, "name": "modules.zip", "size": 10, "uri": None}}
    return doc


def test_a_model_whose_package_conflicts_with_a_hosted_one_goes_to_another_process_and_says_why(
        rig: dict[str, Any]) -> None:
    """Python imports a package once per process: two builds of ``churnpkg`` never share one (issue 22: the lane
    restart-looped with 'already loaded from ... modules.zip'); the same build may."""
    from sie.workers.agent.shared import import_roots
    from sie.workers.process import LaunchSpec

    launcher, pool = rig["launcher"], rig["pool"]
    pool.slots = 4

    def start(rid: str, doc: dict[str, Any]) -> Any:  # what the builder hands over once the bundle is local
        return launcher.start(LaunchSpec(name=rid, argv=("python",), cwd=str(rig["dir"] / "replicas" / rid),
                                         shared_spec=doc))

    one = start("a-0", _bundled("a", "11" * 32))
    two = start("b-0", _bundled("b", "22" * 32))
    three = start("c-0", _bundled("c", "11" * 32))
    rules = start("fraud-rules-0", _doc())
    assert (one.process_id, two.process_id, three.process_id) == ("shared-0", "shared-1", "shared-0")
    assert rules.process_id == "shared-0"  # models.fraud imports nothing churnpkg does
    assert import_roots(_bundled("a", "11" * 32)) == {"churnpkg": f"bundle {'11' * 32}"}
    assert "package 'churnpkg' of a-0 comes from bundle 1111" in pool.placed_apart["b-0"]
    assert pool.placed_apart["a-0"] == "" and set(read_desired(rig["dir"] / "shared" / "shared-0")) == \
        {"a-0", "c-0", "fraud-rules-0"}
    # the replica's folder travels with it (the agent prepares a rollout's other version there)
    assert read_desired(rig["dir"] / "shared" / "shared-1")["b-0"].dir == str(rig["dir"] / "replicas" / "b-0")


def test_the_builder_decodes_the_template_once_for_the_policy_and_for_sharing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sie.schemas.spec_models import ModelService

    class Policy:
        allowed_modules = ()

        def __init__(self) -> None:
            self.checked: list[Any] = []

        def check(self, spec: Any) -> list[str]:
            self.checked.append(spec)
            return [] if spec.priority_level != "P0" else ["priorityLevel: P0 is not allowed on this node"]

    decoded: list[str] = []
    real = ModelService.from_document.__func__
    monkeypatch.setattr(ModelService, "from_document",
                        classmethod(lambda cls, doc: decoded.append(doc["name"]) or real(cls, doc)))
    policy = Policy()
    builder = WorkerCommandBuilder(tmp_path, base_env={}, shared_processes=4, spec_policy=policy)
    launch = builder(_desired("fraud-rules-0", _doc()))
    assert launch.shared_spec is not None and decoded == ["fraud-rules"]  # checked and judged from one decode
    assert [s.name for s in policy.checked] == ["fraud-rules"]
    from sie.workers.process import LaunchRefused

    with pytest.raises(LaunchRefused, match="P0 is not allowed"):
        builder(_desired("p0-0", _doc(priority_level="P0")))
    with pytest.raises(LaunchRefused, match="not a ModelService document"):
        builder(_desired("junk-0", {"name": "junk", "version": "1"}))
