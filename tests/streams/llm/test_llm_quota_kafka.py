"""Quotas on the real broker, through the real CLI (``sie score``), against a fake LLM server process: two
callers, one far over its tokens/s quota.  ``delay``: nothing is dead-lettered, every request is answered
exactly once, the polite caller's requests are sent as they arrive while the greedy one's are spread at
its quota.  ``reject``: the greedy caller's excess is dead-lettered ``quota_exceeded``, the polite caller
is answered in full.  A greedy backlog larger than the window: with ``delay`` it moves to the deferred
topic (exactly once, also across a SIGKILL) and the polite caller keeps its rate."""

from __future__ import annotations

import orjson
import pytest

from tests.support.helpers import wait_until
from tests.support.llm_fixtures import FakeLLMProcess, write_llm_spec
from tests.support.scorer_fixtures import ScorerProcess, group_members, produce_requests, prove_exactly_once, topics_for

pytestmark = pytest.mark.kafka

N = 60  # requests per caller
TOKENS_PER_S = 70  # greedy's quota; every fake answer is 3 prompt + 4 completion tokens: 10 requests/s


def _value(i: int, caller: str) -> bytes:
    return orjson.dumps({"id": f"{caller}{i}", "inputs": {"question": f"q {i}"}, "metadata": {"caller": caller}})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["delay", "reject"])
def test_a_caller_over_its_tokens_quota_is_delayed_or_rejected_and_the_other_keeps_its_rate(
        kafka_settings, tmp_path, policy):
    srv = FakeLLMProcess("--slots", "32", "--mean-s", "0.05", "--p99-s", "0.2", log_dir=tmp_path)
    spec_path = write_llm_spec(tmp_path, [{"url": srv.url, "concurrency": 16}], request_timeout_s=10,
                               quotas={"policy": policy, "callers": {"greedy": {"tokens_per_s": TOKENS_PER_S}}})
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    scorer = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "a", tmp_path)
    try:
        # produce once the scorer owns the partitions: queue_ms then measures the quota's wait, not startup
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 60, interval=0.2,
                   message=lambda: f"the scorer in the group: {scorer.output()[-1500:]}")
        values = [(f"k{i}".encode(), _value(i, caller)) for i in range(N) for caller in ("greedy", "polite")]
        produce_requests(kafka_settings, spec.topics.requests, values)
        want = {orjson.loads(v)["id"] for _k, v in values}
        records, dead = prove_exactly_once(kafka_settings, spec, want, timeout=90)
        docs = [orjson.loads(r.value()) for r in records]
        queued = {c: sorted(d["timings"]["queue_ms"] for d in docs if d["id"].startswith(c))
                  for c in ("greedy", "polite")}
        assert len(queued["polite"]) == N  # the polite caller is answered in full either way
        # sent as they arrived: a polite request never waited for the greedy caller's quota
        assert queued["polite"][-1] < 2000, queued["polite"][-5:]
        if policy == "delay":
            assert not dead and len(queued["greedy"]) == N
            # 420 tokens at 70/s, the bucket's first second at once: the last one waited >= ~5 s
            assert queued["greedy"][-1] > 3500, queued["greedy"][-5:]
        else:
            reasons = {dict(m.headers() or [])["sie.reason"] for m in dead}
            assert reasons == {b"quota_exceeded"} and len(dead) >= N // 2, (reasons, len(dead))
            assert all(orjson.loads(m.value())["id"].startswith("greedy") for m in dead)
            assert len(queued["greedy"]) + len(dead) == N
        assert scorer.terminate() == 0, scorer.output()[-2000:]
    finally:
        scorer.ensure_dead()
        srv.kill()
        from sie.streams.llm.config import deferred_topic

        t = spec.topics
        _delete_topics(kafka_settings, [n for n in (t.requests, t.results, t.dead_letters,
                                                    deferred_topic(spec, kafka_settings.names)) if n])


GREEDY = 150  # a backlog far larger than the window (max_pending 32): 1050 tokens at 70/s, ~14 s to drain
POLITE = 40  # at 10/s after the backlog, in the same partitions


