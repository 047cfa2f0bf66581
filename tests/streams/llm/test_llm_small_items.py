"""Issue 41 item 6: the director's defaults fire at an endpoint's real concurrency, its log line names the
endpoint once, httpx writes no line per request at the default level, and ``timings.batch_size`` of an LLM
result is the continuous batch the request joined at its endpoint."""

from __future__ import annotations

import logging
import threading

import httpx
import orjson

from sie.commands._runtime import configure_logging
from sie.control.reconcile.director import Signal, direct
from sie.streams.llm.config import LLMConfig
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, question, sglang_answer


def _policy(**director: object):
    cfg = {"endpoints": [{"url": "http://a", "concurrency": 8}, {"url": "http://b", "concurrency": 8}]}
    if director:
        cfg["director"] = director
    return LLMConfig.from_backend_config(cfg).director


def test_the_default_director_fires_for_a_full_8_slot_endpoint():
    policy = _policy()
    assert (policy.hot_queue, policy.cool_queue) == (6.8, 4.8)  # from the slots; it was 50 and 10
    full, idle = Signal("http://a", 100.0, 8.0, 900.0), Signal("http://b", 10.0, 1.0, 50.0)
    tracks, decisions = direct([full, idle], {}, 0.0, policy)
    _tracks, decisions = direct([full, idle], tracks, policy.sustain_s, policy)
    assert [(d.name, d.action) for d in decisions] == [("http://a", "shift_away")]
    assert decisions[0].reason.count("http://a") == 1
    # what the config gives stays the config's; unequal endpoints: hot from the smallest, cool from the largest
    assert _policy(hot_queue=5).hot_queue == 5
    mixed = LLMConfig.from_backend_config({"endpoints": [{"url": "http://a", "concurrency": 8},
                                                         {"url": "http://b", "concurrency": 64}]}).director
    assert (mixed.hot_queue, mixed.cool_queue) == (6.8, 6.8)


def test_the_director_s_log_line_names_the_endpoint_once(caplog):
    caplog.set_level(logging.WARNING, logger="sie.llm")
    gate = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            gate.wait(20)  # endpoint a stalls: its slots fill and stay full
        return sglang_answer(request)

    h = Harness([question(i) for i in range(40)], handler, director={"sustain_s": 0.2, "hold_s": 60},
                director_interval_ms=50, endpoints=[{"url": "http://a", "concurrency": 4},
                                                    {"url": "http://b", "concurrency": 4}])
    try:
        wait_until(lambda: h.scorer.director_decisions, 15, message="the stalled endpoint is shifted away")
        lines = [r.getMessage() for r in caplog.records if "traffic director" in r.getMessage()]
        assert lines and lines[0].startswith("traffic director shift_away: http://a: utilisation 100% > 85% and "
                                             "queue 4 > 3.4")
        assert lines[0].count("http://a") == 1
        gate.set()
        wait_until(h.all_committed, 20, message="all committed")
    finally:
        gate.set()
        h.stop.set()


def test_httpx_is_quiet_at_the_default_level():
    try:
        configure_logging("info")
        assert logging.getLogger("httpx").level == logging.WARNING  # no "HTTP Request: POST ..." per generation
        assert logging.getLogger("httpcore").level == logging.WARNING
        configure_logging("debug")
        assert logging.getLogger("httpx").level == logging.DEBUG
    finally:
        for name in ("httpx", "httpcore", "sie.kafka"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_batch_size_is_the_continuous_batch_the_request_joined():
    both_in = threading.Barrier(4, timeout=20)

    def handler(request: httpx.Request) -> httpx.Response:
        both_in.wait()  # four requests in flight at once at the one endpoint
        return sglang_answer(request)

    h = Harness([question(i) for i in range(4)], handler, concurrency=4)
    try:
        wait_until(h.all_committed, 20, message="all committed")
        h.close()
        sizes = sorted(orjson.loads(v)["timings"]["batch_size"] for _t, v, _k, _h in h.visible(h.spec.topics.results))
        assert sizes[-1] == 4 and all(1 <= s <= 4 for s in sizes)  # the last one sent joined three in flight
    finally:
        h.stop.set()
