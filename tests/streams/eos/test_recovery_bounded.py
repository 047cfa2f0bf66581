"""Recovery waits are bounded and stop-aware (sie.streams.eos.bounded, transaction.py, sie.streams.eos), against fakes.

The broker-restart test (tests/test_scorer_kafka.py) proves recovery end to end; these pin the
properties it depends on: no recovery step can hold the loop past a stop request or forever.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sie.kernel.errors import KafkaUnavailable
from sie.streams.eos import BatchStatus, EosLimits, ExactlyOnce, Fenced, Prepared, bounded, transaction
from sie.streams.eos.bounded import BoundedWorker, CallAbandoned, call_bounded
from sie.streams.eos.errors import ProducerFatal, ProducerHung
from sie.streams.eos.transaction import TransactionalProducer, close_quietly, rewind

#: Seconds a thread woken by an event or a timeout may wait for a core on a loaded 2-core CI machine.
SCHEDULING_SLACK_S = 4.0
#: The limit the "gives up after the limit" tests configure (call_bounded's limit_s, _CLOSE_LIMIT_S).
SHORT_LIMIT_S = 0.3


def within(limit_s: float = 0.0) -> float:
    """Longest a bounded wait may take here: its configured limit (0 when a stop request ends it), one
    stop-check tick of call_bounded, and the scheduling slack.  The fakes block for 30-60 s, so a wait that
    ignored its limit or the stop request fails this bound."""
    return limit_s + bounded._TICK_S + SCHEDULING_SLACK_S


@pytest.fixture()
def release():
    """Set at teardown: unblocks the fakes' blocking calls so no helper thread outlives the test."""
    ev = threading.Event()
    yield ev
    ev.set()


def stop_when(entered: threading.Event, stop: threading.Event) -> None:
    """Set ``stop`` once a fake has entered its blocking call (a stop request arriving mid-call)."""
    def run() -> None:
        entered.wait(10)
        stop.set()
    threading.Thread(target=run, daemon=True).start()


# --- call_bounded ------------------------------------------------------------------------------
def test_call_bounded_returns_the_value_and_reraises_the_exception():
    assert call_bounded(lambda: 42, "answer", 5) == 42
    with pytest.raises(ZeroDivisionError):
        call_bounded(lambda: 1 / 0, "divide", 5)


def test_call_bounded_gives_up_after_the_limit(release):
    started = time.monotonic()
    with pytest.raises(CallAbandoned) as info:
        call_bounded(lambda: release.wait(30), "hang", SHORT_LIMIT_S)
    assert not info.value.stopped
    assert time.monotonic() - started < within(SHORT_LIMIT_S)


#: the two ways to make a bounded call: a thread per call, or one long-lived thread (``BoundedWorker``)
CALLERS = pytest.mark.parametrize("bounded_call", [call_bounded, lambda *a: BoundedWorker("w").call(*a)],
                                  ids=["call_bounded", "worker"])


@CALLERS
def test_a_bounded_call_gives_up_at_once_on_stop(release, bounded_call):
    entered, stop = threading.Event(), threading.Event()
    stop_when(entered, stop)

    def blocking() -> None:
        entered.set()
        release.wait(30)

    started = time.monotonic()
    with pytest.raises(CallAbandoned) as info:
        bounded_call(blocking, "hang", 60, stop)
    assert info.value.stopped
    assert time.monotonic() - started < within()


# --- BoundedWorker: call_bounded's contract on one long-lived thread ------------------------------------
def test_bounded_worker_runs_every_call_on_one_thread_and_reraises():
    worker = BoundedWorker("w")
    threads = {worker.call(threading.get_ident, "ident", 5) for _ in range(20)}
    assert len(threads) == 1 and threading.get_ident() not in threads
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0, "divide", 5)
    assert worker.call(threading.get_ident, "ident", 5) in threads  # an exception does not cost the thread
    worker.close()


def test_bounded_worker_leaves_a_hung_call_its_thread_and_answers_the_next_on_a_fresh_one(release):
    worker = BoundedWorker("w")
    first = worker.call(threading.get_ident, "ident", 5)
    started = time.monotonic()
    with pytest.raises(CallAbandoned) as info:
        worker.call(lambda: release.wait(30), "hang", SHORT_LIMIT_S)
    assert not info.value.stopped and time.monotonic() - started < within(SHORT_LIMIT_S)
    second = worker.call(threading.get_ident, "ident", 5)  # not queued behind the hung call
    assert second != first
    worker.close()


