"""The endpoint pool on a fake clock: key stickiness, concurrency limits, ejection, backoff, half-open, and
P0 isolation on a shared endpoint (reserved slots, P0 first in dispatch order)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from sie.streams.llm.pool import Endpoint, EndpointPool
from tests.support.helpers import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(n: int = 3, concurrency: int = 4, clock: Clock | None = None) -> EndpointPool:
    return EndpointPool([Endpoint(f"http://e{i}", concurrency) for i in range(n)], backoff_s=1.0,
                        backoff_max_s=8.0, clock=clock or Clock())


def test_the_same_key_goes_to_the_same_endpoint_and_keys_spread():
    p = pool()
    stop = threading.Event()
    first = {}
    for i in range(60):
        key = f"user-{i}".encode()
        e = p.acquire(key, stop)
        first[key] = e.url
        p.release(e)
    for key, url in first.items():  # again: the same choice for each key
        e = p.acquire(key, stop)
        assert e.url == url
        p.release(e)
    spread = Counter(first.values())
    assert len(spread) == 3 and min(spread.values()) >= 10, spread


def test_a_full_preferred_endpoint_spills_to_the_least_loaded():
    p = pool(2, concurrency=1)
    stop = threading.Event()
    a = p.acquire(b"k", stop)
    b = p.acquire(b"k", stop)  # k's endpoint is full: the other one takes it
    assert a.url != b.url
    assert p.choose(b"k", 100.0) is None  # both full
    p.release(a)
    assert p.acquire(b"k", stop).url == a.url


def test_weights_steer_unkeyed_traffic_and_zero_weight_takes_none():
    p = pool(2, concurrency=100)
    p.set_weight("http://e1", 0.0)
    stop = threading.Event()
    got = Counter(p.acquire(None, stop).url for _ in range(50))
    assert got == {"http://e0": 50}


def test_a_failing_endpoint_is_out_for_a_doubling_backoff_then_half_open():
    clock = Clock()
    p = pool(2, concurrency=4, clock=clock)
    stop = threading.Event()
    e0 = p.endpoints[0]
    e0.in_flight = 3  # three requests in flight on e0 when it dies
    assert p.failed(e0, "ConnectError") == 1.0
    assert p.failed(e0, "ConnectError") == 0.0 and p.failed(e0, "ConnectError") == 0.0  # same outage: once
    assert e0.failures == 1 and e0.in_flight == 0
    assert all(p.acquire(f"k{i}".encode(), stop).url == "http://e1" for i in range(4))  # e0 is out
    clock.now += 1.0  # backoff over: half-open, one request at a time
    probe = p.acquire(None, stop)
    assert probe is e0 and e0.limit() == 1 and p.choose(None, clock.now) is None
    assert p.failed(e0, "ConnectError") == 2.0  # failed again: the backoff doubles
    clock.now += 2.0
    e = p.acquire(None, stop)
    assert e is e0
    p.release(e)  # an answer: back to full concurrency
    assert e0.failures == 0 and e0.limit() == 4


def test_backoff_is_capped_and_acquire_gives_up_on_stop():
    clock = Clock()
    p = pool(1, concurrency=1, clock=clock)
    e0 = p.endpoints[0]
    backoffs = []
    for _ in range(6):
        e0.in_flight += 1
        backoffs.append(p.failed(e0, "timeout"))
        clock.now += backoffs[-1]
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    clock.now -= 1.0  # still out
    stop = threading.Event()
    stop.set()
    assert p.acquire(None, stop) is None


def test_a_pool_needs_an_endpoint():
    with pytest.raises(ValueError, match="at least one endpoint"):
        EndpointPool([])


def test_slots_reserved_for_p0_are_never_taken_by_p2_load():
    p = EndpointPool([Endpoint("http://shared", 4, reserved=1)])
    stop = threading.Event()
    p2 = [p.acquire(None, stop, priority=2) for _ in range(3)]
    assert all(e is not None for e in p2)
    assert p.choose(None, 0.0, priority=2) is None  # P2 stops at concurrency - reserved
    assert p.acquire(None, stop, lambda: True, priority=2) is None  # (gives up: no slot for P2)
    assert p.acquire(None, stop, priority=0) is p.endpoints[0]  # P0 finds its slot at once
    assert p.endpoints[0].in_flight == 4


def test_a_waiting_p0_request_takes_the_next_free_slot_before_waiting_p2_requests():
    p = EndpointPool([Endpoint("http://shared", 2)])
    stop = threading.Event()
    held = [p.acquire(None, stop, priority=2) for _ in range(2)]
    order: list[str] = []

    def take(name: str, priority: int) -> None:
        if p.acquire(None, stop, priority=priority) is not None:
            order.append(name)

    waiters = [threading.Thread(target=take, args=(f"p2-{i}", 2)) for i in range(4)]
    for t in waiters:
        t.start()
    wait_until(lambda: p._waiting.get(2) == 4, 5, message="four P2 requests waiting")
    p0 = threading.Thread(target=take, args=("p0", 0))
    p0.start()
    wait_until(lambda: p._waiting.get(0) == 1, 5, message="the P0 request waiting")
    p.release(held[0])  # one slot frees: four P2 requests waited longer, the P0 request takes it
    p0.join(5)
    assert order == ["p0"]
    p.release(held[1])
    wait_until(lambda: len(order) == 2, 5, message="a P2 request served once P0 is not waiting")
    stop.set()  # the remaining P2 waiters give up
    for t in waiters:
        t.join(5)
    assert order[1].startswith("p2-") and len(order) == 2


def test_signals_give_the_director_slot_occupancy_requests_in_flight_and_the_recent_p99():
    clock = Clock()
    p = pool(2, concurrency=4, clock=clock)
    stop = threading.Event()
    busy = [p.acquire(b"k", stop) for _ in range(4)]  # key-sticky: all on one endpoint
    first = busy[0]
    assert all(e is first for e in busy)
    p.release(first, 0.5)  # an answer after 500 ms: recorded for the p99
    for i in range(99):
        first.recent.append((clock.now, (10 + i) / 1000.0))  # answers of 10..108 ms
    clock.now += 5
    hot = {s.name: s for s in p.signals(window_s=10.0)}[first.url]
    assert hot.utilisation_pct == pytest.approx(75.0) and hot.queue == 3.0
    assert hot.p99_ms == pytest.approx(500.0)
    clock.now += 20  # outside the window: no p99 until new answers come
    assert {s.name: s.p99_ms for s in p.signals(window_s=10.0)}[first.url] is None
    # the director scales the configured weight
    p.set_weight(first.url, first.base_weight * 0.7)
    assert first.weight == pytest.approx(0.7) and first.base_weight == 1.0
