"""Control-plane leadership (``LeaderElector``) against fake Kafka clients (no broker).

Election: hold partition 0 of control-leader, fence earlier writers (init_transactions), read the topic to
its high watermark with a reader of its own, publish LeaderEpoch(max seen + 1) and a ControlEvent in one transaction.  Stepping
down: a fenced producer or partition 0 taken away.  Transactions: a commit that times out is called again;
one that keeps timing out cannot be aborted (librdkafka), so its producer is dropped and a new term leads:
never left open.  Failover between real processes on a real broker: test_control_kafka.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.leader import LeaderElector, TransactionalPublisher
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import ClusterState
from sie.kernel.settings import Settings
from sie.schemas.avro_codec import decode, encode
from sie.streams.eos import EosLimits, Fenced
from tests.control.reconcile.test_control_unit import gpu, heartbeat, register, spec_record
from tests.fakes.kafka_clients import FakeClients, FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error
from tests.support.helpers import wait_until

SETTINGS = Settings()
NAMES = SETTINGS.names
CONTROL_LEADER = NAMES.system_topic("control-leader")
P0 = TopicPartition(CONTROL_LEADER, 0)
NOW_S = 5.0  # a wall clock below every epoch on the topic: the "highest + 1" rule decides (floor: its own test)
LIMITS = EosLimits(attempts=2, backoff_s=0.001, hang_limit_s=5.0)


def claim(epoch: int, instance: str = "old-leader") -> bytes:
    return encode("LeaderEpoch", {"instance_id": instance, "epoch": epoch, "ts_ms": 0})


def abortable() -> Exception:
    return kafka_error(KafkaError._STATE, "transaction failed", txn_requires_abort=True)


@dataclass
class Election:
    elector: LeaderElector
    consumer: FakeConsumer  # the group member
    clients: FakeClients
    producers: list[FakeProducer]
    readers: list[FakeConsumer]  # each election attempt's reader of control-leader
    changes: list[tuple[bool, int]] = field(default_factory=list)

    def decoded(self, producer: FakeProducer) -> list[list[tuple[str, dict[str, Any]]]]:
        """Each committed transaction's records: (topic, decoded value)."""
        return [[(r.topic, decode(r.value)) for r in txn] for txn in producer.transactions]

    def settle(self) -> None:
        """Until the election thread polled twice more (every loop pass polls once)."""
        seen = len(self.consumer.called("poll"))
        wait_until(lambda: len(self.consumer.called("poll")) >= seen + 2, message="two election loop passes")


@pytest.fixture
def election() -> Iterator[Any]:
    made: list[Election] = []

    def start(faults: dict[str, Any] | None = None, history: tuple[int, ...] = (3, 7), now: float = NOW_S) -> Election:
        # earlier terms on the topic, each followed by its transaction's commit marker
        def topic() -> FakeConsumer:
            fake = FakeConsumer([FakeMessage(CONTROL_LEADER, 0, 2 * i, b"cluster", claim(epoch))
                                 for i, epoch in enumerate(history)], partitions={CONTROL_LEADER: 1})
            for i in range(len(history)):
                fake.add_marker(CONTROL_LEADER, 0, 2 * i + 1)
            return fake

        consumer = topic()
        readers: list[FakeConsumer] = []

        def make_consumer(config: dict[str, Any]) -> FakeConsumer:
            if config["group.id"] == NAMES.control_group:
                return consumer
            readers.append(topic())
            return readers[-1]

        producers: list[FakeProducer] = []
        script = dict(faults or {})  # one script for every producer the elector makes

        def make_producer(_config: dict[str, Any]) -> FakeProducer:
            producers.append(FakeProducer(script))
            return producers[-1]

        clients = fake_clients(consumer=make_consumer, producer=make_producer)
        e = Election(LeaderElector(SETTINGS, "ctl-a", clock=lambda: now, clients=clients.clients, limits=LIMITS),
                     consumer, clients, producers, readers)
        e.elector._on_change = lambda leader, epoch: e.changes.append((leader, epoch))
        made.append(e)
        e.elector.start()
        return e

    yield start
    for e in made:
        e.elector.stop()
        assert not e.elector.alive and e.consumer.closed  # closing leaves the group: a standby takes over at once


