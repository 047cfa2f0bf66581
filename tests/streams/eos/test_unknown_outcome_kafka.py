"""Unknown transaction outcomes reproduced on demand on a real broker, through a fault-injecting proxy (issue 35).

The stage under test is the exactly-once cycle every SIE stage runs (``ExactlyOnce`` over a real read_committed
consumer and a real transactional producer, librdkafka), echoing request records to a result topic.  Every
client of the stage reaches the broker only through ``tests/support/kafka_proxy.py`` (the broker advertises the proxy),
which forwards each request and can drop exactly the answers of one request kind.  The test's own instruments
(the request writer, the proof reader) bypass the proxy.

Each test holds the load back until the fault is in place (the batch that meets the fault is produced after
it), waits on events with deadlines (never on a count that depends on the machine's speed), and ends with the
proof: a fresh read_committed reader finds every request answered exactly once: 0 lost, 0 duplicated.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from sie.kernel.clients import KafkaClients, eos_consumer_config, transactional_producer_config
from sie.streams.eos import EosLimits, ExactlyOnce, Output, Prepared, start_producer
from sie.streams.eos.cycle import BatchStatus
from tests.support.helpers import consume_all, create_topic, unique_group, unique_topic, wait_until
from tests.support.kafka_proxy import END_TXN, TXN_OFFSET_COMMIT, ProxiedCluster, proxied_cluster

pytestmark = pytest.mark.kafka

#: two tries of a transaction call (10 s librdkafka timeout each) before its outcome is unknown; the watchdog
#: gives a call up after 25 s (the scorer's default)
LIMITS = EosLimits(attempts=2, backoff_s=0.1, hang_limit_s=25.0)
SESSION_MS = 10_000


@pytest.fixture()
def cluster(base_settings: Any, tmp_path: Path) -> Iterator[ProxiedCluster]:
    with proxied_cluster(base_settings, tmp_path / "kafka") as proxied:
        yield proxied


class Stage:
    """The exactly-once cycle on its own thread: requests -> echoed results, batch by batch, through the proxy.

    ``on_new_producer`` runs each time the stage creates a transactional producer after its first (the one
    rule's re-creation): the tests lift their fault there, so the new producer meets a healthy broker."""

    def __init__(self, cluster: ProxiedCluster, requests: str, results: str) -> None:
        settings = cluster.settings()
        self.results = results
        self.stop = threading.Event()
        self.outcomes: Counter[BatchStatus] = Counter()
        self.errors: list[BaseException] = []
        self.on_new_producer: Any = None
        self.producers = 0
        self.group = unique_group("unknown")
        self.consumer = Consumer(eos_consumer_config(settings, self.group, "unknown-outcome",
                                                     session_timeout_ms=SESSION_MS, max_batch=20))
        self.consumer.subscribe([requests])
        self.transactional_id = unique_group("unknown-txn")
        config = transactional_producer_config(settings, self.transactional_id, max_batch=20,
                                               transaction_timeout_ms=60_000)

        def factory(conf: dict[str, Any]) -> Any:
            self.producers += 1
            if self.producers > 1 and self.on_new_producer is not None:
                self.on_new_producer()
            return KafkaClients().producer(conf)

        self.producer = start_producer(config, self.stop, factory=factory, limits=LIMITS)
        self.eos = ExactlyOnce(self.producer, self.consumer, self.stop, LIMITS)
        self._thread = threading.Thread(target=self._run, name="stage", daemon=True)
        self._thread.start()

    def _prepare(self, batch: list[Any]) -> Prepared[int]:
        return Prepared([Output(self.results, m.value(), m.key(), source=m, kind="result") for m in batch],
                        len(batch))

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = [m for m in self.consumer.consume(20, 0.2) if m.error() is None]
                if batch:
                    status, _ = self.eos.run_batch(batch, self._prepare)
                    self.outcomes[status] += 1
                else:
                    self.eos.idle()
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self._thread.join(60)
        self.consumer.close()
        assert not self.errors, f"the stage failed: {self.errors[0]!r}"


class Requests:
    """The request writer (direct to the broker, not through the proxy): phases of ids, each phase on demand."""

    def __init__(self, cluster: ProxiedCluster, topic: str) -> None:
        self.settings = cluster.direct_settings()
        self.topic = topic
        self._producer = Producer(self.settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
        self.sent: list[str] = []

    def send(self, n: int) -> list[str]:
        ids = [f"r{len(self.sent) + i}" for i in range(n)]
        for rid in ids:
            self._producer.produce(self.topic, rid.encode(), key=rid.encode(), partition=len(self.sent) % 2)
            self.sent.append(rid)
        assert self._producer.flush(30) == 0, "requests not delivered"
        return ids

    def answered(self, results: str) -> Counter[str]:
        return Counter((r.value or b"").decode() for r in consume_all(self.settings, results, timeout=30))

    def wait_answered(self, results: str, timeout: float, what: str) -> Counter[str]:
        """Until every request sent has a committed result (read_committed, a fresh reader each look)."""
        seen: list[Counter[str]] = [Counter()]

        def done() -> bool:
            seen[0] = self.answered(results)
            return set(self.sent) <= set(seen[0])

        wait_until(done, timeout, interval=0.5,
                   message=lambda: f"{what}: {len(set(self.sent) - set(seen[0]))} of {len(self.sent)} unanswered")
        return seen[0]

    def prove(self, results: str) -> None:
        """Exactly once over the read_committed results: each request answered once, nothing else answered."""
        seen = self.answered(results)
        lost = sorted(set(self.sent) - set(seen))
        doubled = sorted(rid for rid, n in seen.items() if n > 1)
        assert (lost, doubled) == ([], []), f"lost {lost[:10]}, answered twice {doubled[:10]}"
        assert set(seen) == set(self.sent)


def members(cluster: ProxiedCluster, group: str) -> int | None:
    """Members of ``group`` as the broker describes it now (None: not described; never taken for 0)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(cluster.direct_settings().kafka_client_config())
    try:
        return len(admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10).members)
    except Exception:  # noqa: BLE001 - asked again by the caller's wait
        return None


def topics(cluster: ProxiedCluster, replication: int = 1) -> tuple[str, str]:
    settings = cluster.direct_settings()
    config = {"min.insync.replicas": "2"} if replication == 3 else None
    return (create_topic(settings, unique_topic("requests"), partitions=2, replication=replication, config=config),
            create_topic(settings, unique_topic("results"), partitions=2, replication=replication, config=config))


def run_with_lost_answers(cluster: ProxiedCluster, api_key: int) -> Stage:
    """Steady batches, then the answers of ``api_key`` are lost from the next batch's commit on until the stage
    re-creates its producer; then more load.  Returns the closed stage after the proof."""
    requests, results = topics(cluster)
    load = Requests(cluster, requests)
    stage = Stage(cluster, requests, results)
    proxy = cluster.all()[0]
    try:
        load.send(40)
        load.wait_answered(results, 60, "before the fault")
        proxy.drop(api_key)
        stage.on_new_producer = lambda: proxy.undrop(api_key)  # the one rule's new producer meets a healthy broker
        load.send(10)  # the batch that meets the fault
        wait_until(lambda: proxy.dropped[api_key] >= 1, 30, message=f"an answer of api key {api_key} dropped")
        wait_until(lambda: stage.producers >= 2, 90, message="the producer re-created after the unknown outcome")
        load.send(40)
        load.wait_answered(results, 90, "after the fault")
    finally:
        proxy.undrop(api_key)
        stage.close()
    load.prove(results)
    return stage


def test_a_commit_that_reached_the_coordinator_and_lost_its_answer_is_answered_exactly_once(cluster):
    """EndTxn reached the coordinator (it committed), its answer was lost: commit_transaction timed out twice.
    The one rule: no abort, a new producer (its init_transactions finds the transaction committed), positions
    from the committed offsets: the batch is not scored again."""
    stage = run_with_lost_answers(cluster, END_TXN)
    assert stage.eos.aborts == 0 and stage.eos.producer_restarts >= 1
    assert stage.outcomes[BatchStatus.PRODUCER_RESTARTED] >= 1


def test_offsets_whose_answer_was_lost_are_answered_exactly_once(cluster):
    """TxnOffsetCommit reached the group coordinator (the offsets are pending in the transaction), its answer was
    lost.  librdkafka itself fails the transaction (abortable: "Current transaction failed in state
    InTransaction: Failed to commit offsets to transaction ... Timed out"), so its outcome is known: the abort
    goes through (its markers discard the pending offsets), and the batch is read again from the committed
    offsets: once."""
    requests, results = topics(cluster)
    load = Requests(cluster, requests)
    stage = Stage(cluster, requests, results)
    proxy = cluster.all()[0]
    try:
        load.send(40)
        load.wait_answered(results, 60, "before the fault")
        proxy.drop(TXN_OFFSET_COMMIT, count=1)
        load.send(10)  # the batch that meets the fault
        wait_until(lambda: stage.eos.aborts >= 1, 60, message="the transaction whose offsets' answer was lost aborted")
        load.send(40)
        load.wait_answered(results, 90, "after the fault")
    finally:
        proxy.undrop(TXN_OFFSET_COMMIT)
        stage.close()
    load.prove(results)
    assert proxy.dropped[TXN_OFFSET_COMMIT] == 1 and stage.outcomes[BatchStatus.ABORTED] >= 1


def test_a_freeze_of_the_broker_that_outlasts_the_session_is_answered_exactly_once(cluster):
    """Every connection of the stage frozen (nothing forwarded either way) for longer than the consumer's session:
    transaction calls time out or hang, the group drops the member; after the thaw the stage recovers."""
    requests, results = topics(cluster)
    load = Requests(cluster, requests)
    stage = Stage(cluster, requests, results)
    proxy = cluster.all()[0]
    try:
        load.send(40)
        load.wait_answered(results, 60, "before the fault")
        proxy.freeze()
        load.send(10)  # in the broker, unseen by the frozen stage
        # the freeze outlasts the session: the thaw comes once the group has dropped the member
        wait_until(lambda: members(cluster, stage.group) == 0, 60, interval=0.5,
                   message="the group dropping the frozen member after its session")
        proxy.thaw()
        load.send(40)
        load.wait_answered(results, 120, "after the thaw")
    finally:
        proxy.thaw()
        stage.close()
    load.prove(results)


def test_an_abort_whose_answer_was_lost_after_a_failed_transaction_is_answered_exactly_once(cluster):
    """The campaign's sequence (issue 35) as far as a proxy can make it: the offsets' answer is lost (librdkafka
    fails the transaction: abortable), then the abort's EndTxn answer is lost too, so the abort times out: its
    outcome is unknown.  The one rule: a new producer (its init_transactions finishes the abort), positions from
    the committed offsets; the batch is answered once."""
    requests, results = topics(cluster)
    load = Requests(cluster, requests)
    stage = Stage(cluster, requests, results)
    proxy = cluster.all()[0]
    try:
        load.send(40)
        load.wait_answered(results, 60, "before the fault")
        proxy.drop(TXN_OFFSET_COMMIT, count=1)
        proxy.drop(END_TXN)
        stage.on_new_producer = lambda: proxy.undrop(END_TXN)
        load.send(10)  # the batch that meets the fault
        wait_until(lambda: stage.producers >= 2, 120, message="the producer re-created after the abort's answer was lost")
        load.send(40)
        load.wait_answered(results, 90, "after the fault")
    finally:
        proxy.undrop(END_TXN)
        stage.close()
    load.prove(results)
    assert proxy.dropped[TXN_OFFSET_COMMIT] == 1 and proxy.dropped[END_TXN] >= 1
    assert stage.eos.aborts >= 1 and stage.outcomes[BatchStatus.PRODUCER_RESTARTED] >= 1
