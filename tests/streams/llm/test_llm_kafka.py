"""The LLM window on the real broker, through the real CLI (``sie score``), against fake LLM servers in
their own processes (lognormal generation time, a slot limit): a SIGKILL of the scorer mid-window, a
rebalance between two live scorers, and an endpoint SIGKILLed mid-generation; the read_committed proof
shows every request answered exactly once and no request dead-lettered because an endpoint died."""

from __future__ import annotations

import orjson
import pytest

from tests.support.helpers import wait_until
from tests.support.llm_fixtures import FakeLLMProcess, write_llm_spec
from tests.support.scorer_fixtures import (
    CommittedReader,
    ScorerProcess,
    group_members,
    produce_requests,
    prove_exactly_once,
    topics_for,
)

pytestmark = pytest.mark.kafka


def _workload(n: int, poison_every: int = 250) -> tuple[list[tuple[bytes, bytes]], set[str]]:
    values, ids = [], set()
    for i in range(n):
        if i % poison_every == 0:  # schema_violation: the only dead letters this test may see
            values.append((f"k{i}".encode(), orjson.dumps({"id": f"p{i}", "inputs": {"question": 7}})))
            ids.add(f"p{i}")
        else:
            values.append((f"k{i % 101}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"question": f"q {i}"}})))
            ids.add(f"r{i}")
    return values, ids


@pytest.mark.timeout(240)
def test_sigkill_rebalance_and_a_dead_endpoint_answer_each_request_exactly_once(kafka_settings, tmp_path):
    a_srv = FakeLLMProcess("--slots", "16", "--mean-s", "0.2", "--p99-s", "1.0", "--seed", "1", log_dir=tmp_path)
    b_srv = FakeLLMProcess("--slots", "16", "--mean-s", "0.2", "--p99-s", "1.0", "--seed", "2", log_dir=tmp_path)
    spec_path = write_llm_spec(tmp_path, [{"url": a_srv.url, "concurrency": 16}, {"url": b_srv.url, "concurrency": 16}],
                               request_timeout_s=10, endpoint_backoff_s=0.2, endpoint_backoff_max_s=2)
    from sie.schemas.spec import load

    spec = load(spec_path)
    topics_for(kafka_settings, spec)
    values, ids = _workload(2000)
    produce_requests(kafka_settings, spec.topics.requests, values)
    reader = CommittedReader(kafka_settings, spec.topics.results)
    boot = kafka_settings.bootstrap_servers
    procs = [ScorerProcess(spec_path, boot, "a", tmp_path)]
    try:
        wait_until(lambda: reader.count() >= 300, 90, message=lambda: f"300 results (have {len(reader.records)})")
        procs[0].kill()  # SIGKILL with up to 64 records consumed and uncommitted, 32 generations in flight
        procs = [ScorerProcess(spec_path, boot, "a", tmp_path), ScorerProcess(spec_path, boot, "b", tmp_path)]
        wait_until(lambda: group_members(kafka_settings, spec.group_id) == 2, 60, interval=0.2,
                   message="two scorers in the group")
        wait_until(lambda: reader.count() >= 800, 90, message=lambda: f"800 results (have {len(reader.records)})")
        b_srv.kill()  # an endpoint dies with generations in flight: they go to the other endpoint
        wait_until(lambda: reader.count() >= 1200, 90, message=lambda: f"1200 results (have {len(reader.records)})")
        assert procs[1].terminate() == 0, procs[1].output()[-2000:]  # a rebalance: b commits and leaves
        records, dead = prove_exactly_once(kafka_settings, spec, ids, timeout=120)
        reasons = {dict(m.headers() or [])["sie.reason"] for m in dead}
        assert reasons == {b"schema_violation"}, reasons  # nothing dead-lettered for the endpoint outage
        doc = orjson.loads(records[0].value())
        assert doc["status"] == "ok" and doc["usage"]["completion_tokens"] >= 1
    finally:
        reader.close()
        for p in procs:
            p.ensure_dead()
        a_srv.kill()
        b_srv.kill()
