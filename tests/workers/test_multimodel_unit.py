"""Multi-model worker processes without a broker: the desired-models file, the watchdog's judgement, the
merged /metrics, what a shared process refuses, and the bounded client queues of a lane."""

from __future__ import annotations

import json
import threading

import pytest
from prometheus_client import generate_latest

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from sie.streams.scorer import ScorerConfig
from sie.streams.scorer.metrics import ScorerMetrics
from sie.workers.multimodel.desired import DESIRED_FILE, DesiredModel, read_desired, write_desired
from sie.workers.multimodel.host import Host
from sie.workers.multimodel.lane import LANE_FETCH_KBYTES, Lane, lane_producer_kbytes
from sie.workers.worker_main import CountingBackend
from tests.support.scorer_fixtures import echo_policy, echo_spec


def test_desired_file_round_trip_and_errors(tmp_path) -> None:
    spec = echo_spec("m1")
    assert read_desired(tmp_path) == {}  # no file yet: host nothing
    write_desired(tmp_path, [DesiredModel("m1-0", spec.to_document())])
    wanted = read_desired(tmp_path)
    assert list(wanted) == ["m1-0"] and wanted["m1-0"].spec == spec.to_document()
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file was renamed over the real one"
    (tmp_path / DESIRED_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        read_desired(tmp_path)
    (tmp_path / DESIRED_FILE).write_text(json.dumps({"models": [{"replica_id": "a b", "spec": {}}]}))
    with pytest.raises(ConfigError, match="replica_id"):
        read_desired(tmp_path)
    doc = {"models": [{"replica_id": "a", "spec": {}}, {"replica_id": "a", "spec": {}}]}
    (tmp_path / DESIRED_FILE).write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="appears twice"):
        read_desired(tmp_path)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Inner:
    def infer(self, rows):
        return [{"y": 1.0} for _ in rows]


def _lane(clock: _Clock, hang_s: float = 5.0) -> Lane:
    spec = echo_spec("m1")
    return Lane("m1-0", spec, settings=Settings(), policy=echo_policy(), weights=None,
                metrics=ScorerMetrics.for_spec(spec), hang_s=hang_s, start_s=60.0, clock=clock)


def test_watchdog_tells_a_hung_call_from_a_slow_or_idle_one() -> None:
    clock = _Clock()
    lane = _lane(clock)
    counter = CountingBackend(_Inner(), clock=clock)
    lane.generation, lane.state, lane._counter = 1, ReplicaState.READY, counter
    assert lane.problem() is None, "idle: no call in progress"
    counter.busy_since = clock.now  # a call started now
    clock.now += 4.9
    assert lane.problem() is None, "slow but within the deadline"
    clock.now += 0.2
    assert "inference call running for 5.1s" in (lane.problem() or "")
    counter.infer([{"x": 1.0}])
    assert counter.busy_since is None, "a call that returned clears the mark"
    lane.state, lane._since = ReplicaState.STARTING, clock.now
    clock.now += 61
    assert lane.problem() is None, "starting but not loading (waiting for Kafka): an outage is retried, not a hang"
    lane._loading_since = clock.now
    clock.now += 61
    assert "loading the model for 61.0s" in (lane.problem() or "")


def test_a_lane_hung_too_often_is_failed_and_its_zombie_generation_says_nothing() -> None:
    clock = _Clock()
    lane = _lane(clock)
    starts: list[int] = []
    lane.start = lambda: starts.append(lane.generation)  # type: ignore[method-assign]  # no thread, no Kafka
    lane.generation, lane.state, lane._stop = 1, ReplicaState.READY, threading.Event()
    old_stop = lane._stop
    lane.restart_hung("inference call running for 6.0s")
    assert old_stop.is_set(), "the hung generation is told to stop (it never re-initialises its producer)"
    assert lane.hangs == 1 and starts == [1] and lane.last_error.startswith("hung: ")
    lane.restart_hung("again")
    lane.restart_hung("and again")
    assert lane.state is ReplicaState.FAILED and len(starts) == 2, "the third hang: FAILED, not restarted"
    lane._set(1, ReplicaState.READY)  # what a zombie generation's on_ready would do
    assert lane.state is ReplicaState.FAILED
    assert lane.health()["hangs"] == 3


def test_one_metrics_page_names_each_family_once_with_every_lane(tmp_path) -> None:
    host = Host(Settings(), tmp_path, policy=echo_policy(), weights=object())
    a, b = _lane(_Clock()), _lane(_Clock())
    b.metrics = ScorerMetrics.for_spec(echo_spec("m2"))
    a.metrics.records_in.inc(3)
    b.metrics.records_in.inc(5)
    host.lanes = {"m1-0": a, "m2-0": b}
    text = generate_latest(host.registry).decode()
    assert text.count("# HELP sie_records_in_total ") == 1
    assert 'sie_records_in_total{model_id="m1"} 3.0' in text and 'sie_records_in_total{model_id="m2"} 5.0' in text