def _delete_topics(settings, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    for future in AdminClient(settings.kafka_client_config()).delete_topics(names).values():
        try:
            future.result(30)
        except Exception:  # noqa: BLE001 - best effort cleanup of this test's topics
            pass


@pytest.mark.timeout(240)
def test_with_delay_a_greedy_backlog_larger_than_the_window_is_deferred_and_the_polite_caller_keeps_its_rate(
        kafka_settings, tmp_path):
    """The greedy caller's held requests move to the deferred topic (exactly once, in the transaction that
    commits their offsets), so the consumer reaches the polite caller's requests behind them in Kafka."""
    import time

    from sie.schemas.spec import load
    from sie.streams.llm.config import deferred_topic
    from tests.support.scorer_fixtures import CommittedReader

    srv = FakeLLMProcess("--slots", "32", "--mean-s", "0.05", "--p99-s", "0.2", log_dir=tmp_path)
    spec_path = write_llm_spec(tmp_path, [{"url": srv.url, "concurrency": 8}], request_timeout_s=10, max_pending=32,
                               quotas={"policy": "delay", "callers": {"greedy": {"tokens_per_s": TOKENS_PER_S}}})
    spec = load(spec_path)
    deferred = deferred_topic(spec, kafka_settings.names)
    assert deferred is not None
    topics_for(kafka_settings, spec)
    scorer = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "a", tmp_path)
    try:
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 60, interval=0.2,
                   message=lambda: f"the scorer in the group: {scorer.output()[-1500:]}")
        greedy = [(f"g{i}".encode(), _value(i, "greedy")) for i in range(GREEDY)]
        produce_requests(kafka_settings, spec.topics.requests, greedy)
        polite = [(f"p{i}".encode(), _value(i, "polite")) for i in range(POLITE)]
        for i in range(0, POLITE, 2):  # a steady 10/s (pacing the producer, not waiting for anything)
            produce_requests(kafka_settings, spec.topics.requests, polite[i:i + 2])
            time.sleep(0.2)
        want = {orjson.loads(v)["id"] for _k, v in greedy + polite}
        records, dead = prove_exactly_once(kafka_settings, spec, want, timeout=120)
        assert not dead, [dict(m.headers() or []).get("sie.reason") for m in dead[:5]]
        docs = [orjson.loads(r.value()) for r in records]
        queued = {c: sorted(d["timings"]["queue_ms"] for d in docs if d["id"].startswith(c))
                  for c in ("greedy", "polite")}
        assert len(queued["polite"]) == POLITE and len(queued["greedy"]) == GREEDY
        # the greedy backlog drains at its quota (~14 s); the polite caller never waits for it
        assert queued["greedy"][-1] > 8000, queued["greedy"][-5:]
        assert queued["polite"][POLITE // 2] < queued["greedy"][-1] / 10, (queued["polite"], queued["greedy"][-5:])
        assert queued["polite"][-1] < queued["greedy"][-1] / 3, (queued["polite"][-5:], queued["greedy"][-5:])
        # answered as the original requests: their coordinates are the request topic's
        assert {d["source"]["topic"] for d in docs} == {spec.topics.requests}
        moved = CommittedReader(kafka_settings, deferred)
        try:
            moved.read_to_end()
            origins = {dict(m.headers() or [])["sie.deferred.caller"]
                       for m in moved.records}
            assert moved.records and origins == {b"greedy"}, (len(moved.records), origins)
        finally:
            moved.close()
        assert scorer.terminate() == 0, scorer.output()[-2000:]
    finally:
        scorer.ensure_dead()
        srv.kill()
        _delete_topics(kafka_settings, [spec.topics.requests, spec.topics.results, spec.topics.dead_letters, deferred])


@pytest.mark.timeout(300)
def test_a_scorer_killed_while_deferring_loses_and_duplicates_nothing(kafka_settings, tmp_path):
    """SIGKILL while the greedy caller's requests are being moved to the deferred topic and read back: the
    next scorer redoes only what was not committed; every request is answered once and each request was
    moved at most once (a move is committed with its source offset, or not at all)."""
    from sie.schemas.spec import load
    from sie.streams.llm.config import deferred_topic
    from tests.support.scorer_fixtures import CommittedReader

    srv = FakeLLMProcess("--slots", "32", "--mean-s", "0.05", "--p99-s", "0.2", log_dir=tmp_path)
    spec_path = write_llm_spec(tmp_path, [{"url": srv.url, "concurrency": 8}], request_timeout_s=10, max_pending=32,
                               quotas={"policy": "delay", "callers": {"greedy": {"tokens_per_s": TOKENS_PER_S * 4}}})
    spec = load(spec_path)
    deferred = deferred_topic(spec, kafka_settings.names)
    assert deferred is not None
    topics_for(kafka_settings, spec)
    first = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "a", tmp_path)
    second = None
    moved = CommittedReader(kafka_settings, deferred)
    try:
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 60, interval=0.2,
                   message=lambda: f"the scorer in the group: {first.output()[-1500:]}")
        values = [(f"g{i}".encode(), _value(i, "greedy")) for i in range(GREEDY)]
        values += [(f"p{i}".encode(), _value(i, "polite")) for i in range(POLITE)]
        produce_requests(kafka_settings, spec.topics.requests, values)
        wait_until(lambda: moved.count() >= 20, 60, interval=0.1, message="requests moved to the deferred topic")
        first.kill()
        second = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "b", tmp_path)
        want = {orjson.loads(v)["id"] for _k, v in values}
        records, dead = prove_exactly_once(kafka_settings, spec, want, timeout=180)
        assert not dead
        moved.read_to_end()
        origins = [tuple(dict(m.headers() or [])[f"sie.deferred.{f}"] for f in ("topic", "partition", "offset"))
                   for m in moved.records]
        assert len(origins) == len(set(origins)), "a request was moved twice"
        assert second.terminate() == 0, second.output()[-2000:]
    finally:
        moved.close()
        first.ensure_dead()
        if second is not None:
            second.ensure_dead()
        srv.kill()
        _delete_topics(kafka_settings, [spec.topics.requests, spec.topics.results, spec.topics.dead_letters, deferred])