def test_leads_with_the_next_epoch_after_fencing_and_reading_the_topic_to_its_end(election):
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    assert e.elector.epoch == 8 and e.changes == [(True, 8)]
    (producer,) = e.producers
    assert e.decoded(producer) == [[
        (CONTROL_LEADER, {"instance_id": "ctl-a", "epoch": 8, "ts_ms": int(NOW_S * 1000)}),
        (NAMES.system_topic("events"), {"ts_ms": int(NOW_S * 1000), "kind": "leader_elected", "model": None,
                                        "replica_id": None, "node": None,
                                        "detail": "control plane ctl-a leads with epoch 8"}),
    ]]  # both records in ONE transaction: an epoch is never claimed without its event, nor the reverse
    # the end of the topic is taken after init_transactions: a zombie's open claim is resolved by then
    fenced_at = producer.called("init_transactions")[0].seq
    (reader,) = e.readers
    assert [c.seq > fenced_at for c in reader.called("get_watermark_offsets")] == [True]
    assert reader.closed and not e.consumer.called("get_watermark_offsets")  # never the group member's position
    assert e.elector.producer is not None and not producer.in_transaction

    member, read = e.clients.of("consumer")
    assert member["group.id"] == NAMES.control_group and read["group.id"] != NAMES.control_group
    assert member["partition.assignment.strategy"] == "cooperative-sticky"  # a standby joining costs no blip
    (writer,) = e.clients.of("producer")
    assert writer["transactional.id"] == NAMES.control_transactional_id  # shared: the next leader fences us


def test_a_failed_election_is_retried_and_the_retry_reads_the_topic_afresh(election):
    e = election({"commit_transaction": [abortable()]})
    wait_until(lambda: e.elector.is_leader, timeout=10, message="leadership at the second attempt")
    first, second = e.producers
    assert first.aborts == 1 and first.transactions == [] and first.purged  # nothing of the failed claim is visible
    assert e.decoded(second)[0][0][1]["epoch"] == 8  # the failed claim was never committed: still max + 1
    assert "election failed" in (e.elector.last_error or "")
    # each attempt reads with a reader of its own from the beginning: no state of the failed one carries over
    assert len(e.readers) == 2 and all(r.closed for r in e.readers)


def test_a_fenced_producer_makes_the_leader_step_down_then_it_rejoins_and_leads_a_new_term(election):
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    state = ClusterState()
    state.apply_spec("m", spec_record("m"))
    register(state, "node-a", [gpu(0)])
    heartbeat(state, "node-a", NOW_S, [gpu(0)])
    controller = Controller(state, TransactionalPublisher(e.elector), e.elector, ControlConfig())
    first = e.producers[0]
    first.faults["commit_transaction"] = [kafka_error(KafkaError._FENCED, "fenced by a newer epoch", fatal=True)]

    report = controller.reconcile(NOW_S)
    assert report.errors["publish"].startswith("fenced:") and report.published == ()
    assert not e.elector.is_leader and first.purged  # nothing it still queued can be delivered
    assert len(first.transactions) == 1  # only its election: the fenced pass wrote nothing

    wait_until(lambda: e.elector.is_leader, message="a new term after rejoining the group")
    assert e.elector.epoch == 9 and e.changes == [(True, 8), (False, 8), (True, 9)]
    assert e.consumer.called("unsubscribe") and len(e.consumer.called("subscribe")) == 2
    assert e.decoded(e.producers[1])[0][0][1]["epoch"] == 9


@pytest.mark.parametrize("lost", [False, True])
def test_losing_partition_0_steps_down_and_publishing_is_refused(election, lost):
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    e.consumer.revoke([P0], lost=lost)
    wait_until(lambda: not e.elector.is_leader, message="stepping down")
    assert e.producers[0].purged and e.elector.producer is None and e.changes == [(True, 8), (False, 8)]
    with pytest.raises(Fenced, match="not the leader"):
        TransactionalPublisher(e.elector).publish([OutRecord("events", "cluster", "ControlEvent", {
            "ts_ms": 1, "kind": "x", "model": None, "replica_id": None, "node": None, "detail": ""})])
    e.settle()
    assert len(e.producers) == 1  # a standby without partition 0 does not try to lead


def note(detail: str) -> OutRecord:
    return OutRecord("events", "cluster", "ControlEvent", {
        "ts_ms": 1, "kind": "note", "model": None, "replica_id": None, "node": None, "detail": detail})


