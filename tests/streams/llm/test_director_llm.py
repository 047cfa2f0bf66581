"""The traffic director on the LLM window: two endpoints, one slowed (it runs 2 requests at a time, 20 ms
each: 100/s), a paced load of 240 requests/s split by key.  Within 8 s of the start the director shifts the
slow endpoint's share away (it is hot: slots > 85 % busy, > 50 requests waiting), the slow endpoint's
queue drains and the p99 recovers, and every request has exactly one committed answer.

Fake Kafka clients (the exactly-once fakes every window unit test uses) and in-process fake endpoints:
the director, the pool and the window are the real ones; a run takes about 15 s.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.fakes.kafka_clients import NOW_MS, FakeMessage
from tests.helpers import wait_until
from tests.llm_fixtures import Harness, ids, question, sglang_answer

RATE, SECONDS, PARTITIONS = 240, 14.0, 4
DIRECTOR = {"sustain_s": 1, "hold_s": 2, "restore_after_s": 600}


def p99(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0.0


def test_a_slowed_endpoint_loses_share_its_p99_recovers_and_nothing_is_lost_or_doubled():
    slow_slots = threading.Semaphore(2)  # the slowed server: 2 at a time, 20 ms each
    served: list[tuple[float, str, float]] = []  # (answered at, endpoint, seconds from send to answer)
    lock = threading.Lock()

    def handler(request):
        started = time.monotonic()
        if request.url.host == "slow":
            with slow_slots:
                time.sleep(0.02)  # the slowed backend's service time (simulated work, not synchronisation)
        answer = sglang_answer(request)
        with lock:
            served.append((time.monotonic(), request.url.host, time.monotonic() - started))
        return answer

    h = Harness([], handler, partitions=PARTITIONS, max_pending=400, director=DIRECTOR, director_interval_ms=250,
                endpoints=[{"url": "http://fast", "concurrency": 64}, {"url": "http://slow", "concurrency": 64}])
    topic = h.spec.topics.requests
    start = time.monotonic()
    sent = 0
    try:
        while (elapsed := time.monotonic() - start) < SECONDS:  # paced producer: RATE requests per second
            while sent < int(elapsed * RATE):
                p = sent % PARTITIONS
                h.consumer.append(FakeMessage(topic, p, sent // PARTITIONS, f"k{sent}".encode(), question(sent), NOW_MS))
                sent += 1
            h.stop.wait(0.005)  # pacing
        wait_until(lambda: sum(h.committed(p) for p in range(PARTITIONS)) == sent, 30, message="all committed")
    finally:
        h.stop.set()
        summary = h.close()
    decisions = list(h.scorer.director_decisions)
    shifts = [d for d in decisions if d.action == "shift_away"]
    assert shifts and all(d.name == "http://slow" for d in shifts), decisions
    assert shifts[0].at - start < 8.0, f"first shift {shifts[0].at - start:.1f} s after the start"
    assert "utilisation" in shifts[0].reason and "queue" in shifts[0].reason, shifts[0].reason

    def window(t0, t1):
        rows = [(host, lat) for at, host, lat in served if start + t0 <= at < start + t1]
        share = sum(1 for host, _ in rows if host == "slow") / max(1, len(rows))
        return share, p99([lat for _, lat in rows])

    before_share, before_p99 = window(0.0, shifts[0].at - start)
    after_share, after_p99 = window(SECONDS - 3.0, SECONDS)
    print(f"slow endpoint share {before_share:.0%} -> {after_share:.0%}; p99 {before_p99 * 1000:.0f} ms -> "
          f"{after_p99 * 1000:.0f} ms; decisions: {[(round(d.at - start, 1), d.weight_after) for d in decisions]}")
    # before: the slow endpoint takes all it can (its 64 slots stay full: ~100 of the 240/s); after: less
    assert before_share >= 0.38 and after_share <= before_share - 0.08, (before_share, after_share)
    assert after_p99 < 0.5 * before_p99 and after_p99 < 0.2, (before_p99, after_p99)
    # exactly once: every request one committed answer, none twice, none lost
    results = h.spec.topics.results
    assert ids(h.visible(results)) == Counter({f"q{i}": 1 for i in range(sent)})
    assert summary.dead_letters == 0
