"""Quota policy delay, Kafka-native part (``sie.streams.llm.defer``): the decision which callers' held
requests move to the deferred topic, the origin's header round trip, and the fair queue's handling of
deferred requests (due only at quota and after ``not_before``; the limits count fresh requests only)."""

from __future__ import annotations

import pytest

from sie.kernel.errors import ConfigError
from sie.kernel.names import Names
from sie.streams.eos.deadletter import dead_letter
from sie.streams.llm.config import deferred_topic
from sie.streams.llm.defer import AtOrigin, DeferPolicy, Origin
from sie.streams.llm.dispatch import Job
from sie.streams.llm.fair import FairQueue
from sie.streams.llm.quota import Quotas
from tests.support.llm_fixtures import llm_spec


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


class Msg:
    def __init__(self, headers) -> None:
        self._headers = headers

    def topic(self) -> str:
        return "sie.model.m.deferred"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 99

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"{}"

    def headers(self):
        return self._headers

    def timestamp(self):
        return (1, 5)


def test_the_origin_round_trips_through_headers_and_keeps_the_originals():
    origin = Origin("sie.model.m.requests", 2, 41, 1700, "greedy", 1800)
    headers = origin.headers([("trace", b"t1"), ("sie.deferred.offset", b"7")])
    assert ("trace", b"t1") in headers and ("sie.deferred.offset", b"7") not in headers
    assert Origin.read(headers) == origin
    assert Origin.read(Origin("t", 0, 1, None, "-", 0).headers(None)) == Origin("t", 0, 1, None, "-", 0)


def test_a_malformed_or_missing_origin_reads_as_none():
    assert Origin.read(None) is None and Origin.read([("trace", b"x")]) is None
    bad = [(k, b"x" if k.endswith("offset") else v) for k, v in Origin("t", 0, 1, 2, "c", 3).headers(None)]
    assert Origin.read(bad) is None
    assert Origin.read([(k, None) for k, _v in Origin("t", 0, 1, 2, "c", 3).headers(None)]) is None


def test_a_deferred_records_dead_letter_names_the_original_coordinates():
    origin = Origin("sie.model.m.requests", 2, 41, 1700, "greedy", 1800)
    out = dead_letter("dlq", AtOrigin(Msg(origin.headers([("trace", b"t1")])), origin), "inference_error", "x")
    h = dict(out.headers or [])
    assert h["sie.source.topic"] == b"sie.model.m.requests" and h["sie.source.offset"] == b"41"
    assert h["sie.source.partition"] == b"2" and h["trace"] == b"t1"


def test_only_a_caller_over_quota_holding_too_much_or_too_long_is_deferred():
    policy = DeferPolicy(over=4, after_s=1.0, window=8)
    waits = {"greedy": 0.5, "polite": 0.0, "slow": 0.2, "few": 0.3}
    held = {"greedy": (5, 9.9), "polite": (50, 0.0), "slow": (1, 8.5), "few": (2, 9.5)}
    assert policy.callers(held, waits.__getitem__, now=10.0) == ["greedy", "slow"]


def test_the_deferred_topic_name_comes_from_names():
    assert Names("sie").llm_deferred_topic("chat") == "sie.model.chat.deferred"


def _fair(clock: Clock) -> FairQueue:
    q = Quotas({"policy": "delay", "callers": {"greedy": {"requests_per_s": 1}}}, clock)
    return FairQueue(q, max_delay_s=10.0, max_delayed=2, clock=clock)


def test_take_fresh_moves_a_callers_request_partition_records_and_keeps_its_deferred_ones():
    clock = Clock()
    fair = _fair(clock)
    for i in range(3):
        fair.hold(Job(("req", 0), i, 0, None, {}), "greedy")
    fair.hold(Job(("def", 0), 0, 0, None, {}), "greedy", deferred=True, not_before=0.0)
    assert fair.fresh_held() == {"greedy": (3, 10.0)} and fair.size == 4 and fair.fresh == 3
    taken = fair.take_fresh("greedy")
    assert [h.job.offset for h in taken] == [0, 1, 2]
    assert fair.size == 1 and fair.fresh == 0 and fair.fresh_held() == {}


def test_a_deferred_request_goes_only_at_its_quota_and_after_not_before_never_at_the_limits():
    clock = Clock()
    fair = _fair(clock)
    fair.hold(Job(("def", 0), 0, 0, None, {}), "greedy", deferred=True, not_before=12.0)
    assert fair.release(4) == []  # quota allows, but not before 12.0
    clock.now = 12.0
    assert [r.job.offset for r in fair.release(4)] == [0]  # quota allows, not_before passed
    for i in range(1, 5):  # more than max_delayed, all deferred: the limits do not apply to them
        fair.hold(Job(("def", 0), i, 0, None, {}), "greedy", deferred=True)
    clock.now = 30.0  # waited > max_delay_s
    assert [r.job.offset for r in fair.release(4)] == [1]  # one per refill of its 1 request/s bucket
    assert fair.overruns == 0
    assert [r.job.offset for r in fair.release(4, full=True)] == [2, 3, 4]  # a full window: everyone is due


def test_only_a_window_spec_with_policy_delay_and_defer_has_a_deferred_topic():
    names = Names("sie")
    url = [{"url": "http://fake", "concurrency": 2}]
    delay = llm_spec(url, quotas={"policy": "delay", "tokens_per_s": 10})
    assert deferred_topic(delay, names) == f"sie.model.{delay.name}.deferred"
    assert deferred_topic(llm_spec(url, quotas={"policy": "reject", "tokens_per_s": 10}), names) is None
    assert deferred_topic(llm_spec(url, quotas={"policy": "delay", "defer": False}), names) is None
    assert deferred_topic(llm_spec(url), names) is None


def test_the_defer_keys_are_checked():
    with pytest.raises(ConfigError, match=r"quotas\.defer: must be true or false"):
        Quotas({"policy": "delay", "defer": "yes"})
    with pytest.raises(ConfigError, match=r"quotas\.defer_over: must be a number > 0"):
        Quotas({"policy": "delay", "defer_over": 0})
    q = Quotas({"policy": "reject"})
    assert not q.defer  # reject never defers
    q = Quotas({"policy": "delay", "defer_over": 3, "deferred_window": 9, "defer_after_s": 0.5})
    assert (q.defer, q.defer_over, q.deferred_window, q.defer_after_s) == (True, 3, 9, 0.5)
