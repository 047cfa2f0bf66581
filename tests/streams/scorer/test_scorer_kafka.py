"""The scorer against a real broker: what read_committed readers see.

Every test ends with the same proof: a read_committed consumer of the result
and dead-letter topics finds every request id exactly once (zero missing,
zero duplicates), whatever happened on the way (poison, SIGKILL, rebalances,
a broker restart).
"""

from __future__ import annotations

import random

import orjson
import pytest

from tests.support.helpers import consume_all, wait_until
from tests.support.scorer_fixtures import (
    POISON_X,
    CommittedReader,
    ScorerProcess,
    ScorerThread,
    echo_spec,
    group_members,
    produce_requests,
    prove_exactly_once,
    requests,
    topics_for,
    write_echo_spec,
)

pytestmark = pytest.mark.kafka

#: the commit modes of the exactly-once layer: the proofs hold for both (sie score --pipelined / --serial)
MODES = pytest.mark.parametrize("mode", ["--pipelined", "--serial"])


@MODES
def test_happy_path_one_result_per_request_same_key_and_partition(kafka_settings, mode):
    spec = echo_spec()
    topics_for(kafka_settings, spec)
    reqs = requests(3000)
    produce_requests(kafka_settings, spec.topics.requests, reqs)
    scorer = ScorerThread(kafka_settings, spec, pipelined=mode == "--pipelined")
    try:
        results, dead = prove_exactly_once(kafka_settings, spec, {f"r{i}" for i in range(3000)})
    finally:
        summary = scorer.close()
    assert dead == []
    for m in results:
        doc = orjson.loads(m.value())
        i = int(doc["id"][1:])
        assert doc["status"] == "ok" and doc["outputs"] == {"y": 2.0 * i} and doc["metadata"] == {"n": i}
        assert m.key() == f"k{i % 997}".encode()
        assert doc["source"]["partition"] == m.partition()  # results land on the request's partition number
        assert doc["version"] == "1.0.0" and doc["timings"]["batch_size"] >= 1
    assert summary.results == 3000 and summary.dead_letters == 0


POISON = [
    (b"{not json", "invalid_json", "value: not valid JSON"),
    (b'{"id": "p-types", "inputs": {"x": "abc"}}', "schema_violation", "inputs.x"),
    (b'{"id": "p-missing"}', "schema_violation", "inputs: required"),
    (b'{"id": "p-big", "inputs": {"x": 1}, "pad": "' + b"a" * 3000 + b'"}', "too_large", "max_request_bytes"),
    (b'{"id": "p-nan", "inputs": {"x": NaN}}', "invalid_json", "not valid JSON"),
    (b'{"id": "p-inf", "inputs": {"x": Infinity}}', "invalid_json", "not valid JSON"),
    (b'{"id": "p-deep", "inputs": {"x": 1}, "metadata": ' + b"[" * 100 + b"]" * 100 + b"}",
     "schema_violation", "max_json_depth"),
    (b"\x00\xff\xfe binary", "invalid_json", "not valid JSON"),
    (b"", "invalid_json", "value: empty"),
    (None, "invalid_json", "value: empty"),
    (b'[1, 2, 3]', "schema_violation", "must be a JSON object"),
    (orjson.dumps({"id": "p-model", "inputs": {"x": POISON_X}}), "inference_error", "cannot score"),
]


