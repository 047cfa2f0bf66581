"""Per-caller quotas on a fake clock (buckets, the token estimate, the replica's share, the fair queue of
policy delay), and in the scorer: with reject the caller over its quota gets quota_exceeded dead letters
and the other keeps being answered; with delay nothing is dead-lettered and the other is not held."""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest

from sie.kernel.errors import ConfigError
from sie.streams.llm.dispatch import Job
from sie.streams.llm.fair import FairQueue
from sie.streams.llm.quota import SHARED, Quotas
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, sglang_answer


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_s_refuses_the_excess_and_refills():
    clock = Clock()
    q = Quotas({"requests_per_s": 2, "callers": {"vip": {"requests_per_s": 100}}}, clock)
    assert [q.admit("a") for _ in range(3)][:2] == [None, None]
    assert "over requests_per_s 2" in q.admit("a")
    assert all(q.admit("vip") is None for _ in range(50))  # its own limit
    clock.now += 0.5  # one request refilled
    assert q.admit("a") is None and q.admit("a") is not None


def test_tokens_are_charged_after_the_generation_and_debt_refuses_until_refilled():
    clock = Clock()
    q = Quotas({"tokens_per_s": 100}, clock)
    assert q.admit("a") is None
    q.charge("a", 250)  # a long generation: 150 in debt
    assert "over tokens_per_s 100" in q.admit("a")
    assert q.admit("b") is None  # another caller is not affected
    clock.now += 1.0  # still 50 in debt
    assert q.admit("a") is not None
    clock.now += 0.6
    assert q.admit("a") is None


def test_the_caller_is_read_from_the_configured_path():
    q = Quotas({"caller": "metadata.tenant", "requests_per_s": 1, "callers": {"acme": {}}})
    assert q.named({"metadata": {"tenant": "acme"}}) == "acme" and q.caller({"metadata": {"tenant": "acme"}}) == "acme"
    assert q.named({"metadata": {"tenant": 5}}) is None and q.caller(None) == SHARED
    assert q.caller({"metadata": {"tenant": "other"}}) == SHARED  # unlisted: the shared bucket


@pytest.mark.parametrize("cfg, match", [
    ({"policy": "later"}, "must be one of reject, delay"),
    ({"policy": "delay", "max_delay_s": -1}, "max_delay_s: must be a number > 0"),
    ({"requests_per_s": 0}, "requests_per_s: must be a number > 0"),
    ({"caller": "inputs.x"}, "outside inputs"),
    ({"callers": {"a": {"tokens_per_s": "lots"}}}, r"callers.a.tokens_per_s"),
])
def test_quota_config_errors_name_the_field(cfg, match):
    with pytest.raises(ConfigError, match=match):
        Quotas(cfg)


def test_a_caller_over_its_quota_is_dead_lettered_and_the_other_is_answered():
    def value(i: int, caller: str) -> bytes:
        return orjson.dumps({"id": f"{caller}{i}", "inputs": {"question": f"q{i}"}, "metadata": {"caller": caller}})

    values = [value(i, "greedy" if i % 2 else "polite") for i in range(40)]
    h = Harness(values, sglang_answer, quotas={"callers": {"greedy": {"requests_per_s": 1}}})
    try:
        wait_until(lambda: h.all_committed(), 10, message="all committed")
        h.close()
        results = ids(h.visible(h.spec.topics.results))
        dead = h.visible(h.spec.topics.dead_letters)
        assert all(results[f"polite{i}"] == 1 for i in range(0, 40, 2))
        reasons = Counter(dict(hd)["sie.reason"] for _t, _v, _k, hd in dead)
        assert set(reasons) == {b"quota_exceeded"} and reasons[b"quota_exceeded"] >= 17
        greedy_ok = sum(1 for k in results if k.startswith("greedy"))
        assert greedy_ok + reasons[b"quota_exceeded"] == 20
        assert b"over requests_per_s 1" in dict(dead[0][3])["sie.detail"]
    finally:
        h.stop.set()




