"""Quotas on the real broker, through the real CLI (``sie score``), against a fake LLM server process: two
callers, one far over its tokens/s quota.  ``delay``: nothing is dead-lettered, every request is answered
exactly once, the polite caller's requests are sent as they arrive while the greedy one's are spread at
its quota.  ``reject``: the greedy caller's excess is dead-lettered ``quota_exceeded``, the polite caller
is answered in full."""

from __future__ import annotations

import orjson
import pytest

from tests.helpers import wait_until
from tests.llm_fixtures import FakeLLMProcess, write_llm_spec
from tests.scorer_fixtures import ScorerProcess, group_members, produce_requests, prove_exactly_once, topics_for

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
    from sie.schemas.spec import load_spec

    spec = load_spec(spec_path)
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
