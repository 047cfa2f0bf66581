"""The control plane's state reader (``StateFeeder``) against a fake consumer (no broker).

Where each topic is read from, when the state counts as caught up (the controller does not reconcile
before), and that a record it cannot read is counted and skipped, never the end of the feed.
The same feeder on a real broker: test_control_kafka.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

from sie.control.reconcile.feeder import STATE_TOPICS, StateFeeder
from sie.control.reconcile.records import ClusterState
from sie.kernel.clients import BARRIER_FETCH_WAIT_MS
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import encode
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, fake_clients, kafka_error
from tests.support.helpers import wait_until

SETTINGS = Settings()
NOW_S = 1_000_000.0
HISTORY_S = 600.0
SINCE_MS = int((NOW_S - HISTORY_S) * 1000)
OLD_MS, RECENT_MS = SINCE_MS - 60_000, SINCE_MS + 60_000


def topic(suffix: str) -> str:
    return SETTINGS.names.system_topic(suffix)


def registration(node: str) -> bytes:
    return encode("NodeRegistration", {"node": node, "labels": {}, "tier": None, "cpu_count": 4, "memory_mb": 8192,
                                       "gpus": [], "simulated": True, "agent_version": "t", "started_at_ms": 0})


def replica_status(rid: str, state: str, ts_ms: int) -> bytes:
    return encode("ReplicaStatus", {"replica_id": rid, "node": "node-a", "model": "m", "version": "1", "state": state,
                                    "reason": None, "exit_code": None, "signal": None, "restarts": 0, "ts_ms": ts_ms})


def heartbeat(node: str, ts_ms: int, replicas: list[dict[str, Any]] | None = None) -> bytes:
    return encode("Heartbeat", {"node": node, "ts_ms": ts_ms, "seq": 1, "gpus": [], "replicas": replicas or []})


def event(ts_ms: int) -> bytes:
    return encode("ControlEvent", {"ts_ms": ts_ms, "kind": "placed", "model": "m", "replica_id": None, "node": None,
                                   "detail": "old news"})


def msg(suffix: str, partition: int, offset: int, key: str, value: bytes | None, ts: int = RECENT_MS) -> FakeMessage:
    return FakeMessage(topic(suffix), partition, offset, key.encode(), value, ts)


class Feed:
    def __init__(self, records: list[FakeMessage], state: ClusterState | None = None, **feeder_options: Any) -> None:
        partitions = {t.name: t.partitions for t in system_topics(SETTINGS.topic_prefix)}
        self.consumer = FakeConsumer(records, partitions=partitions)
        self.probes: list[EndsProbe] = []
        self.clients = fake_clients(consumer=self._consumer_for)
        self.state = state or ClusterState()
        self.skipped: list[str] = []
        self.mono = FakeMonotonic()
        self.feeder = StateFeeder(SETTINGS, self.state, clock=lambda: NOW_S, history_s=HISTORY_S,
                                  clients=self.clients.clients, on_skip=self.skipped.append, monotonic=self.mono,
                                  backoff_initial_s=0.01, **feeder_options)

    def _consumer_for(self, config: dict[str, Any]) -> Any:
        """The reader's consumer; the short-lived one that takes a read barrier's ends sees the same log."""
        if config["client.id"] == SETTINGS.names.control_state_ends_client_id:
            self.probes.append(EndsProbe(self.consumer))
            return self.probes[-1]
        return self.consumer

    def start(self) -> Feed:
        self.feeder.start()
        wait_until(lambda: self.consumer.called("assign"), message="the feeder assigned its partitions")
        return self

    def starts(self) -> dict[tuple[str, int], int]:
        (assigned,) = [c.args[0] for c in self.consumer.called("assign")]
        return {(t, p): off for t, p, off in assigned}

    def settle(self) -> None:
        """Until the feeder has polled twice more: whatever was fetchable before has been applied."""
        seen = len(self.consumer.called("poll"))
        wait_until(lambda: len(self.consumer.called("poll")) >= seen + 2, message="two feeder polls")


class EndsProbe:
    """A second consumer on the fake's log: only asks for end offsets."""

    def __init__(self, log: FakeConsumer) -> None:
        self._log, self.closed = log, False

    def configure(self, config: dict[str, Any]) -> EndsProbe:
        return self

    def get_watermark_offsets(self, partition: Any, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        return self._log.get_watermark_offsets(partition, timeout)

    def close(self) -> None:
        self.closed = True


class FakeMonotonic:
    """The feeder's monotonic clock (stall and lag measurements), moved by the test."""

    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def feeds() -> Iterator[list[Feed]]:
    made: list[Feed] = []
    yield made
    for feed in made:
        feed.feeder.stop()
        assert feed.consumer.closed, "the feeder must close its consumer"


def feed(feeds: list[Feed], records: list[FakeMessage], **options: Any) -> Feed:
    feeds.append(Feed(records, **options))
    return feeds[-1].start()


def test_reads_every_state_topic_with_a_reader_that_never_joins_or_commits(feeds):
    f = feed(feeds, [])
    wait_until(f.feeder.caught_up.is_set, message="caught up on empty topics")
    (config,) = f.clients.of("consumer")
    assert config["isolation.level"] == "read_committed"  # a zombie leader's aborted writes never count
    assert config["enable.auto.commit"] is False and config["group.id"] == SETTINGS.names.control_state_group
    assert config["client.id"] == SETTINGS.names.control_state_client_id
    # a new leader's read barrier: an idle partition proves its end with the next fetch answer, so a short long-poll
    assert config["fetch.wait.max.ms"] == BARRIER_FETCH_WAIT_MS
    assert not f.consumer.called("subscribe")
    assert {t for t, _p in f.starts()} == {topic(s) for s in STATE_TOPICS}


def test_caught_up_only_once_every_partition_reached_the_end_it_had_at_start(feeds):
    records = [msg("nodes", 0, 0, "node-a", registration("node-a")),
               msg("assignments", 1, 0, "node-a", None)]  # a tombstone, then a commit marker at offset 1
    f = Feed(records)
    f.consumer.set_watermarks(topic("nodes"), 0, high=2)  # node-b's registration is in Kafka, not fetched yet
    f.consumer.add_marker(topic("assignments"), 1, 1)
    feeds.append(f)
    f.start()
    wait_until(lambda: "node-a" in f.state.nodes, message="node-a applied")
    f.settle()
    assert not f.feeder.caught_up.is_set(), "caught up although nodes[0] is not read to offset 2"

    f.consumer.append(msg("nodes", 0, 1, "node-b", registration("node-b")))
    wait_until(f.feeder.caught_up.is_set, message="caught up once nodes[0] reached offset 2")
    assert set(f.state.nodes) == {"node-a", "node-b"}  # everything up to the end at start was applied first
    assert f.consumer.eof_events >= 1  # assignments[1] ended on a marker: only its end-of-partition event says so


def test_an_unreadable_record_is_counted_and_skipped_and_the_feed_goes_on(feeds):
    f = feed(feeds, [msg("specs", 0, 0, "broken", b"\x00not avro"),
                     msg("nodes", 0, 0, "node-a", registration("node-a"))])
    wait_until(f.feeder.caught_up.is_set, message="caught up despite the bad record")
    assert f.feeder.errors == 1
    assert f.feeder.last_error.startswith(f"{topic('specs')}[0]@0 key='broken': ")
    assert "node-a" in f.state.nodes and f.state.specs == {}

    f.consumer.inject_error(KafkaError(KafkaError._TRANSPORT, "broker down"))  # a client error event
    wait_until(lambda: f.feeder.errors == 2, message="the error event counted")
    f.consumer.append(msg("nodes", 0, 1, "node-b", registration("node-b")))
    wait_until(lambda: "node-b" in f.state.nodes, message="records after the errors still applied")
    assert f.feeder.thread_status().state == "running" and f.feeder.thread_status().restarts == 0  # never stopped


def test_event_like_topics_start_at_the_history_window_and_state_topics_at_the_beginning(feeds):
    records = [
        msg("heartbeats", 0, 0, "node-a", heartbeat("node-a", OLD_MS), OLD_MS),
        msg("heartbeats", 0, 1, "node-a", heartbeat("node-a", RECENT_MS), RECENT_MS),
        msg("heartbeats", 1, 0, "node-b", heartbeat("node-b", OLD_MS), OLD_MS),  # only old ones on p1
        msg("replica-status", 0, 0, "m-0", replica_status("m-0", "FAILED", OLD_MS), OLD_MS),
        msg("replica-status", 0, 1, "m-1", replica_status("m-1", "READY", RECENT_MS), RECENT_MS),
        msg("events", 0, 0, "x", event(OLD_MS), OLD_MS),
        msg("nodes", 0, 0, "node-a", registration("node-a"), OLD_MS),  # compacted state: however old, it counts
    ]
    f = feed(feeds, records)
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    starts = f.starts()
    asked = {(t, p): ts for c in f.consumer.called("offsets_for_times") for t, p, ts in c.args[0]}
    history = {topic(s) for s in ("heartbeats", "replica-status", "events")}
    assert {t for t, _p in asked} == history and set(asked.values()) == {SINCE_MS}
    assert starts[(topic("heartbeats"), 0)] == 1  # the first record inside the window
    assert starts[(topic("heartbeats"), 1)] == 1  # nothing inside the window: from the end
    assert starts[(topic("replica-status"), 0)] == 1 and starts[(topic("events"), 0)] == 1
    assert all(off == OFFSET_BEGINNING for (t, _p), off in starts.items() if t not in history)

    assert set(f.state.nodes) == {"node-a"}
    # replayed: proof of life at its broker timestamp, never "seen now"
    hb = f.state.heartbeats["node-a"]
    assert set(f.state.heartbeats) == {"node-a"} and (hb.seen_at, hb.replayed_at) == (None, RECENT_MS / 1000)
    assert set(f.state.replica_status) == {"m-1"} and f.state.drain_failures() == []  # the old FAILED is history
    assert list(f.state.events) == []


def test_a_record_whose_key_or_value_cannot_be_read_is_skipped_with_its_coordinates(feeds):
    """Issue 9, case 3: the key used to be decoded outside the per-record guard; one non-UTF-8 key killed
    the reader, nothing restarted it, every node looked offline after the timeout and the leader emptied
    every assignment."""
    wrong_type = encode("NodeRegistration", {"node": "x", "labels": {}, "tier": None, "cpu_count": 1, "memory_mb": 1,
                                             "gpus": [], "simulated": True, "agent_version": "t", "started_at_ms": 0})
    f = feed(feeds, [
        FakeMessage(topic("heartbeats"), 0, 0, b"\xff\xfenode", heartbeat("node-a", RECENT_MS), RECENT_MS),
        msg("heartbeats", 0, 1, "node-a", wrong_type),  # valid Avro, but not a Heartbeat: no "node"... fields
        msg("nodes", 0, 0, "node-a", registration("node-a")),
    ])
    wait_until(f.feeder.caught_up.is_set, message="caught up despite the bad records")
    assert f.feeder.skipped == 2 and f.skipped == ["heartbeats", "heartbeats"]
    assert f.feeder.last_skipped.startswith(f"{topic('heartbeats')}[0]@1 key='node-a': ")
    status = f.feeder.status()
    assert status["ok"] and status["skipped_records"] == 2 and status["restarts"] == 0

    f.consumer.append(msg("heartbeats", 0, 2, "node-a", heartbeat("node-a", RECENT_MS)))
    wait_until(lambda: "node-a" in f.state.heartbeats, message="the next good heartbeat applied")
    assert f.feeder.thread_status().restarts == 0  # the feed never stopped


def test_a_node_name_that_breaks_its_rule_is_skipped_where_it_is_decoded(feeds):
    """A node's name is a folder and a key: a registration, an Assignment or a heartbeat naming ``../x`` (written
    past the agents) is skipped and counted; the good records around it are applied."""
    f = feed(feeds, [
        msg("nodes", 0, 0, "../x", registration("../x")),
        msg("heartbeats", 0, 0, "../x", heartbeat("../x", RECENT_MS)),
        msg("nodes", 0, 1, "node-a", registration("node-a")),
    ])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert f.feeder.skipped == 2 and set(f.state.nodes) == {"node-a"} and "../x" not in f.state.heartbeats
    assert "node name" in f.feeder.last_skipped or "must match" in f.feeder.last_skipped


def test_the_undecodable_key_is_shown_escaped_never_raw(feeds):
    f = feed(feeds, [FakeMessage(topic("specs"), 0, 0, b"bad\xffkey", b"x")])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert f.feeder.last_skipped.startswith(f"{topic('specs')}[0]@0 key='bad\\\\xffkey': UnicodeDecodeError")


def test_a_dead_reader_is_restarted_resumes_after_the_last_record_and_is_stale_until_caught_up_again(feeds):
    f = feed(feeds, [msg("nodes", 0, 0, "node-a", registration("node-a"))])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert f.feeder.stale_reason() is None and f.feeder.caught_up_at == NOW_S
    f.consumer.append(msg("nodes", 0, 1, "node-b", registration("node-b")))
    wait_until(lambda: "node-b" in f.state.nodes, message="node-b applied")
    f.consumer.faults["poll"] = [kafka_error(KafkaError._FATAL, "consumer fenced", fatal=True)]

    wait_until(lambda: f.feeder.thread_status().restarts == 1, message="the reader restarted")
    wait_until(f.feeder.caught_up.is_set, message="caught up again")
    f.consumer.append(msg("nodes", 0, 2, "node-c", registration("node-c")))
    wait_until(lambda: "node-c" in f.state.nodes, message="records after the restart applied")
    first, second = [{(t, p): off for t, p, off in c.args[0]} for c in f.consumer.called("assign")]
    assert first[(topic("nodes"), 0)] == OFFSET_BEGINNING
    assert second[(topic("nodes"), 0)] == 2  # resumed after the last record read, nothing applied twice
    assert second[(topic("specs"), 0)] == OFFSET_BEGINNING  # nothing read there yet: from the beginning again
    status = f.feeder.status()
    assert status["ok"] and status["restarts"] == 1 and "consumer fenced" in status["last_death"]


def test_stale_while_dead_or_replaying_and_says_why(feeds):
    f = Feed([msg("nodes", 0, 0, "node-a", registration("node-a"))])
    f.consumer.set_watermarks(topic("nodes"), 0, high=2)  # one more record the reader has not fetched yet
    feeds.append(f)
    f.start()
    wait_until(lambda: "node-a" in f.state.nodes, message="node-a applied")
    assert "not caught up" in f.feeder.stale_reason() and not f.feeder.status()["ok"]
    f.consumer.append(msg("nodes", 0, 1, "node-b", registration("node-b")))
    wait_until(lambda: f.feeder.stale_reason() is None, message="caught up")

    f.consumer.faults["poll"] = kafka_error(KafkaError._FATAL, "broken for good", fatal=True)  # every poll
    wait_until(lambda: f.feeder.thread_status().restarts >= 1, message="the reader died")
    wait_until(lambda: (r := f.feeder.stale_reason()) and "broken for good" in r, message="stale with the reason")
    assert not f.feeder.caught_up.is_set() and f.feeder.caught_up_at is None


def test_a_stalled_reader_is_stale(feeds):
    entered, release = threading.Event(), threading.Event()

    class SlowState(ClusterState):
        def apply_node(self, name, record):  # an apply that hangs: the loop stops polling
            entered.set()
            release.wait(60)
            super().apply_node(name, record)

    f = feed(feeds, [], state=SlowState(), stall_limit_s=15.0)
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    f.consumer.append(msg("nodes", 0, 0, "node-a", registration("node-a")))
    wait_until(entered.is_set, message="the loop hanging in apply_node")  # the poll that took node-a returned
    f.mono.t += 16
    assert f.feeder.stale_reason() == "state reader stalled: no poll for 16s"
    release.set()
    wait_until(lambda: f.feeder.stale_reason() is None, message="polling again")


def test_heartbeats_read_live_count_as_seen_now_whatever_the_agents_clock_says(feeds):
    f = feed(feeds, [msg("heartbeats", 0, 0, "node-a", heartbeat("node-a", RECENT_MS))])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert f.state.heartbeats["node-a"].seen_at is None  # replayed: history, not a live proof of life
    ten_minutes_ms = 600_000
    f.consumer.append(msg("heartbeats", 0, 1, "node-a", heartbeat("node-a", int(NOW_S * 1000) - ten_minutes_ms),
                          ts=int(NOW_S * 1000) - ten_minutes_ms))  # an agent whose clock is 10 minutes behind
    f.consumer.append(msg("heartbeats", 1, 0, "node-b", heartbeat("node-b", int(NOW_S * 1000) + ten_minutes_ms),
                          ts=int(NOW_S * 1000) + ten_minutes_ms))  # and one 10 minutes ahead
    wait_until(lambda: {"node-a", "node-b"} <= set(f.state.heartbeats) and f.state.heartbeats["node-a"].seq == 1
               and f.state.heartbeats["node-a"].seen_at is not None, message="both live heartbeats applied")
    assert f.state.heartbeats["node-a"].seen_at == f.state.heartbeats["node-b"].seen_at == NOW_S
    snap = f.state.snapshot()
    assert snap.node_online("node-a", NOW_S + 5, 6.0) and snap.node_online("node-b", NOW_S + 5, 6.0)
    assert not snap.node_online("node-b", NOW_S + 7, 6.0)  # a clock ahead does not keep it alive longer


def test_lag_behind_the_heartbeats_topic_is_measured_from_the_ends_the_reader_saw(feeds):
    f = feed(feeds, [], lag_limit_s=3.0)
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert f.feeder.lag_reason() is None
    f.consumer.set_watermarks(topic("heartbeats"), 2, high=3)  # the broker has 3 records the reader has not got
    f.mono.t += 1.1
    f.settle()
    f.mono.t += 4.0
    assert f.feeder.lag_s() == pytest.approx(4.0) and f.feeder.lag_reason() == (
        "state reader 4s behind the end of the heartbeats topic")
    assert f.feeder.stale_reason() is None  # lagging is not missing records: the controller's guard weighs it
    asked = [c.args for c in f.consumer.called("get_watermark_offsets") if c.args == (topic("heartbeats"), 2)]
    assert len(asked) >= 2  # at assignment, then the cached end each second
    for offset in range(3):
        f.consumer.append(msg("heartbeats", 2, offset, "node-c", heartbeat("node-c", RECENT_MS)))
    wait_until(lambda: "node-c" in f.state.heartbeats and f.state.heartbeats["node-c"].seq == 1, message="read")
    f.mono.t += 1.1
    f.settle()
    assert f.feeder.lag_reason() is None and f.feeder.lag_s() == 0.0


def test_a_read_barrier_is_reached_only_once_every_partition_is_read_to_the_end_it_had_when_asked(feeds):
    """A new leader's takeover: the old leader's last transaction (an assignment, then its commit marker) lands
    after the standby's feeder caught up; the barrier asked for now waits for it, and the marker's end counts
    (only an end-of-partition event shows it)."""
    f = feed(feeds, [msg("assignments", 0, 0, "node-a", None)])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    f.consumer.set_watermarks(topic("assignments"), 0, high=3)  # committed: the broker has it, the reader not yet
    woken = []
    barrier = f.feeder.sync(on_done=lambda: woken.append(True))
    f.settle()
    assert not barrier.reached() and not woken
    assert barrier.describe() == f"1 partition(s) short: {topic('assignments')}[0] at 1 of 3"
    record = encode("Assignment", {"node": "node-a", "epoch": 7, "issued_at_ms": 1, "replicas": []})
    f.consumer.append(msg("assignments", 0, 1, "node-a", record))
    f.settle()
    assert not barrier.reached(), "the commit marker at offset 2 is not read yet"
    f.consumer.add_marker(topic("assignments"), 0, 2)
    wait_until(barrier.reached, message="the barrier reached once the marker was passed")
    assert woken == [True] and f.state.assignments["node-a"].epoch == 7  # applied before the barrier says so
    later = f.feeder.sync()
    wait_until(later.reached, message="nothing new since: reached at once")
    # the ends come from a consumer of their own (the reader's would wait behind its fetch), closed after
    assert len(f.probes) == 2 and all(p.closed for p in f.probes)


def spec_record(name: str) -> bytes:
    doc = {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": name},
           "spec": {"model": {"name": name, "version": "1.0.0"},
                    "backend": {"type": "python", "callable": "models.fraud.rules:score"}}}
    from sie.schemas.spec import load
    from sie.schemas.spec_store import spec_record as record_of

    return encode("ModelSpecRecord", record_of(load(doc, origin="test"), 0))


def test_a_live_spec_wakes_the_loop_and_the_replay_does_not(feeds):
    """An applied spec is placed in one pass, not at the loop's next interval (bench/bench_scale.py: apply ->
    assignment); the history replayed at start wakes nothing (the first pass after catching up reads it all)."""
    woken: list[str] = []
    f = feed(feeds, [msg("specs", 0, 0, "old", spec_record("old")),
                     msg("nodes", 0, 0, "node-a", registration("node-a"))], on_change=woken.append)
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    f.settle()
    assert woken == [] and "old" in f.state.specs

    f.consumer.append(msg("nodes", 0, 1, "node-b", registration("node-b")))
    f.consumer.append(msg("specs", 0, 1, "new", spec_record("new")))
    wait_until(lambda: woken == ["specs"], message="the live spec woke the loop")
    assert "new" in f.state.specs and "node-b" in f.state.nodes  # a registration wakes nothing
    f.consumer.append(msg("specs", 0, 2, "bad", b"\x00not avro"))
    wait_until(lambda: f.feeder.skipped == 1, message="the unreadable spec skipped")
    assert woken == ["specs"]  # a record that was skipped changed nothing to act on


def test_a_replay_applies_only_the_latest_heartbeat_of_each_node_before_catching_up(feeds):
    """Liveness, GPUs and replica reports come from a node's latest heartbeat: the replay applies that one alone
    (a cold start at 200 nodes replayed ~60,000, 70 s of decoding: bench/bench_scale.py), and before it says it
    caught up; a heartbeat read live is applied as it comes."""
    applied: list[tuple[str, int]] = []

    class Counting(ClusterState):
        def apply_heartbeat(self, record: Any, seen_at: float | None, replayed_at: float | None = None) -> None:
            applied.append((record["node"], record["ts_ms"]))
            super().apply_heartbeat(record, seen_at, replayed_at)

    records = [msg("heartbeats", 0, i, node, heartbeat(node, RECENT_MS + i), RECENT_MS + i)
               for i, node in enumerate(["node-a", "node-b", "node-a", "node-a", "node-b"])]
    f = Feed(records, state=Counting())
    feeds.append(f)
    f.start()
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    assert sorted(applied) == [("node-a", RECENT_MS + 3), ("node-b", RECENT_MS + 4)]
    assert f.state.heartbeats["node-a"].replayed_at == (RECENT_MS + 3) / 1000 and f.state.heartbeats["node-a"].seen_at is None

    f.consumer.append(msg("heartbeats", 0, 5, "node-a", heartbeat("node-a", RECENT_MS + 5)))
    f.consumer.append(msg("heartbeats", 0, 6, "node-a", heartbeat("node-a", RECENT_MS + 6)))
    # the first live one is applied; the second says the same but for its time: only its time is taken
    wait_until(lambda: f.state.heartbeats["node-a"].sent_at == (RECENT_MS + 6) / 1000, message="both live read")
    assert applied[2:] == [("node-a", RECENT_MS + 5)] and f.state.heartbeats["node-a"].seen_at == NOW_S


def test_a_live_heartbeat_that_changed_is_applied_and_one_that_did_not_only_moves_the_nodes_time(feeds):
    """Decoding and folding an unchanged heartbeat was most of a steady leader's CPU at 1,000 nodes: the feeder
    compares its bytes after the time and sequence with the node's last one."""
    f = feed(feeds, [])
    wait_until(f.feeder.caught_up.is_set, message="caught up")
    ready = [{"replica_id": "m-0", "model": "m", "version": "1", "state": "READY", "pid": 1, "restarts": 0}]
    f.consumer.append(msg("heartbeats", 0, 0, "node-a", heartbeat("node-a", RECENT_MS, replicas=ready)))
    wait_until(lambda: "node-a" in f.state.heartbeats, message="the first applied")
    first = f.state.heartbeats["node-a"]
    f.state.take_changes()
    f.consumer.append(msg("heartbeats", 0, 1, "node-a", heartbeat("node-a", RECENT_MS + 2000, replicas=ready)))
    wait_until(lambda: f.state.heartbeats["node-a"].sent_at == (RECENT_MS + 2000) / 1000, message="the same, later")
    touched = f.state.heartbeats["node-a"]
    assert touched.replicas is first.replicas and touched.seen_at == NOW_S and f.state.take_changes().models == set()
    starting = [{**ready[0], "state": "STARTING"}]
    f.consumer.append(msg("heartbeats", 0, 2, "node-a", heartbeat("node-a", RECENT_MS + 4000, replicas=starting)))
    wait_until(lambda: f.state.heartbeats["node-a"].replicas[0].state.value == "STARTING", message="a change applied")
    assert f.state.take_changes().models == {"m"}
