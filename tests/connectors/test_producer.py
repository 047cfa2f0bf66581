"""`sie.connectors.producer` / `sie produce`: validated, idempotent JSON requests with an honest summary."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sie.cli import main
from sie.connectors.producer import MissingKey, RateLimiter, as_request, key_of, produce_jsonl
from sie.schemas.spec import load
from sie.schemas.validation import compile_validator
from tests.support.helpers import REPO_ROOT, consume_all, create_topic, unique_topic

FRAUD_SPEC = REPO_ROOT / "examples" / "fraud-scorer.yaml"


def _valid_inputs(i: int) -> dict:
    spec = load(FRAUD_SPEC)
    return {**spec.example_input, "amount": float(i)}


def test_as_request_wraps_bare_inputs_and_keeps_full_requests() -> None:
    assert as_request({"amount": 1}, 1) == {"inputs": {"amount": 1}}
    full = {"id": "a", "inputs": {"amount": 1}, "metadata": {"k": 1}}
    assert as_request(full, 1) is full
    with pytest.raises(ValueError, match="line 3: a request must be a JSON object"):
        as_request([1, 2], 3)
    with pytest.raises(ValueError, match="inputs must be a JSON object"):
        as_request({"inputs": 5}, 4)


def test_key_of_reads_inputs_then_request() -> None:
    assert key_of({"inputs": {"card": 7}}, "card") == "7"
    assert key_of({"id": "x", "inputs": {}}, "id") == "x"
    assert key_of({"inputs": {}}, None) is None


def test_key_of_follows_dotted_paths_and_refuses_missing_or_structured_keys() -> None:
    request = {"id": "r1", "inputs": {"card": True, "geo": {"zip": 1234}}, "metadata": {"customer_id": "c9"}}
    assert key_of(request, "metadata.customer_id") == "c9"
    assert key_of(request, "geo.zip") == "1234"  # inputs first
    assert key_of(request, "card") == "true"
    with pytest.raises(MissingKey, match=r"use --key-field metadata.customer_id") as missing:
        key_of(request, "customer_id")
    assert missing.value.absent
    with pytest.raises(MissingKey, match="JSON object") as structured:
        key_of(request, "geo")
    assert not structured.value.absent


def test_rate_limiter_spaces_acquisitions() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(10.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        limiter.acquire()
    assert now[0] == pytest.approx(0.4)  # 5 tokens at 10/s: the first is free
    assert len(slept) == 4


def test_produce_jsonl_sends_valid_and_reports_every_rejection(kafka_settings) -> None:
    topic = unique_topic("produce")
    create_topic(kafka_settings, topic, partitions=3)
    spec = load(FRAUD_SPEC)
    lines = [orjson.dumps({"id": f"r{i}", "inputs": _valid_inputs(i)}) for i in range(20)]
    lines.insert(5, b"{not json")
    lines.insert(9, orjson.dumps({"id": "bad", "inputs": {**_valid_inputs(1), "amount": "lots"}}))
    lines.insert(12, b"[1, 2]")
    summary = produce_jsonl(kafka_settings, topic, lines, validator=compile_validator(spec.input_schema),
                            key_field="id")
    assert (summary.sent, summary.delivered) == (20, 20)
    assert summary.rejected == {"invalid_json": 1, "schema_violation": 1, "not_a_request": 1}
    assert any("inputs.amount" in example for example in summary.rejected_examples)
    records = consume_all(kafka_settings, topic, expected=20)
    assert sorted(r.key for r in records) == sorted(f"r{i}".encode() for i in range(20))
    assert {r.json()["id"] for r in records} == {f"r{i}" for i in range(20)}


def test_sie_produce_cli_from_a_spec_file(kafka_settings, tmp_path: Path, monkeypatch, capsys) -> None:
    prefix = unique_topic("p").replace(".", "")
    monkeypatch.setenv("SIE_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    topic = f"{prefix}.model.fraud-scorer.requests"
    create_topic(kafka_settings, topic, partitions=1)
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n".join(orjson.dumps(_valid_inputs(i)) for i in range(7)) + b"\n{\"amount\": -5}\n")
    code = main(["produce", "--spec", str(FRAUD_SPEC), "--file", str(requests)])
    out = capsys.readouterr().out
    assert code == 4, out  # a rejected line: exit 4 (sie/cli.py), the counts say which
    assert f"fraud-scorer -> {topic}" in out
    assert "sent 7, delivered 7" in out and "rejected (schema_violation): 1" in out
    assert len(consume_all(kafka_settings, topic, expected=7)) == 7


def test_sie_produce_unknown_model_names_the_fix(kafka_settings, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SIE_TOPIC_PREFIX", unique_topic("p").replace(".", ""))
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    assert main(["produce", "--model", "no-such-model"]) == 1
    assert "sie apply -f SPEC" in capsys.readouterr().err
