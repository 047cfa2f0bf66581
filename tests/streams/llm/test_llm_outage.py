"""An LLM model whose endpoints all fail shows it (issue 41 item 5): the backend-outage state the worker forwards
(the model Degraded in ``sie describe``, ``sie_backend_outage`` for the alert) within seconds, the held requests
counted as lag, the outage's end and each endpoint's recovery logged, and ``sla.max_queue_time_ms`` doing what
docs/llm.md says: a request that waits for an endpoint past it is answered ``expired``, never sent again."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import orjson

from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, question, sglang_answer


class Switch:
    """A server that refuses connections until ``up`` is set."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.refused = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up.is_set():
            self.refused += 1
            raise httpx.ConnectError("connection refused", request=request)
        return sglang_answer(request)


def _lag(h: Harness) -> float:
    m = h.scorer.metrics
    return sum(m.value("sie_consumer_lag", {"model_id": m.model_id, "partition": str(p)}) for p in range(2))


def test_all_endpoints_down_is_an_outage_with_lag_and_every_held_request_is_answered_once_after(caplog):
    caplog.set_level(logging.WARNING, logger="sie.llm")
    server = Switch()
    h = Harness([question(i) for i in range(20)], server, partitions=2, endpoint_backoff_s=0.05,
                endpoint_backoff_max_s=0.2,
                endpoints=[{"url": "http://a", "concurrency": 2}, {"url": "http://b", "concurrency": 2}])
    try:
        m = h.scorer.metrics
        wait_until(lambda: m.outage() is not None, 10, message="the outage is reported")
        outage = m.outage()
        assert "http://a: ConnectError" in outage["detail"] and "http://b: ConnectError" in outage["detail"]
        assert m.value("sie_backend_outage", {"model_id": m.model_id}) == 1
        assert m.value("sie_backend_outages_total", {"model_id": m.model_id}) == 1
        # the requests are read and held: they count as lag (the batch scorer's lag would read 0 here)
        wait_until(lambda: _lag(h) == 20, 10, message="held requests count as lag")
        assert h.committed(0) + h.committed(1) == 0
        server.up.set()
        wait_until(lambda: h.all_committed(2), 15, message="every held request answered")
        wait_until(lambda: m.outage() is None, 5, message="the outage ends")
        assert m.value("sie_backend_outage", {"model_id": m.model_id}) == 0
        wait_until(lambda: _lag(h) == 0, 10, message="no lag once answered")
        h.close()
        results = ids(h.visible(h.spec.topics.results))
        assert results == {f"q{i}": 1 for i in range(20)}
        assert not h.visible(h.spec.topics.dead_letters)  # an outage is never a dead letter
        logged = caplog.text
        assert "backend outage: no LLM endpoint answers" in logged and "held until an endpoint answers" in logged
        assert "backend outage over after" in logged
        assert "endpoint http://a answers again" in logged or "endpoint http://b answers again" in logged
    finally:
        h.stop.set()


def test_a_request_waiting_for_an_endpoint_past_max_queue_time_is_answered_expired_not_held():
    """docs/llm.md: ``sla.max_queue_time_ms`` bounds the wait before a generation starts, an outage included."""
    server = Switch()
    sent_after_expiry: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if expired.is_set():
            sent_after_expiry.append(orjson.loads(request.read())["text"])
        return server(request)

    expired = threading.Event()
    h = Harness([question(i) for i in range(6)], handler, sla={"max_queue_time_ms": 1500}, ts_ms=int(time.time() * 1000),
                wall_clock=time.time, endpoint_backoff_s=0.05, endpoint_backoff_max_s=0.2)
    try:
        wait_until(lambda: h.all_committed(), 20, message="every request answered expired during the outage")
        expired.set()
        server.up.set()
        h.close()
        docs = [orjson.loads(v) for _t, v, _k, _h in h.visible(h.spec.topics.results)]
        assert sorted(d["id"] for d in docs) == [f"q{i}" for i in range(6)]
        assert all(d["status"] == "expired" and "sla.max_queue_time_ms 1500" in d["error"] for d in docs)
        assert all(d["timings"]["queue_ms"] >= 1500 for d in docs)
        assert sent_after_expiry == []  # an expired request is never sent again
    finally:
        h.stop.set()
