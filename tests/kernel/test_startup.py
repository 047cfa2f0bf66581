"""Start in any order (sie.kernel.startup): wait for Kafka and topics with bounded backoff, say what for."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from sie.kernel.settings import Settings
from sie.kernel.startup import (
    MAX_BACKOFF_S,
    Readiness,
    missing_topics,
    retry_until_answered,
    serve_readiness,
    wait_for_kafka,
)


def _md(**topics: int) -> SimpleNamespace:
    return SimpleNamespace(topics={
        name: SimpleNamespace(error=None, partitions={p: SimpleNamespace(leader=1) for p in range(n)})
        for name, n in topics.items()})


class Steps:
    """Metadata answers in order; records each backoff the waiter slept (a fake stop event's wait)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.slept: list[float] = []
        self.stop = SimpleNamespace(is_set=lambda: False, wait=self.slept.append)

    def __call__(self) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_waits_for_the_broker_then_the_topic_saying_what_for_with_bounded_backoff(caplog):
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    steps = Steps(*[down] * 9, _md(other=1), _md(**{"sie.assignments": 3}))
    readiness = Readiness("agent")
    seen: list[str] = []
    original = readiness.waiting
    readiness.waiting = lambda what: (seen.append(what), original(what))  # type: ignore[method-assign]
    assert wait_for_kafka(Settings(), ["sie.assignments"], readiness, steps.stop, metadata=steps) is True
    assert seen[0].startswith("Kafka at ") and "Connection refused" in seen[0]
    assert seen[-1].startswith("topics ['sie.assignments'] (run `sie topics ensure`")
    assert steps.slept[:4] == [0.5, 1.0, 2.0, 4.0] and max(steps.slept) == MAX_BACKOFF_S
    # said once per change, not once per try
    lines = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(lines) == 2


def test_stop_ends_the_wait():
    stop = threading.Event()
    stop.set()
    assert wait_for_kafka(Settings(), ["t"], Readiness("x"), stop, metadata=lambda: _md()) is False


def test_a_first_read_refused_by_a_new_topics_broker_is_retried_saying_why_until_it_answers():
    """A CI run: the agent's thread ended on NOT_LEADER_FOR_PARTITION from a watermark read of a topic created a
    moment before, and the node never followed its assignments."""
    refused = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Broker: Not leader for partition"))
    steps = Steps(refused, refused, {0: 12})
    readiness = Readiness("agent")
    assert retry_until_answered(steps, "the end of sie.assignments", readiness, steps.stop) == {0: 12}
    assert steps.slept == [0.5, 1.0]
    assert readiness.snapshot() == (False, "the end of sie.assignments (Broker: Not leader for partition)")


def test_a_stop_ends_the_retries():
    stop = threading.Event()
    stop.set()
    assert retry_until_answered(lambda: 1, "x", Readiness("x"), stop) is None


def test_a_leaderless_partition_is_still_missing():
    md = _md(a=2)
    md.topics["a"].partitions[1].leader = -1
    assert missing_topics(md, ["a"]) == ["a"]
    assert missing_topics(_md(a=2), ["a"]) == []


def test_readyz_says_503_with_what_it_waits_for_then_200():
    readiness = Readiness("agent")
    port = serve_readiness(readiness, "127.0.0.1", 0)
    readiness.waiting("topics ['sie.assignments']")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert err.value.code == 503 and err.value.read().decode().strip() == "waiting for: topics ['sie.assignments']"
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5).status == 200
    readiness.set_ready("node n1 registered")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as ok:
        assert ok.read().decode().strip() == "node n1 registered"


def test_readyz_asks_the_components_own_check_once_started():
    readiness = Readiness("control")
    state = {"caught_up": False}
    port = serve_readiness(readiness, "127.0.0.1", 0,
                           check=lambda: (state["caught_up"], "serving" if state["caught_up"] else "the state feeder"))
    readiness.set_ready()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert "the state feeder" in err.value.read().decode()
    state["caught_up"] = True
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200
