"""Per-caller quotas (policy reject) on a fake clock, and in the scorer: the caller over its quota gets
quota_exceeded dead letters, the other keeps being answered."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from sie.kernel.errors import ConfigError
from sie.streams.llm.quota import Quotas
from tests.helpers import wait_until
from tests.llm_fixtures import Harness, ids, sglang_answer


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
    q = Quotas({"caller": "metadata.tenant", "requests_per_s": 1})
    assert q.caller({"metadata": {"tenant": "acme"}}) == "acme"
    assert q.caller({"metadata": {"tenant": 5}}) == "-" and q.caller(None) == "-"


@pytest.mark.parametrize("cfg, match", [
    ({"policy": "delay"}, "only 'reject'"),
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