class HangingTxnProducer:
    """A started producer whose ``send_offsets_to_transaction`` never answers (librdkafka #5456)."""

    def __init__(self, release: threading.Event) -> None:
        self._release = release
        self.committed = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def send_offsets_to_transaction(self, offsets, metadata, timeout: float) -> None:
        self._release.wait(30)

    def commit_transaction(self, timeout: float) -> None:
        self.committed += 1

    def purge(self, in_queue: bool = True, in_flight: bool = False) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0


def test_a_commit_whose_send_offsets_hangs_is_abandoned_naming_that_call(release):
    limit_s = 5.0  # more than the scheduling slack: both steps' limits (10 s) would fail within(one limit)
    fake = HangingTxnProducer(release)
    tp = TransactionalProducer({"transactional.id": "t"}, lambda _c: fake, 3, 0.001, threading.Event(),
                               hang_limit_s=limit_s)
    assert tp.start() is True
    tp.commit()  # no offsets: commit_transaction alone, answered
    assert fake.committed == 1
    started = time.monotonic()
    with pytest.raises(ProducerHung, match="send_offsets_to_transaction: no answer"):
        tp.commit([TopicPartition("t", 0, 5)], object())
    # each step gets one call's limit from its own start: the hung first step is given up after one limit, not
    # after both steps' (a broker freeze in the fault campaign: a 50 s wait stalled scoring 62 s, past its bound);
    # commit_transaction never ran
    took = time.monotonic() - started
    assert limit_s <= took < within(limit_s) and fake.committed == 1, took


class SlowTxnProducer(HangingTxnProducer):
    """Each transaction call answers, after ``delay_s``."""

    def __init__(self, release: threading.Event, delay_s: float) -> None:
        super().__init__(release)
        self.delay_s = delay_s

    def send_offsets_to_transaction(self, offsets, metadata, timeout: float) -> None:
        time.sleep(self.delay_s)  # a slow coordinator's answer (the call under test), not a synchronisation

    def commit_transaction(self, timeout: float) -> None:
        time.sleep(self.delay_s)  # the slow coordinator's second answer (the call under test)
        self.committed += 1


def test_each_step_of_a_commit_has_its_own_limit_so_two_slow_answers_are_not_a_hang(release):
    """send_offsets and commit each answer at 70 % of the limit: 140 % of one limit in all, and not a hang."""
    fake = SlowTxnProducer(release, 0.7 * SHORT_LIMIT_S * 2)
    tp = TransactionalProducer({"transactional.id": "t"}, lambda _c: fake, 3, 0.001, threading.Event(),
                               hang_limit_s=2 * SHORT_LIMIT_S)
    assert tp.start() is True
    started = time.monotonic()
    tp.commit([TopicPartition("t", 0, 5)], object())
    assert fake.committed == 1 and time.monotonic() - started >= 1.4 * 2 * SHORT_LIMIT_S


# --- TransactionalProducer.start / restart -------------------------------------------------------
class FakeProducer:
    def __init__(self, init) -> None:
        self._init = init
        self.purged = False

    def init_transactions(self, timeout: float) -> None:
        self._init(timeout)

    def purge(self, in_queue: bool = True, in_flight: bool = False) -> None:
        self.purged = True

    def flush(self, timeout: float) -> int:
        return 0


def retriable(_timeout: float) -> None:
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator load in progress", retriable=True))


def test_start_retries_retriable_errors_until_the_broker_answers():
    made: list[FakeProducer] = []
    behaviours = [retriable, retriable, lambda _t: None]

    def factory(_config):
        made.append(FakeProducer(behaviours[len(made)]))
        return made[-1]

    tp = TransactionalProducer({"transactional.id": "t"}, factory, 3, 0.001, threading.Event())
    assert tp.start() is True
    assert len(made) == 3 and made[0].purged and made[1].purged and not made[2].purged


def test_start_gives_up_after_patience_and_names_the_transactional_id():
    tp = TransactionalProducer({"transactional.id": "sie.scorer.m.x"}, lambda _c: FakeProducer(retriable), 3, 0.001,
                               threading.Event())
    with pytest.raises(KafkaUnavailable, match="sie.scorer.m.x"):
        tp.start(patience_s=0.05)