def test_a_commit_that_times_out_is_called_again_and_completes(election):
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    producer = e.producers[0]
    producer.faults["commit_transaction"] = [kafka_error(KafkaError._TIMED_OUT, "commit timed out", retriable=True)]
    TransactionalPublisher(e.elector).publish([note("kept")])
    assert [rec["detail"] for _t, rec in e.decoded(producer)[-1]] == ["kept"] and producer.aborts == 0
    assert not producer.commit_in_progress and e.elector.is_leader


def test_a_commit_that_keeps_timing_out_is_never_left_open_the_producer_is_dropped_and_a_new_term_leads(election):
    """A commit whose retries all timed out has an unknown outcome (it goes on in the background: librdkafka
    would refuse an abort with _CONFLICT, and every begin_transaction until it is settled).  So the layer never
    tries to abort it: it drops the producer (Fenced for the leader), the instance steps down and a fresh
    producer's init_transactions settles the old transaction (the one rule, sie.streams.eos.cycle)."""
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    producer = e.producers[0]
    timeout = [kafka_error(KafkaError._TIMED_OUT, "commit timed out", retriable=True) for _ in range(LIMITS.attempts)]
    producer.faults["commit_transaction"] = timeout
    state = ClusterState()
    controller = Controller(state, TransactionalPublisher(e.elector), e.elector, ControlConfig())
    state.apply_spec("m", spec_record("m"))
    register(state, "node-a", [gpu(0)])
    heartbeat(state, "node-a", NOW_S, [gpu(0)])

    report = controller.reconcile(NOW_S)  # the pass whose commit keeps timing out
    assert "whether the transaction committed is unknown" in report.errors["publish"]
    assert len(producer.called("commit_transaction")) == 1 + LIMITS.attempts  # the election's + the retries
    assert producer.aborts == 0  # what may have committed is never aborted
    assert not e.elector.is_leader and producer.purged  # stepped down; nothing it queued is delivered

    wait_until(lambda: e.elector.is_leader, message="a new term with a fresh producer")
    assert e.elector.epoch == 9 and e.producers[1] is e.elector.producer._producer
    report = controller.reconcile(NOW_S)  # the next pass publishes the same decisions on the new producer
    assert report.errors == {} and report.of("assignments")
    assert all(not p.in_transaction for p in e.producers[1:])
    assert producer.transactions == [producer.transactions[0]]  # the old producer committed only its election


@pytest.mark.parametrize(("history", "now", "expected"), [
    ((), 1_700_000_000.7, 1_700_000_000),  # the topic was recreated: no history, the wall clock's seconds
    ((3, 7), 1_700_000_000.0, 1_700_000_000),  # an old incarnation's small epochs are left far behind
    ((1_800_000_000,), 1_700_000_000.0, 1_800_000_001),  # a clock behind the last leader's: still highest + 1
])
def test_the_epoch_never_goes_backwards_even_when_the_control_leader_topic_was_recreated(election, history, now,
                                                                                         expected):
    """Agents ignore an assignment of a lower epoch than one they applied; a leader that restarted the count
    at 1 after the topic was recreated would be ignored by every agent, forever."""
    e = election(history=history, now=now)
    wait_until(lambda: e.elector.is_leader, message="leadership")
    assert e.elector.epoch == expected
    assert e.decoded(e.producers[0])[0][0][1]["epoch"] == expected


def test_a_dying_election_thread_steps_down_then_is_restarted_and_leads_again(election):
    e = election()
    wait_until(lambda: e.elector.is_leader, message="leadership")
    assert e.elector.status()["ok"] and e.elector.status()["detail"] == "leader (epoch 8)"
    e.consumer.faults["poll"] = [RuntimeError("poll blew up")]  # whatever kills the thread: a bug, a client error

    wait_until(lambda: e.elector.thread_status().restarts == 1, message="the election thread restarted")
    assert (False, 8) in e.changes  # it stepped down first: without its thread it cannot keep its membership
    assert e.producers[0].purged
    wait_until(lambda: e.elector.is_leader, message="leadership again after the restart")
    assert e.elector.epoch == 9 and e.changes == [(True, 8), (False, 8), (True, 9)]
    assert len(e.consumer.called("subscribe")) == 2  # the new run joined the group afresh
    status = e.elector.status()
    assert status["ok"] and status["restarts"] == 1 and "RuntimeError: poll blew up" in status["last_error"]
