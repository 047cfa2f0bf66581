"""Dead-letter redrive on the exactly-once layer (issue 17): 100 requests a broken model version dead-lettered
as output_violation, redriven after a fixed version is running, are each answered exactly once; a second run
sends nothing (the per-(model, reason) group's committed offsets are the mark)."""

from __future__ import annotations

import threading
from collections import Counter

import orjson
import yaml

from sie.cli import main
from sie.connectors.redrive import H_REDRIVE_OF, Redrive, RedriveConfig
from sie.schemas.spec import load
from tests.support.helpers import consume_all
from tests.support.scorer_fixtures import CommittedReader, ScorerThread, echo_spec_doc, produce_requests, topics_for


def churn_doc(name: str | None, version: str, fn: str) -> dict:
    doc = echo_spec_doc(name)
    doc["spec"]["model"]["version"] = version
    doc["spec"]["backend"]["callable"] = f"tests.support.scorer_fixtures:{fn}"
    doc["spec"]["outputSchema"]["fields"] = [{"name": "p", "type": "float", "range": [0, 1]}]
    doc["spec"]["exampleInput"] = {"x": 0.7}
    return doc


def churn_spec(name: str | None, version: str, fn: str):
    return load(churn_doc(name, version, fn))


def requests_with_and_without_ids(n: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        body = {"inputs": {"x": -0.25 if i % 2 else 1.8}, "metadata": {"i": i}}
        if i % 10:  # every 10th request has no id: its result must still answer the original record
            body["id"] = f"r{i}"
        out.append((f"k{i}".encode(), orjson.dumps(body)))
    return out


def read_all(settings, topic: str, expected: int):
    reader = CommittedReader(settings, topic)
    try:
        from tests.support.helpers import wait_until

        wait_until(lambda: reader.count() >= expected, 60, message=lambda: f"{expected} records on {topic} "
                                                                            f"(have {len(reader.records)})")
        reader.read_to_end()
        return list(reader.records)
    finally:
        reader.close()


def test_redrive_after_a_fix_answers_each_dead_letter_exactly_once(kafka_settings, capsys, tmp_path):
    v1 = churn_spec(None, "1.0.0", "unsquashed")
    v2 = churn_spec(v1.name, "2.0.0", "squashed")
    v2_file = tmp_path / "v2.yaml"
    v2_file.write_text(yaml.safe_dump(churn_doc(v1.name, "2.0.0", "squashed")), encoding="utf-8")
    topics_for(kafka_settings, v1, partitions=3)
    produce_requests(kafka_settings, v1.topics.requests, requests_with_and_without_ids(100))

    scorer = ScorerThread(kafka_settings, v1)
    try:
        dead = read_all(kafka_settings, v1.topics.dead_letters, 100)
    finally:
        scorer.close()
    assert Counter(dict(m.headers())["sie.reason"] for m in dead) == {b"output_violation": 100}
    assert consume_all(kafka_settings, v1.topics.results, expected=None) == []  # never an ok out of range
    originals = {(m.partition, m.offset): m for m in consume_all(kafka_settings, v1.topics.requests, expected=100)}
    expected_ids = {orjson.loads(m.value).get("id") or f"{v1.topics.requests}:{p}:{o}"
                    for (p, o), m in originals.items()}

    scorer = ScorerThread(kafka_settings, v2, instance="t1")  # the fix is running
    try:
        report = Redrive(RedriveConfig.for_spec(kafka_settings, v2)).run(threading.Event())
        assert report.complete and report.redriven == {"output_violation": 100} and not report.not_redriven
        results = read_all(kafka_settings, v2.topics.results, 100)
        again = Redrive(RedriveConfig.for_spec(kafka_settings, v2)).run(threading.Event())
        assert sum(again.redriven.values()) == 0  # the mark: nothing is sent twice
        # and through the CLI, for its exit code and counts
        assert main(["--bootstrap-servers", kafka_settings.bootstrap_servers, "dlq", "redrive", "--spec",
                     str(v2_file), "--reason", "output_violation"]) == 0
        assert "0 dead letter(s) sent back" in capsys.readouterr().out
        results = read_all(kafka_settings, v2.topics.results, 100)  # to the end again: no late duplicate
    finally:
        scorer.close()
    docs = [orjson.loads(m.value()) for m in results]
    ids = Counter(d["id"] for d in docs)
    assert set(ids) == expected_ids and max(ids.values()) == 1  # each answered exactly once, original ids
    assert {(d["status"], d["version"]) for d in docs} == {("ok", "2.0.0")}
    assert all(0.0 <= d["outputs"]["p"] <= 1.0 for d in docs)
    redriven = [m for m in consume_all(kafka_settings, v2.topics.requests, expected=200) if H_REDRIVE_OF in m.headers]
    assert len(redriven) == 100
    marks = {m.headers[H_REDRIVE_OF].decode() for m in redriven}
    assert marks == {f"{m.topic()}:{m.partition()}:{m.offset()}" for m in dead}  # each dead letter once
    assert all(not k.startswith("sie.") or k.startswith("sie.redrive.") for m in redriven for k in m.headers)
    assert len(read_all(kafka_settings, v2.topics.dead_letters, 100)) == 100  # none failed again


def test_a_reason_cursor_passes_over_other_reasons_without_taking_them(kafka_settings):
    spec = churn_spec(None, "1.0.0", "unsquashed")
    topics_for(kafka_settings, spec, partitions=1)
    produce_requests(kafka_settings, spec.topics.requests,
                     [(b"a", orjson.dumps({"id": "bad-json"})), (b"b", b"{nope"), (b"c", orjson.dumps(
                         {"id": "v", "inputs": {"x": 2.0}}))])
    scorer = ScorerThread(kafka_settings, spec)
    try:
        read_all(kafka_settings, spec.topics.dead_letters, 3)
    finally:
        scorer.close()
    only = Redrive(RedriveConfig.for_spec(kafka_settings, spec, reasons=("output_violation",))).run(threading.Event())
    assert only.redriven == {"output_violation": 1}
    rest = Redrive(RedriveConfig.for_spec(kafka_settings, spec)).run(threading.Event())
    assert rest.redriven == {"schema_violation": 1, "invalid_json": 1}  # not the output_violation one again
