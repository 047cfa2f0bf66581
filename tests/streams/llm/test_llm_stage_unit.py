"""The LLM scorer's loop against fake Kafka clients and fake endpoints (no broker, no server):
the commit rule (nothing beyond a partition's unfinished head is produced), the window staying full,
aborts redone without duplicates, poison and refused requests dead-lettered, token counts."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import orjson
import pytest
from confluent_kafka import KafkaError

from tests.fakes.kafka_clients import FakeConsumer, kafka_error
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, question, sglang_answer


def test_a_slow_head_holds_back_its_partition_only_and_nothing_beyond_it_is_produced():
    head = threading.Event()

    def handler(request):
        if b"question 0 please" in request.read():  # partition 0, offset 0: a long generation
            head.wait(10)
        return sglang_answer(request)

    h = Harness([question(i) for i in range(12)], handler, partitions=2)
    try:
        results = h.spec.topics.results
        wait_until(lambda: h.committed(1) == 6, 10, message="partition 1 committed")
        # partition 0: offsets 1..5 are finished but its head (offset 0) is not: nothing of it is visible
        wait_until(lambda: h.scorer.window.finished >= 5, 10, message="p0's tail finished")
        assert h.committed(0) == 0
        assert set(ids(h.visible(results))) == {f"q{i}" for i in range(1, 12, 2)}
        head.set()
        wait_until(lambda: h.all_committed(2), 10, message="all committed")
        summary = h.close()
        assert ids(h.visible(results)) == Counter({f"q{i}": 1 for i in range(12)})
        assert summary.results == 12 and summary.dead_letters == 0
        doc = orjson.loads(next(v for _t, v, _k, _h in h.visible(results) if b'"q0"' in v))
        assert doc["outputs"] == {"answer": 'answer to {"question": "question 0 please"}', "completion_tokens": 4}
        assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 4} and doc["status"] == "ok"
        m = h.scorer.metrics
        assert m.value("sie_tokens_total", {"model_id": h.spec.name, "kind": "completion"}) == 48
        assert m.value("sie_tokens_total", {"model_id": h.spec.name, "kind": "prompt"}) == 36
        assert m.value("sie_records_out_total", {"model_id": h.spec.name, "status": "ok"}) == 12
    finally:
        head.set()
        h.stop.set()


def test_the_window_stays_full_while_the_head_is_slow_and_pauses_consumption_at_its_limit():
    gate = threading.Event()
    running = []

    def handler(request):
        running.append(1)
        gate.wait(10)
        return sglang_answer(request)

    h = Harness([question(i) for i in range(40)], handler, concurrency=4, max_pending=10)
    try:
        wait_until(lambda: h.scorer.window.size == 10, 10, message="window at max_pending")
        wait_until(lambda: len(running) == 4, 10, message="4 generations in flight")
        assert h.consumer.called("pause")  # full: consumption paused, polling goes on
        gate.set()
        wait_until(lambda: h.all_committed(), 15, message="all committed")
        assert h.consumer.called("resume")
        h.close()
        assert ids(h.visible(h.spec.topics.results)) == Counter({f"q{i}": 1 for i in range(40)})
    finally:
        gate.set()
        h.stop.set()


def test_poison_refused_and_unanswerable_requests_are_dead_letters_in_order():
    def handler(request):
        if b"REFUSE" in request.read():
            return httpx.Response(400, json={"error": "prompt too long"})
        return sglang_answer(request)

    values = [question(0), b"not json", question(2, "REFUSE me"), orjson.dumps({"inputs": {"question": 5}}),
              question(4)]
    h = Harness(values, handler)
    try:
        wait_until(lambda: h.all_committed(), 10, message="all committed")
        summary = h.close()
        dead = h.visible(h.spec.topics.dead_letters)
        reasons = sorted(dict(hd)["sie.reason"].decode() for _t, _v, _k, hd in dead)
        assert reasons == ["inference_error", "invalid_json", "schema_violation"]
        refused = next(dict(hd) for _t, _v, _k, hd in dead if dict(hd)["sie.reason"] == b"inference_error")
        assert b"HTTP 400" in refused["sie.detail"]
        assert ids(h.visible(h.spec.topics.results)) == Counter({"q0": 1, "q4": 1})
        assert summary.results == 2 and summary.dead_letters == 3
    finally:
        h.stop.set()


def test_an_aborted_transaction_drops_the_window_and_every_request_is_still_answered_once():
    faults = {"commit_transaction": [kafka_error(KafkaError._STATE, "injected abort", txn_requires_abort=True)]}
    h = Harness([question(i) for i in range(30)], sglang_answer, partitions=3, faults=faults)
    try:
        wait_until(lambda: h.all_committed(3), 15, message="all committed")
        summary = h.close()
        assert ids(h.visible(h.spec.topics.results)) == Counter({f"q{i}": 1 for i in range(30)})
        assert summary.aborts == 1 and h.consumer.called("seek")  # rewound to the committed offsets
    finally:
        h.stop.set()


def test_a_revoked_partition_commits_its_finished_prefix_and_drops_the_rest():
    gate = threading.Event()

    def handler(request):
        if b"question 4 please" in request.read():
            gate.wait(10)
        return sglang_answer(request)

    h = Harness([question(i) for i in range(8)], handler)
    try:
        topic = h.spec.topics.requests
        wait_until(lambda: h.scorer.window.finished + h.committed() >= 7, 10, message="7 of 8 finished")
        from confluent_kafka import TopicPartition

        h.consumer.revoke([TopicPartition(topic, 0)])
        wait_until(lambda: h.scorer.window.size == 0, 10, message="window dropped on revoke")
        assert h.committed() == 4  # 0..3 committed (the prefix), 4 unfinished, 5..7 dropped for the next owner
        gate.set()
        h.close()
        assert ids(h.visible(h.spec.topics.results)) == Counter({f"q{i}": 1 for i in range(4)})
    finally:
        gate.set()
        h.stop.set()


class StickyPauseConsumer(FakeConsumer):
    """A client that keeps a partition's pause flag across revoke and re-assignment (whether librdkafka
    does depends on its version and the assignment strategy: the scorer must not care)."""

    def _drop(self, keys):
        kept = self._paused & set(keys)
        super()._drop(keys)
        self._paused |= kept


def test_a_partition_revoked_while_paused_and_assigned_again_is_resumed():
    from confluent_kafka import TopicPartition

    gate = threading.Event()

    def handler(request):
        gate.wait(10)
        return sglang_answer(request)

    h = Harness([question(i) for i in range(30)], handler, concurrency=2, max_pending=4,
                consumer_class=StickyPauseConsumer)
    try:
        tp = TopicPartition(h.spec.topics.requests, 0)
        wait_until(lambda: h.consumer.called("pause"), 10, message="window full: paused")
        h.consumer.revoke([tp])
        wait_until(lambda: h.scorer.window.size == 0, 10, message="revoked")
        h.consumer.reassign([tp])  # back to us, still paused inside the client
        gate.set()
        wait_until(lambda: h.all_committed(), 15, message=lambda: f"all committed (have {h.committed()})")
        h.close()
        assert ids(h.visible(h.spec.topics.results)) == Counter({f"q{i}": 1 for i in range(30)})
    finally:
        gate.set()
        h.stop.set()


@pytest.mark.parametrize("hand_over", [False, True])
def test_a_stop_request_leaves_the_group_after_the_last_commit_unless_handing_over_as_the_only_member(hand_over):
    """SIGTERM: what is finished commits, then the consumer leaves (its partitions move at once, static member
    or not); a hand-over by the member owning every partition keeps the membership for its successor."""
    from sie.streams.eos import StopRequest

    stop = StopRequest()
    h = Harness([question(i) for i in range(6)], sglang_answer, stop=stop)
    wait_until(lambda: h.all_committed(), 10, message="all committed")
    if hand_over:
        stop.hand_over()
    h.close()
    if hand_over:
        assert not h.consumer.called("unsubscribe") and h.consumer.member_id is not None
    else:
        assert h.consumer.left == 1 and h.consumer.member_id is None
        assert h.consumer.called("unsubscribe")[0].seq < h.consumer.called("close")[0].seq
    assert h.consumer.closed and h.all_committed()
