"""The LLM stage's window commits through the shared exactly-once layer (``StreamLoop``'s windowed mode), so the
one rule for unknown transaction outcomes (issue 35, docs/reliability.md) holds for it too: a commit whose
outcome is unknown is never aborted, the producer is re-created, the window is dropped and every partition it
held is read again from the committed offsets; every request is still answered once."""

from __future__ import annotations

from confluent_kafka import KafkaError

from sie.streams.scorer.config import ScorerConfig
from tests.fakes.kafka_clients import kafka_error
from tests.support.helpers import wait_until
from tests.support.llm_fixtures import Harness, ids, question, sglang_answer

ATTEMPTS = ScorerConfig.retriable_attempts  # a dataclass default: the retries of one call


def test_a_window_commit_with_an_unknown_outcome_recreates_the_producer_and_answers_every_request_once():
    timeouts = [kafka_error(KafkaError._TIMED_OUT, "Local: Timed out", retriable=True) for _ in range(ATTEMPTS)]
    h = Harness([question(i) for i in range(30)], sglang_answer, partitions=3,
                faults={"commit_transaction": timeouts})
    try:
        wait_until(lambda: h.all_committed(3), 20, message="all committed")
        summary = h.close()
        assert ids(h.visible(h.spec.topics.results)) == {f"q{i}": 1 for i in range(30)}
        assert len(h.producers) == 2 and summary.producer_restarts == 1  # the one rule's new producer
        assert summary.aborts == 0 and not any(p.called("abort_transaction") for p in h.producers)
        assert h.consumer.called("committed") and h.consumer.called("seek")  # positions read back from Kafka
    finally:
        h.stop.set()
