"""LLM quotas cannot be evaded by renaming (issue 37 item 3).  Before: the caller was whatever name the producer
wrote in ``metadata.caller``, so a fresh name per request got a fresh bucket (every request admitted), naming
another caller spent its budget, and every name kept state forever.  Now a name counts only when listed in
``quotas.callers`` (and, with ``token_sha256``, proved by the ``sie.caller.token`` header); every other request
shares one bucket at the default limits; the state is bounded by the configuration."""

from __future__ import annotations

import hashlib
from collections import Counter

import orjson

from sie.streams.llm.quota import SHARED, TOKEN_HEADER, Quotas
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, sglang_answer

TOKEN = b"vip-secret-token"
VIP = {"requests_per_s": 3, "token_sha256": hashlib.sha256(TOKEN).hexdigest()}


def _value(rid: str, caller: str) -> bytes:
    return orjson.dumps({"id": rid, "inputs": {"question": rid}, "metadata": {"caller": caller}})


def _run(values: list[bytes], headers: list, quotas: dict) -> tuple[dict[str, int], Counter, list]:
    h = Harness(values, sglang_answer, headers=headers, quotas=quotas)
    try:
        wait_until(lambda: h.all_committed(), 20, message="all committed")
        h.close()
        results = ids(h.visible(h.spec.topics.results))
        dead = h.visible(h.spec.topics.dead_letters)
        return results, Counter(dict(hd)["sie.reason"] for _t, _v, _k, hd in dead), dead
    finally:
        h.stop.set()


def test_a_fresh_name_per_request_shares_one_bucket():
    """60 requests, each under a new name, against a default of 0.1 request/s (one second of burst: 1 request)."""
    values = [_value(f"r{i}", f"name-{i}") for i in range(60)]
    results, reasons, dead = _run(values, [], {"requests_per_s": 0.1})
    assert len(results) <= 2  # the shared bucket's burst (+ one refill on a slow machine), not 60
    assert reasons[b"quota_exceeded"] == 60 - len(results)
    assert b"unlisted callers (shared): over requests_per_s 0.1" in dict(dead[0][3])["sie.detail"]


def test_naming_a_token_protected_caller_does_not_spend_its_budget():
    """30 forged requests name "vip" without its token, then vip's own 3 (its burst) with it: vip gets all 3."""
    values = [_value(f"forged{i}", "vip") for i in range(30)] + [_value(f"vip{i}", "vip") for i in range(3)]
    headers = [None] * 30 + [[(TOKEN_HEADER, TOKEN)]] * 3
    results, reasons, _dead = _run(values, headers, {"requests_per_s": 0.1, "callers": {"vip": VIP}})
    assert all(results.get(f"vip{i}") == 1 for i in range(3)), results
    assert sum(1 for k in results if k.startswith("forged")) <= 2
    assert reasons[b"quota_exceeded"] == 33 - len(results)


def test_a_wrong_token_is_not_the_caller_and_reject_refuses_the_unknown():
    q = Quotas({"callers": {"vip": VIP, "team": {"requests_per_s": 5}}, "unknown_callers": "reject"})
    named = {"metadata": {"caller": "vip"}}
    assert q.caller(named, [(TOKEN_HEADER, TOKEN)]) == "vip"
    assert q.caller(named, [(TOKEN_HEADER, b"guess")]) is None and q.caller(named, None) is None
    assert "no valid sie.caller.token header" in q.unknown_why(named)
    assert q.caller({"metadata": {"caller": "team"}}) == "team"  # listed without a token: the name is enough
    assert "not listed" in q.unknown_why({"metadata": {"caller": "x"}})
    assert Quotas({}).caller({"metadata": {"caller": "anyone"}}) == SHARED


def test_the_state_is_bounded_by_the_configuration_not_by_the_names():
    q = Quotas({"requests_per_s": 1000, "tokens_per_s": 10**6, "callers": {"vip": VIP}})
    for i in range(5000):
        caller = q.caller({"metadata": {"caller": f"n{i}-" + "x" * 1000}})
        assert caller is not None
        q.charge(caller, 10, q.take(caller))
    assert q.state_size() <= 3  # the shared bucket's two kinds and its estimate
