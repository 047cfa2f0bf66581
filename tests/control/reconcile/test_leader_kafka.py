"""Control-plane leadership on a real broker that stops answering (issue 9, case 4).

Suspected from librdkafka's source, proved here on a broker paused with SIGSTOP (``private_kafka``):

* a commit that times out must not wedge the leader: librdkafka refuses every ``begin_transaction`` while a
  transaction is still open, so a leader that neither retried nor aborted it would never publish again;
* one failed election attempt must not leave the cluster leaderless: librdkafka signals end-of-partition
  once, and an attempt that consumed it and then failed left the retry waiting for a signal that never came.

Both run the real ``LeaderElector`` and ``TransactionalPublisher``; the only thing the tests add is the
pause, timed to fall on the call under test.  The same behaviour against fakes: test_leader_unit.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sie.control.reconcile.leader import LeaderElector, TransactionalPublisher
from sie.control.reconcile.ports import OutRecord
from sie.infra.kafka.local import LocalKafka
from sie.kernel.admin import ensure_topics
from sie.kernel.clients import KafkaClients
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.avro_codec import decode, encode
from sie.streams.eos import EosLimits, Fenced
from tests.support.helpers import consume_all, wait_until

pytestmark = pytest.mark.kafka

NODE = 1  # the private broker's node id
SESSION_MS = 45_000  # longer than any pause here: the tests are about transactions, not group membership


@pytest.fixture()
def broker(private_kafka: LocalKafka) -> Iterator[tuple[LocalKafka, Settings]]:
    settings = private_kafka.settings_for_clients().with_overrides(topic_prefix="lead")
    ensure_topics(settings, system_topics("lead"))
    try:
        yield private_kafka, settings
    finally:
        private_kafka.resume_broker(NODE)  # never leave it frozen for the teardown


def note(detail: str) -> OutRecord:
    return OutRecord("events", "cluster", "ControlEvent", {
        "ts_ms": int(time.time() * 1000), "kind": "note", "model": None, "replica_id": None, "node": None,
        "detail": detail})


def notes(settings: Settings) -> list[str]:
    """Every ControlEvent detail committed on the events topic (read_committed: aborted ones are not there)."""
    return [decode(r.value)["detail"] for r in consume_all(settings, settings.names.system_topic("events"), timeout=30)]


def chain(exc: BaseException | None) -> list[str]:
    """The messages of an exception and of every exception it was raised from or while handling."""
    out: list[str] = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return out


def pause_for(kafka: LocalKafka, seconds: float) -> threading.Timer:
    kafka.pause_broker(NODE)
    timer = threading.Timer(seconds, kafka.resume_broker, args=(NODE,))
    timer.start()
    return timer


def publish_until_ok(elector: LeaderElector, record: OutRecord, timeout: float) -> float:
    """Publish as the controller does, pass after pass: a fenced (or hung) producer makes the instance step
    down and rejoin; any other failure is retried by the next pass.  Returns the seconds it took."""
    start = time.monotonic()
    errors: list[str] = []

    def attempt() -> bool:
        if not elector.is_leader:
            return False
        try:
            TransactionalPublisher(elector).publish([record])
            return True
        except Fenced as exc:
            elector.step_down(f"fenced while publishing: {exc}")
            errors.append(f"fenced: {exc}")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        return False

    wait_until(attempt, timeout, interval=0.3, message=lambda: f"a publish to go through (errors: {errors[-3:]})")
    return time.monotonic() - start


@pytest.mark.parametrize("attempts", [8, 1], ids=["timeout-retried", "timeout-given-up"])
def test_a_commit_that_times_out_on_a_frozen_broker_does_not_wedge_the_leader(broker, attempts, caplog):
    """``attempts=8``: the commit times out (librdkafka's 10 s: "Failed to flush all outstanding messages within
    the API timeout", retriable), is called again and completes once the broker answers.  ``attempts=1``: the
    timed-out commit is given up; its outcome is unknown, so the exactly-once layer never aborts it (librdkafka
    would refuse: "Conflicting commit_transaction API call is already in progress", _CONFLICT): it drops the
    producer (``OutcomeUnknown`` -> ``Fenced``), the instance steps down and is re-elected with a fresh producer
    whose ``init_transactions`` settles the old transaction.  Either way the next publish goes through and
    nothing is committed twice."""
    kafka, settings = broker
    elector = LeaderElector(settings, "ctl-a", session_timeout_ms=SESSION_MS,
                            limits=EosLimits(attempts=attempts, backoff_s=0.1, hang_limit_s=60.0)).start()
    try:
        wait_until(lambda: elector.is_leader, 60, message="leadership")
        TransactionalPublisher(elector).publish([note("before")])
        caplog.set_level(logging.WARNING)

        resumed = pause_for(kafka, 12.0)  # longer than librdkafka's 10 s commit timeout
        failures: list[str] = []
        try:
            TransactionalPublisher(elector).publish([note("during")])
            outcome = "committed"
        except Fenced as exc:
            outcome = f"fenced: {exc}"
            failures = chain(exc)
            elector.step_down(outcome)  # what the controller does with a Fenced publish
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            failures = chain(exc)
        resumed.join()
        took = publish_until_ok(elector, note("after"), 90)

        # proof that the commit under test did time out: librdkafka's own words, retried (attempts=8), or the
        # abort refused because that timed-out commit is still in progress (attempts=1; measured: _CONFLICT)
        seen = failures + [r.getMessage() for r in caplog.records]
        assert [m for m in seen if (m.startswith("commit_transaction") and "timeout" in m.lower())
                or "Conflicting commit_transaction API call is already in progress" in m], (
            f"the commit under test never timed out: {seen}")
        committed = notes(settings)
        assert committed.count("before") == 1 and committed.count("after") == 1
        # committed once, or (the call gave up; the broker may still have finished it) once or not at all
        assert committed.count("during") == 1 if outcome == "committed" else committed.count("during") <= 1
        print(f"attempts={attempts}: during the pause -> {outcome}; next publish after {took:.1f}s; "
              f"epoch {elector.epoch}")
    finally:
        kafka.resume_broker(NODE)
        elector.stop()


class _FreezeOnFirstClaim:
    """Wraps the real producer factory: the first producer's commit (the first election claim) runs on a frozen
    broker, so that attempt fails after it had read ``control-leader`` to its end."""

    def __init__(self, kafka: LocalKafka, seconds: float) -> None:
        self._kafka, self._seconds = kafka, seconds
        self.timer: threading.Timer | None = None
        self.made = 0

    def __call__(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import Producer

        real = Producer(config)
        self.made += 1
        if self.made > 1:
            return real
        freeze: Callable[[], None] = self._freeze

        class Frozen:
            def commit_transaction(self, *args: Any) -> Any:
                freeze()
                return real.commit_transaction(*args)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        return Frozen()

    def _freeze(self) -> None:
        if self.timer is None:
            self.timer = pause_for(self._kafka, self._seconds)


def test_one_failed_election_attempt_is_followed_by_a_successful_one(broker):
    kafka, settings = broker
    history = [("earlier", 41)]
    from confluent_kafka import Producer

    seed = Producer(settings.kafka_client_config())
    for instance, epoch in history:  # an earlier leader's claim: the attempt has something to read to its end
        seed.produce(settings.names.system_topic("control-leader"), key=b"cluster",
                     value=encode("LeaderEpoch", {"instance_id": instance, "epoch": epoch, "ts_ms": 0}))
    assert seed.flush(10) == 0

    freezer = _FreezeOnFirstClaim(kafka, 12.0)
    elector = LeaderElector(settings, "ctl-a", session_timeout_ms=SESSION_MS, clients=KafkaClients(producer=freezer),
                            limits=EosLimits(attempts=1, backoff_s=0.1, hang_limit_s=8.0)).start()
    try:
        wait_until(lambda: freezer.timer is not None, 60, message="the first claim's commit on the frozen broker")
        wait_until(lambda: elector.last_error and "election failed" in elector.last_error, 30,
                   message="the first attempt to fail")
        assert not elector.is_leader
        freezer.timer.join()
        wait_until(lambda: elector.is_leader, 60, message=lambda: f"a later attempt to lead (last error: "
                                                                   f"{elector.last_error})")
        assert freezer.made >= 2 and elector.epoch > 41
        # expected=2: commit_transaction returns once the coordinator logged the commit; the markers that make the
        # claim readable (read_committed) follow, so a read right after it could end before the claim (CI: [41])
        claims = [decode(r.value)["epoch"] for r in consume_all(settings, settings.names.system_topic("control-leader"),
                                                                expected=2, timeout=30)]
        assert claims == [41, elector.epoch]  # the failed claim was never committed; the later one once
        assert elector.status()["ok"]
    finally:
        kafka.resume_broker(NODE)
        elector.stop()