def test_host_refuses_what_it_cannot_share_and_reports_it(tmp_path) -> None:
    host = Host(Settings(), tmp_path, policy=echo_policy(), weights=object())
    sglang = echo_spec("llm").to_document()
    sglang["backend"] = {"type": "sglang", "model_path": "some/model"}
    outside = echo_spec("evil").to_document()
    outside["backend"]["callable"] = "os:system"
    write_desired(tmp_path, [DesiredModel("llm-0", sglang), DesiredModel("evil-0", outside)])
    host.reconcile()
    assert host.lanes == {}
    refused = host.health()["refused"]
    assert "cannot share a process" in refused["llm-0"]
    assert "evil-0" in refused and host.health()["ok"] is False
    host.reconcile()  # the same refused spec is not tried again
    write_desired(tmp_path, [])
    host.reconcile()
    assert host.health()["refused"] == {}, "a replica no longer wanted is no longer reported"


def test_a_lane_bounds_its_client_queues_through_the_client_roles() -> None:
    settings = Settings()
    config = ScorerConfig(settings=settings, spec=echo_spec("m1"), instance="m1-0", fetch_queue_kbytes=LANE_FETCH_KBYTES,
                          producer_buffer_kbytes=lane_producer_kbytes(settings))
    assert config.consumer_config()["queued.max.messages.kbytes"] == LANE_FETCH_KBYTES
    assert config.producer_config()["queue.buffering.max.kbytes"] == lane_producer_kbytes(settings)
    assert "queue.buffering.max.kbytes" not in ScorerConfig(settings=settings, spec=echo_spec("m1"),
                                                            instance="x").producer_config()
    with pytest.raises(ConfigError, match="producer_buffer_kbytes"):
        ScorerConfig(settings=settings, spec=echo_spec("m1"), instance="x", producer_buffer_kbytes=100)


class _Msg:
    def __init__(self, key: bytes, value: bytes | None) -> None:
        self._key, self._value = key, value

    def error(self):
        return None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class _RolloutsConsumer:
    """The rollouts topic as a fake consumer: ``pending`` is what the next consume() returns."""

    def __init__(self, config: dict) -> None:
        self.config, self.pending, self.closed = config, [], False

    def list_topics(self, topic=None, timeout=None):
        from types import SimpleNamespace

        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None})})

    def assign(self, partitions) -> None:
        self.assigned = partitions

    def consume(self, n, timeout):
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def close(self) -> None:
        self.closed = True


def test_one_rollouts_reader_serves_every_model_of_the_process() -> None:
    from sie.schemas.avro_codec import encode
    from sie.streams.scorer.rollout import KafkaWeightSource
    from tests.streams.scorer.test_rollout_routing import record

    consumers: list[_RolloutsConsumer] = []
    source = KafkaWeightSource(Settings(), None, consumer_factory=lambda c: consumers.append(_RolloutsConsumer(c))
                               or consumers[-1], reader="shared-1")
    a, b = echo_spec("ma"), echo_spec("mb")
    wire = {"started_ms": 1, "phase_since_ms": 1, "reason": "", "policy_json": "{}", "events": [],
            "updated_at_ms": 1}  # the fields a scorer does not read
    rec_a = {**record(a, {**a.to_document(), "version": "1.1.0"}, "Progressing", 500, 3), **wire}
    rec_b = {**record(b, {**b.to_document(), "version": "1.1.0"}, "Progressing", 9000, 7), **wire}
    consumers[0].pending = [_Msg(b"ma", encode("Rollout", rec_a)), _Msg(b"mb", encode("Rollout", rec_b))]
    view_a, view_b, view_c = source.view("ma"), source.view("mb"), source.view("mc")
    assert view_a.latest()["epoch"] == 3 and view_b.latest()["epoch"] == 7 and view_c.latest() is None
    consumers[0].pending = [_Msg(b"ma", None)]  # a tombstone removes that model's record only
    assert view_a.latest() is None and view_b.latest()["weight_bp"] == 9000
    view_a.close()
    assert not consumers[0].closed, "a view leaves the shared reader open"
    source.close()
    assert consumers[0].closed and consumers[0].config["group.id"].endswith("rollout-weights.shared-1")
    with pytest.raises(ValueError, match="view"):
        source.latest()
