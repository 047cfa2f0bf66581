"""Workers' /metrics endpoints as the agent allocates and advertises them, and the numbers a worker
reports of itself (lag, recent p99) on their way into the heartbeat."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.kernel.errors import ConfigError
from sie.schemas.avro_codec import decode, encode
from sie.workers.agent import messages
from sie.workers.agent.launch import MetricsPorts, WorkerCommandBuilder
from sie.workers.process import LaunchSpec
from sie.workers.replica import DesiredReplica
from sie.workers.supervisor import Supervisor
from tests.fakes.workers import FakeClock, FakeLauncher


def replica(index: int = 0) -> DesiredReplica:
    return DesiredReplica(replica_id=f"m-{index}", model="m", version="1", template_json='{"v": 1}')


def test_default_is_any_free_port_and_off_is_none():
    assert MetricsPorts().port_for("m-0", []) == 0
    assert MetricsPorts("off").port_for("m-0", []) is None


def test_a_range_gives_distinct_ports_reused_by_a_restarted_replica_and_freed_when_gone():
    ports = MetricsPorts("9500-9501")
    assert ports.port_for("m-0", []) == 9500
    assert ports.port_for("m-1", ["m-0"]) == 9501
    assert ports.port_for("m-0", ["m-1"]) == 9500  # a restart keeps its port
    with pytest.raises(ConfigError, match="every port is taken"):  # retried (a crash), not FAILED for good
        ports.port_for("m-2", ["m-0", "m-1"])
    assert ports.port_for("m-2", ["m-1"]) == 9500  # m-0 is gone: its port is free again


@pytest.mark.parametrize("bad", ["abc", "80-90", "9600-9500", "1-2-3"])
def test_bad_ranges_are_refused_with_the_option_named(bad: str):
    with pytest.raises(ConfigError, match="--worker-metrics-ports"):
        MetricsPorts(bad)


def test_the_worker_command_line_carries_the_allocated_port(tmp_path: Path):
    builder = WorkerCommandBuilder(tmp_path, base_env={}, metrics_ports=MetricsPorts("9500-9509"))
    argv = builder(replica()).argv
    assert argv[argv.index("--metrics-port") + 1] == "9500"
    assert "--metrics-port" not in WorkerCommandBuilder(tmp_path, base_env={}, metrics_ports=MetricsPorts("off"))(
        replica()).argv


def test_the_supervisor_keeps_what_the_worker_reported_and_forgets_it_on_restart():
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock)
    sup.set_desired([replica()])
    sup.update()
    launcher.last.emit(event="ready", metrics_port=40123)
    launcher.last.emit(event="progress", records=5, lag=17, p99_ms=12.5)
    sup.update()
    (snap,) = sup.snapshots()
    assert (snap.metrics_port, snap.lag, snap.p99_ms) == (40123, 17, 12.5)
    # nonsense from the worker is ignored, not trusted
    launcher.last.emit(event="progress", records=6, lag=-3, metrics_port="x", p99_ms="slow")
    sup.update()
    (snap,) = sup.snapshots()
    assert (snap.metrics_port, snap.lag, snap.p99_ms) == (40123, 17, None)
    launcher.last.exit(1)
    sup.update()  # CRASHED: no process, nothing to advertise
    (snap,) = sup.snapshots()
    assert (snap.metrics_port, snap.lag) == (None, None)


def test_the_heartbeat_advertises_host_and_ports_and_round_trips_through_avro():
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock)
    sup.set_desired([replica()])
    sup.update()
    launcher.last.emit(event="ready", metrics_port=40123)
    launcher.last.emit(event="progress", records=1, lag=3, p99_ms=4.0)
    sup.update()
    record = messages.heartbeat("node-a", 1, 5, [], sup.snapshots(), host="10.0.0.7", metrics_port=9400)
    back = decode(encode("Heartbeat", record))
    assert back["metrics_address"] == "10.0.0.7:9400"
    reported = back["replicas"][0]
    assert (reported["metrics_address"], reported["lag"], reported["p99_ms"]) == ("10.0.0.7:40123", 3, 4.0)
    assert messages.address("::1", 9400) == "[::1]:9400" and messages.address(None, 9400) is None


def test_the_heartbeat_names_each_replicas_process_and_the_hosts_memory():
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock)
    sup.set_desired([replica()])
    sup.update()
    own = decode(encode("Heartbeat", messages.heartbeat("node-a", 1, 5, [], sup.snapshots(), memory_total_mb=64000,
                                                        memory_available_mb=41000)))
    assert own["replicas"][0]["process"] == f"pid-{launcher.last.pid}"
    assert (own["memory_total_mb"], own["memory_available_mb"], own["shared_process_slots"]) == (64000, 41000, 0)
    # the hook a multi-model runtime uses: replica id -> the shared process hosting it
    shared = messages.heartbeat("node-a", 2, 6, [], sup.snapshots(), shared_process_slots=50,
                                processes={"m-0": "shared-1"})
    assert shared["replicas"][0]["process"] == "shared-1" and shared["shared_process_slots"] == 50
    assert shared["memory_total_mb"] is None and shared["memory_available_mb"] is None  # unknown, not 0
    launcher.last.exit(1)
    sup.update()  # CRASHED: no process, so none is named
    assert messages.heartbeat("node-a", 3, 7, [], sup.snapshots())["replicas"][0]["process"] is None


def test_a_backend_outage_the_worker_reports_reaches_the_heartbeat_and_ends_when_it_says_so():
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock)
    sup.set_desired([replica()])
    sup.update()
    launcher.last.emit(event="ready", metrics_port=40123)
    outage = {"since_ms": 1796153631750, "detail": "backend fails on a known-good row too (ConnectionError: refused)"}
    launcher.last.emit(event="progress", records=5, lag=170, outage=outage)
    sup.update()
    (snap,) = sup.snapshots()
    assert snap.outage == outage
    reported = decode(encode("Heartbeat", messages.heartbeat("node-a", 1, 5, [], sup.snapshots())))["replicas"][0]
    assert (reported["outage"], reported["outage_since_ms"]) == (outage["detail"], outage["since_ms"])
    for nonsense in ({"since_ms": "yesterday", "detail": "x"}, {"detail": "x"}, "down", None):  # ignored, not trusted
        launcher.last.emit(event="progress", records=5, outage=nonsense)
        sup.update()
        assert sup.snapshots()[0].outage is None
    launcher.last.emit(event="progress", records=9, outage=outage)
    launcher.last.exit(1)
    sup.update()  # CRASHED: no process, no outage to report
    assert sup.snapshots()[0].outage is None


def test_a_worker_holding_no_partitions_says_why_in_its_replicas_reason_until_it_serves_again():
    """The readiness gate (issue 34): a worker whose routing table names a version not ready here holds no
    partitions; its progress line says why, and the heartbeat's reason carries it (``sie get replicas``)."""
    clock, launcher = FakeClock(), FakeLauncher()
    sup = Supervisor(launcher, lambda d: LaunchSpec(name=d.replica_id, argv=("w",)), clock)
    sup.set_desired([replica()])
    sup.update()
    launcher.last.emit(event="ready", metrics_port=40123)
    why = "holding no partitions: 3.2.0 not ready here (loading)"
    launcher.last.emit(event="progress", records=5, holding=why)
    sup.update()
    reported = decode(encode("Heartbeat", messages.heartbeat("node-a", 1, 5, [], sup.snapshots())))["replicas"][0]
    assert reported["state"] == "READY" and reported["reason"].endswith(f"; {why}"), reported["reason"]
    launcher.last.emit(event="progress", records=9, holding=None)  # every version ready: it serves again
    sup.update()
    reported = messages.heartbeat("node-a", 2, 6, [], sup.snapshots())["replicas"][0]
    assert "holding" not in (reported["reason"] or "")
    launcher.last.emit(event="progress", records=9, holding={"not": "text"})  # ignored, not trusted
    sup.update()
    assert sup.snapshots()[0].holding is None