def test_restart_stuck_in_init_transactions_returns_promptly_on_stop(release):
    entered, stop = threading.Event(), threading.Event()

    def hang(_timeout: float) -> None:
        entered.set()
        release.wait(60)

    tp = TransactionalProducer({"transactional.id": "t"}, lambda _c: FakeProducer(hang), 3, 0.001, stop)
    stop_when(entered, stop)
    started = time.monotonic()
    assert tp.restart() is False
    assert time.monotonic() - started < within()
    with pytest.raises(ProducerFatal):  # no producer: a batch cannot start on it
        tp.begin()


def test_start_does_nothing_once_stop_is_set():
    stop = threading.Event()
    stop.set()
    made: list[object] = []
    tp = TransactionalProducer({"transactional.id": "t"}, lambda _c: made.append(1), 3, 0.001, stop)
    assert tp.start() is False and made == []


# --- rewind / close ------------------------------------------------------------------------------
class BlockingConsumer:
    def __init__(self, release: threading.Event, entered: threading.Event | None = None) -> None:
        self._release = release
        self._entered = entered or threading.Event()

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", 0)]

    def committed(self, tps, timeout: float):
        self._entered.set()
        self._release.wait(60)
        return tps

    def close(self) -> None:
        self._release.wait(60)


def test_rewind_waiting_on_the_coordinator_returns_promptly_on_stop(release):
    entered, stop = threading.Event(), threading.Event()
    stop_when(entered, stop)
    started = time.monotonic()
    assert rewind(BlockingConsumer(release, entered), {("t", 0): 5}, stop) is False
    assert time.monotonic() - started < within()


def test_close_quietly_abandons_a_consumer_close_that_never_returns(release, monkeypatch, caplog):
    monkeypatch.setattr(transaction, "_CLOSE_LIMIT_S", SHORT_LIMIT_S)
    closed = []

    class Producer:
        def close(self) -> None:
            closed.append(True)

    started = time.monotonic()
    close_quietly(BlockingConsumer(release), Producer())  # type: ignore[arg-type]
    assert time.monotonic() - started < within(SHORT_LIMIT_S)
    assert closed == [True]  # the producer is still closed
    assert "consumer close" in caplog.text


# --- ExactlyOnce: hangs are not fencing -------------------------------------------------------------
class FailingCommitProducer:
    """The slice of TransactionalProducer that ExactlyOnce/Checkpoint use; every commit fails with ``error``."""

    transactional_id = "t"
    transaction_timeout_s = 10.0

    def __init__(self, error: Exception) -> None:
        self._error = error
        self.restarts = 0

    def begin(self) -> None:
        pass

    def start_commit(self, offsets=None, metadata=None, then=None) -> None:
        raise self._error

    def restart(self) -> bool:
        self.restarts += 1
        return True


class IdleConsumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list:
        return []


def test_hung_calls_keep_recovering_while_fatal_errors_stop_at_the_limit():
    limits = EosLimits(fatal_limit=3)
    hung = FailingCommitProducer(ProducerHung("send_offsets_to_transaction: no answer after 15s"))
    eos = ExactlyOnce(hung, IdleConsumer(), threading.Event(), limits)  # type: ignore[arg-type]
    for _ in range(10):
        assert eos.run_batch([], lambda _b: Prepared())[0] is BatchStatus.PRODUCER_RESTARTED
    assert hung.restarts == 10

    fenced = FailingCommitProducer(ProducerFatal("commit_transaction: fenced (fatal)"))
    eos = ExactlyOnce(fenced, IdleConsumer(), threading.Event(), limits)  # type: ignore[arg-type]
    for _ in range(2):
        eos.run_batch([], lambda _b: Prepared())
    with pytest.raises(Fenced):
        eos.run_batch([], lambda _b: Prepared())


def test_a_transaction_its_coordinator_timed_out_is_not_counted_as_fenced():
    """Its coordinator aborted it and bumped the epoch (the stage was cut off or slow past transaction.timeout.ms):
    the next call fails as fenced, which is not another live holder of the id (issue 27, a stage in a partial
    partition for minutes would otherwise stop with ``Fenced``)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 6.0  # every read: 6 s later (a transaction outlives its 10 s between begin and the failure)
        return now[0]

    fenced = FailingCommitProducer(ProducerFatal("commit_transaction: fenced (fatal)"))
    eos = ExactlyOnce(fenced, IdleConsumer(), threading.Event(), EosLimits(fatal_limit=3), clock=clock)  # type: ignore[arg-type]
    for _ in range(10):
        assert eos.run_batch([], lambda _b: Prepared())[0] is BatchStatus.PRODUCER_RESTARTED
    assert fenced.restarts == 10