def test_taking_a_request_charges_the_callers_mean_tokens_and_the_answer_corrects_it():
    clock = Clock()
    q = Quotas({"tokens_per_s": 100}, clock)
    assert q.take("a") == 0.0  # nothing known yet
    q.charge("a", 40, 0.0)
    assert q.take("a") == 40.0  # the estimate: charged up front, so C requests cannot start on an empty charge
    assert q.wait_s("a") == 0 and q.take("a") == 40.0  # 100 - 40 - 40 - 40 = -20: in debt
    assert q.wait_s("a") == pytest.approx(0.2)
    q.charge("a", 10, 40.0)  # the answer used fewer: 30 refunded
    assert q.wait_s("a") == 0
    q.take("a")  # estimated 34 (the running mean): 10 - 34 = -24
    assert q.wait_s("a") > 0
    q.charge("a", None, 34.0)  # no generation (refused, never answered): the estimate is given back
    assert q.wait_s("a") == 0 and q.take("a") == pytest.approx(34.0)


def test_a_replicas_share_scales_every_quota():
    clock = Clock()
    q = Quotas({"requests_per_s": 4}, clock)
    q.set_share(0.5)  # half the topic's partitions: half of each quota
    assert [q.admit("a") is None for _ in range(3)] == [True, True, False]
    clock.now += 0.5  # 2/s: one request refilled
    assert q.admit("a") is None and q.admit("a") is not None
    q.set_share(1.0)
    clock.now += 0.25
    assert q.admit("a") is None


def _fair(greedy_requests_per_s: float, greedy_held: int, **limits) -> tuple[Clock, FairQueue]:
    """A fair queue holding ``greedy_held`` requests (offsets 0..) of a caller "greedy" with that quota."""
    clock = Clock()
    q = Quotas({"callers": {"greedy": {"requests_per_s": greedy_requests_per_s}}}, clock)
    fair = FairQueue(q, clock=clock, **limits)
    for i in range(greedy_held):
        fair.hold(Job(("t", 0), i, 0, None, {}), "greedy")
    return clock, fair


def test_the_fair_queue_serves_callers_in_turn_and_skips_one_over_quota():
    clock, fair = _fair(2, 10, max_delay_s=30, max_delayed=100)
    for i in range(10, 14):
        fair.hold(Job(("t", 0), i, 0, None, {}), "polite")
    first = fair.release(room=4)  # greedy, polite in turn: greedy's deep backlog does not go first
    assert [r.caller for r in first] == ["greedy", "polite", "greedy", "polite"]
    second = fair.release(room=10)  # greedy is out of requests for now: polite is not held behind it
    assert [r.caller for r in second] == ["polite", "polite"]
    assert fair.size == 8 and fair.release(room=10) == []
    clock.now += 0.5  # greedy refilled one request
    assert [r.job.offset for r in fair.release(room=10)] == [2]
    assert fair.overruns == 0


def test_held_requests_go_at_the_delay_limits_and_count_as_overruns():
    clock, fair = _fair(1, 5, max_delay_s=5, max_delayed=3)
    assert fair.release(room=0) == []  # nothing goes beyond the room, limits or not
    out = fair.release(room=10)  # over max_delayed: the oldest go until 3 are held (the first within quota)
    assert [r.job.offset for r in out] == [0, 1] and [r.overrun for r in out] == [False, True]
    clock.now += 5  # the rest are held max_delay_s: due (the first within the refilled bucket of 1)
    assert [r.job.offset for r in fair.release(room=1)] == [2]
    out = fair.release(room=10)
    assert [r.job.offset for r in out] == [3, 4] and [r.overrun for r in out] == [True, True]
    assert fair.size == 0 and fair.overruns == 3
    fair.hold(Job(("t", 0), 9, 0, None, {}), "greedy")
    assert fair.drop(lambda job: job.offset != 9) == 1 and fair.size == 0


def test_a_caller_over_quota_at_the_limits_still_gets_only_its_turn():
    clock, fair = _fair(1, 10, max_delay_s=30, max_delayed=3)
    for i in range(10, 13):
        fair.hold(Job(("t", 0), i, 0, None, {}), "polite")
    out = fair.release(room=4)  # 13 held > 3: greedy may go over quota, but one turn per round
    assert [r.caller for r in out] == ["greedy", "polite", "greedy", "polite"]
    assert [r.overrun for r in out] == [False, False, True, False]


