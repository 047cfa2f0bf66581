"""Warm pool, its launcher and the supervisor's elasticity hooks with fake processes and a fake clock (no sleeps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sie.workers import worker_main
from sie.workers.process import LaunchSpec
from sie.workers.replica import DesiredReplica
from sie.workers.supervisor import Supervisor, SupervisorPolicy
from sie.workers.warm_pool import PooledLauncher, WarmPool
from tests.fakes.workers import FakeClock, FakeHandle, FakeLauncher


class PoolHandle(FakeHandle):
    """A fake pool worker: records the assignment it was handed."""

    warm = False

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.assigned: dict[str, Any] | None = None
        self.refuse: OSError | None = None

    def assign(self, payload: dict[str, Any], log_path: Path | None) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.assigned = dict(payload)
        self.warm = True


class PoolLauncher(FakeLauncher):
    def start(self, spec: LaunchSpec) -> PoolHandle:
        handle = PoolHandle(200 + len(self.started), spec)
        self.started.append(handle)
        return handle


@pytest.fixture
def pool(tmp_path: Path) -> tuple[WarmPool, PoolLauncher, FakeClock]:
    clock, launcher = FakeClock(), PoolLauncher()
    wp = WarmPool(2, {"SIE_TOPIC_PREFIX": "p", "KEEP": "1"}, tmp_path, python="py", clock=clock, launcher=launcher,
                  refill_delay_s=3, backoff_s=5, rss=lambda pid: 300)
    return wp, launcher, clock


def worker_spec(rid: str = "m-0") -> LaunchSpec:
    args = ("--spec-file", "/w/spec.json", "--replica-id", rid)
    return LaunchSpec(name=rid, argv=("py", "-P", "-m", "sie.workers.worker_main", *args),
                      env={"SIE_TOPIC_PREFIX": "p", "KEEP": "1", "SIE_REPLICA_ID": rid, "CUDA_VISIBLE_DEVICES": "0"},
                      cwd="/w/m-0", log_path=Path("/w/m-0/worker.log"), warm_args=args)


def test_pool_fills_one_worker_per_pass_and_hands_out_only_warm_ones(pool: Any) -> None:
    wp, launcher, clock = pool
    wp.maintain()
    wp.maintain()
    wp.maintain()
    assert [h.spec.argv for h in launcher.started] == [("py", "-P", "-m", "sie.workers.worker_main", "--warm")] * 2
    assert {h.spec.cwd for h in launcher.started} == {str(wp.log_dir)}  # a folder of its own, not the agent's
    assert wp.take() is None  # started, not warm yet
    launcher.started[1].emit(event="warm", import_s=2.5)
    wp.maintain()
    assert wp.ready() == 1 and wp.memory_mb() == 600 and wp.status()["import_s"] == 2.5
    assert wp.take() is launcher.started[1]
    # the replacement waits out the refill delay (its import must not compete with the replica's start)
    clock.advance(2)
    wp.maintain()
    assert len(launcher.started) == 2
    clock.advance(1.5)
    wp.maintain()
    assert len(launcher.started) == 3


def test_a_dying_pool_worker_is_replaced_after_a_backoff(pool: Any) -> None:
    wp, launcher, clock = pool
    wp.maintain()
    wp.maintain()
    launcher.started[0].exit(1)
    wp.maintain()
    assert wp.deaths == 1 and "exited with code 1" in wp.last_error
    assert len(launcher.started) == 2
    clock.advance(5)
    wp.maintain()
    assert len(launcher.started) == 3


def test_pooled_launcher_hands_the_replica_to_a_warm_worker_or_starts_cold(pool: Any) -> None:
    wp, launcher, _ = pool
    cold = FakeLauncher()
    pooled = PooledLauncher(wp, cold)
    assert pooled.start(worker_spec()) is cold.last and pooled.cold_starts == 1  # nothing warm: cold
    wp.maintain()
    launcher.started[0].emit(event="warm")
    wp.maintain()
    handle = pooled.start(worker_spec())
    assert handle is launcher.started[0] and pooled.warm_starts == 1
    assert handle.assigned == {
        "args": ["--spec-file", "/w/spec.json", "--replica-id", "m-0"],
        "env": {"SIE_REPLICA_ID": "m-0", "CUDA_VISIBLE_DEVICES": "0"},  # only what the pool's env lacks
        "cwd": "/w/m-0",  # the replica's folder, as a cold start's
        "log_path": "/w/m-0/worker.log",
    }
    # a launch that is not a worker never takes a pool worker
    launcher.started[1].emit(event="warm")
    wp.maintain()
    pooled.start(LaunchSpec(name="helper", argv=("py", "x")))
    assert wp.ready() == 1 and pooled.cold_starts == 2


def test_a_warm_worker_that_died_meanwhile_falls_back_to_cold(pool: Any) -> None:
    wp, launcher, _ = pool
    cold = FakeLauncher()
    wp.maintain()
    launcher.started[0].emit(event="warm")
    wp.maintain()
    launcher.started[0].refuse = BrokenPipeError("gone")
    handle = PooledLauncher(wp, cold).start(worker_spec())
    assert handle is cold.last and launcher.started[0].signals == ["KILL"]


def _desired(rid: str, gpus: tuple[int, ...] = (0,), mb: int = 16384) -> DesiredReplica:
    return DesiredReplica(rid, rid.rsplit("-", 1)[0], "1", json.dumps({"m": rid}), gpus, mb)


def test_supervisor_reports_p99_and_start_time_and_kind() -> None:
    clock, launcher = FakeClock(), PoolLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock, SupervisorPolicy())
    sup.set_desired([_desired("m-0", (), 0)])
    sup.update()
    launcher.last.warm = True
    clock.advance(0.4)
    launcher.last.emit(event="ready")
    (ready,) = sup.update()
    assert ready.start_s == pytest.approx(0.4) and ready.warm is False  # warm is read at launch
    sup.set_desired([])
    launcher.last.exit(0)
    sup.update()
    sup.update()
    launcher.fail_next = None
    sup.set_desired([_desired("m-1", (), 0)])
    sup.update()
    launcher.last.emit(event="progress", records=7, p99_ms=12.5)
    sup.update()
    (snap,) = [s for s in sup.snapshots() if s.replica_id == "m-1"]
    assert (snap.records, snap.p99_ms) == (7, 12.5)


def test_a_replica_waits_for_gpu_memory_an_evicted_replica_still_holds() -> None:
    clock, launcher = FakeClock(), FakeLauncher(exit_on_term=False)
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock,
                     SupervisorPolicy(drain_grace_s=5), gpu_capacity_mb={0: 24576})
    sup.set_desired([_desired("bulk-0")])
    sup.update()
    launcher.last.emit(event="ready")
    sup.update()
    # the P0 replica replaces the evicted P2 one on GPU 0: it waits until the drain ended
    sup.set_desired([_desired("rt-0", mb=20480)])
    sup.update()
    assert len(launcher.started) == 1 and launcher.last.signals == ["TERM"]
    (rt,) = [s for s in sup.snapshots() if s.replica_id == "rt-0"]
    assert rt.state.value == "PENDING" and "waiting for GPU 0: 16384 MiB still held by bulk-0" in rt.reason
    launcher.last.exit(0)
    sup.update()
    sup.update()
    assert len(launcher.started) == 2 and launcher.last.spec.name == "rt-0"


def test_counting_backend_rate_is_records_per_second_of_inference_over_the_last_minute() -> None:
    now = [100.0]

    class Slow:
        def infer(self, inputs):
            now[0] += 0.01 * len(inputs)
            return [{} for _ in inputs]

    counter = worker_main.CountingBackend(Slow(), clock=lambda: now[0])
    assert counter.rate() is None
    for n in [1] * 98 + [5, 30]:
        counter.infer([{}] * n)
        now[0] += 0.5  # idle between calls: not inference time, so not in the rate
    assert counter.records == 133 and counter.rate() == pytest.approx(100.0)
    now[0] += 61
    assert counter.rate() is None


def test_warm_worker_takes_its_assignment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("SIE_TEST_MARK", "old")
    monkeypatch.chdir(tmp_path)  # (restored after the test: taking the assignment moves the process)
    (tmp_path / "m-3").mkdir()
    payload = {"args": ["--spec-file", str(tmp_path / "s.json"), "--replica-id", "m-3"],
               "env": {"SIE_TEST_MARK": "new"}, "cwd": str(tmp_path / "m-3"), "log_path": None}
    got = worker_main.wait_for_assignment(io.StringIO(json.dumps(payload) + "\n"))
    args = worker_main.take_assignment(got, 7)
    assert (args.replica_id, args.status_fd, args.warm) == ("m-3", 7, False)
    import os

    assert os.environ["SIE_TEST_MARK"] == "new" and os.getcwd() == str(tmp_path / "m-3")
    assert worker_main.wait_for_assignment(io.StringIO("")) is None
    with pytest.raises(ValueError, match="'args' list"):
        worker_main.wait_for_assignment(io.StringIO('{"argv": 1}\n'))
    assert worker_main.parse_args(["--warm"]).warm