def test_poison_lands_in_the_dlq_with_reason_and_valid_requests_are_scored(kafka_settings):
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=2)
    valid = requests(400)
    mixed: list[tuple[bytes | None, bytes | None]] = []
    for i, kv in enumerate(valid):
        mixed.append(kv)
        if i % 33 == 0 and i // 33 < len(POISON):
            mixed.append((f"poison-{i // 33}".encode(), POISON[i // 33][0]))
    produce_requests(kafka_settings, spec.topics.requests, mixed)
    scorer = ScorerThread(kafka_settings, spec, max_request_bytes=2048)
    try:
        dlq_all = consume_all(kafka_settings, spec.topics.dead_letters, expected=len(POISON), timeout=60)
        results = consume_all(kafka_settings, spec.topics.results, expected=400, timeout=60)
    finally:
        summary = scorer.close()
    assert sorted(orjson.loads(r.value)["id"] for r in results) == sorted(f"r{i}" for i in range(400))
    assert len(dlq_all) == len(POISON)
    by_key = {r.key: r for r in dlq_all}
    for n, (value, reason, detail) in enumerate(POISON):
        letter = by_key[f"poison-{n}".encode()]
        assert letter.value == value or (value in (b"", None) and not letter.value), n  # bytes unchanged
        assert letter.headers["sie.reason"] == reason.encode(), (n, letter.headers)
        assert detail in letter.headers["sie.detail"].decode(), (n, letter.headers["sie.detail"])
        assert letter.headers["sie.model"] == spec.name.encode()
        assert letter.headers["sie.version"] == b"1.0.0"
        assert letter.headers["sie.source.topic"] == spec.topics.requests.encode()
        assert int(letter.headers["sie.source.offset"]) >= 0
    assert summary.dead_letters == len(POISON) and summary.results == 400


def _mixed_workload(n: int, poison_every: int = 500) -> tuple[list[tuple[bytes, bytes]], set[str]]:
    values, ids = [], set()
    for i in range(n):
        if i % poison_every == 0:
            values.append((f"k{i}".encode(), orjson.dumps({"id": f"p{i}", "inputs": {"x": "bad"}})))
            ids.add(f"p{i}")
        else:
            values.append((f"k{i % 1009}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"x": float(i)}})))
            ids.add(f"r{i}")
    return values, ids


@pytest.mark.timeout(240)
@MODES
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(kafka_settings, tmp_path, mode):
    spec_path = write_echo_spec(tmp_path)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    total = 50_000
    values, ids = _mixed_workload(total)
    produce_requests(kafka_settings, spec.topics.requests, values)
    reader = CommittedReader(kafka_settings, spec.topics.results)
    rng = random.Random(7)
    kills = 0
    results_expected = sum(1 for i in ids if i.startswith("r"))  # poison ids go to the DLQ instead
    proc = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "crash", tmp_path, mode)
    try:
        for _ in range(5):
            # A fast scorer may finish before the 5th kill: then the last kills hit an idle scorer (a target
            # past the last result could never be reached); the exactly-once proof below is unchanged.
            target = min(reader.count() + rng.randint(2_000, 6_000), results_expected)
            wait_until(lambda: reader.count() >= target, 60, interval=0.02,
                       message=lambda: f"results past {target} (have {len(reader.records)})")
            proc.kill()
            kills += 1
            proc = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "crash", tmp_path, mode)
        prove_exactly_once(kafka_settings, spec, ids, timeout=90)
    finally:
        reader.close()
        code = proc.terminate() if proc.proc.poll() is None else proc.proc.returncode
    assert kills == 5
    assert code == 0, proc.output()[-2000:]


@pytest.mark.timeout(240)
@MODES
def test_adding_and_removing_a_scorer_mid_stream_keeps_exactly_once(kafka_settings, tmp_path, mode):
    spec_path = write_echo_spec(tmp_path)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    values, ids = _mixed_workload(30_000)
    reader = CommittedReader(kafka_settings, spec.topics.results)
    a = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "a", tmp_path, mode)
    b = None
    try:
        wait_until(a.ready, 60, message="scorer a ready")
        produce_requests(kafka_settings, spec.topics.requests, values[:10_000])
        wait_until(lambda: reader.count() >= 3_000, 60, message="first results")
        b = ScorerProcess(spec_path, kafka_settings.bootstrap_servers, "b", tmp_path, mode)
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 2, 60, interval=0.2,
                   message="scorer b joined the group")
        produce_requests(kafka_settings, spec.topics.requests, values[10_000:20_000])
        wait_until(lambda: reader.count() >= 12_000, 60, message="results with two scorers")
        assert b.terminate() == 0, b.output()[-2000:]  # scale down: b commits, leaves the group
        assert "stopped after" in b.output()
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 1, 30, interval=0.2,
                   message="scorer b left the group")
        produce_requests(kafka_settings, spec.topics.requests, values[20_000:])
        prove_exactly_once(kafka_settings, spec, ids, timeout=90)
    finally:
        reader.close()
        for p in (a, b):
            if p is not None:
                p.ensure_dead()
    assert "ready:" in b.output()


@pytest.mark.timeout(480)  # deadlines sized for CI: the whole suite on 2 loaded cores (a pass takes ~50 s)
def test_broker_restart_mid_stream_recovers_by_itself(private_kafka, tmp_path):
    settings = private_kafka.settings_for_clients()
    spec = echo_spec()
    topics_for(settings, spec)
    values, ids = _mixed_workload(20_000)
    produce_requests(settings, spec.topics.requests, values[:10_000])
    scorer = ScorerThread(settings, spec, txn_hang_limit_s=15.0)
    reader = CommittedReader(settings, spec.topics.results)
    try:
        wait_until(lambda: reader.count() >= 2_000, 90, message="results before the restart")
        reader.close()
        node = private_kafka.layout.nodes[0].node_id
        private_kafka.kill_broker(node)
        private_kafka.start_broker(node, timeout=120)
        produce_requests(settings, spec.topics.requests, values[10_000:])
        try:
            prove_exactly_once(settings, spec, ids, timeout=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nscorer thread is in:\n{scorer.stack()}") from exc
    finally:
        summary = scorer.close()
    assert summary.records_in >= 20_000 - 2_000