def test_every_caller_is_due_while_the_window_is_full():
    clock, fair = _fair(1, 5, max_delay_s=30, max_delayed=100)
    assert [r.job.offset for r in fair.release(room=10)] == [0]  # the quota's one request
    assert fair.release(room=10) == []
    out = fair.release(room=2, full=True)  # consumption is paused: held records go, within the room
    assert [r.job.offset for r in out] == [1, 2] and all(r.overrun for r in out)


def test_with_delay_the_caller_over_quota_is_held_not_dead_lettered_and_the_other_is_not_held():
    def value(i: int, caller: str) -> bytes:
        return orjson.dumps({"id": f"{caller}{i}", "inputs": {"question": f"q{i}"}, "metadata": {"caller": caller}})

    sent: dict[str, list[float]] = {"greedy": [], "polite": []}

    def handler(request):
        number = int(orjson.loads(orjson.loads(request.read())["text"])["question"][1:])
        sent["greedy" if number % 2 else "polite"].append(time.monotonic())
        return sglang_answer(request)

    values = [value(i, "greedy" if i % 2 else "polite") for i in range(40)]
    h = Harness(values, handler, partitions=2,  # each answer is 3 + 4 tokens: greedy gets 5 requests/s
                quotas={"policy": "delay", "callers": {"greedy": {"tokens_per_s": 35}}})
    try:
        wait_until(lambda: len(sent["polite"]) == 20, 10, message="polite sent")
        assert len(sent["greedy"]) < 15  # greedy's requests are held in the window, not dead-lettered
        wait_until(lambda: h.all_committed(2), 20, message="all committed")
        summary = h.close()
        assert summary.dead_letters == 0 and not h.visible(h.spec.topics.dead_letters)
        assert ids(h.visible(h.spec.topics.results)) == Counter({orjson.loads(v)["id"]: 1 for v in values})
        start = min(sent["polite"] + sent["greedy"])
        assert max(sent["polite"]) - start < 1.5  # polite kept its pace: nothing of it waited for greedy
        # greedy: 140 tokens at 35/s, the first second's 35 at once: its requests spread over >= 2.5 s
        assert max(sent["greedy"]) - start > 2.5
    finally:
        h.stop.set()


def test_a_replica_enforces_its_partitions_share_of_each_quota_recomputed_on_rebalance():
    from confluent_kafka import TopicPartition

    from sie.kernel.settings import Settings
    from sie.streams.llm.config import LLMConfig
    from sie.streams.llm.stage import LLMScorer
    from sie.streams.scorer.config import ScorerConfig
    from tests.fakes.kafka_clients import cluster_metadata
    from tests.support.llm_fixtures import llm_spec

    spec = llm_spec(["http://fake"], quotas={"policy": "delay", "requests_per_s": 8})
    topic = spec.topics.requests

    class Consumer:  # what _update_share reads: the topic's partitions and this replica's assignment
        assigned = [TopicPartition(topic, 0), TopicPartition(topic, 1), TopicPartition("other", 0)]

        def list_topics(self, name, timeout=None):
            return cluster_metadata({name: 8})

        def assignment(self):
            return self.assigned

    scorer = LLMScorer(ScorerConfig(settings=Settings(), spec=spec, instance="t-0"),
                       LLMConfig.from_backend_config(spec.backend.config))
    consumer = Consumer()
    scorer._update_share(consumer)
    assert scorer.quotas.share == 0.25  # 2 of the topic's 8 partitions
    assert scorer.llm_metrics.quota_share._value.get() == 0.25
    consumer.assigned = [TopicPartition(topic, p) for p in range(4)]
    scorer._on_assign(consumer, [])  # a rebalance marks the share stale; the loop recomputes it
    assert scorer._share_stale
    scorer._update_share(consumer)
    assert scorer.quotas.share == 0.5 and not scorer._share_stale

    def no_metadata(name, timeout=None):
        raise RuntimeError("broker unreachable")

    consumer.list_topics = no_metadata
    scorer._on_assign(consumer, [])
    scorer._update_share(consumer)  # the old share stays; the loop retries in 5 s, not every turn
    assert scorer.quotas.share == 0.5 and scorer._share_stale and scorer._share_retry_at > 0
