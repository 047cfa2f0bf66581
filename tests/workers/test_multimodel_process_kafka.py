"""Multi-model worker processes (sie.workers.multimodel) on the real broker.

Every model hosted in one process keeps the single scorer's proof: a read_committed reader of its result
and dead-letter topics finds every request id exactly once, across SIGKILLs of the whole process; a model
that hangs or raises on every request does not keep the others from being answered.
"""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from sie.kernel.admin import ensure_model_topics
from tests.support.helpers import wait_until
from tests.support.multimodel_fixtures import SharedHostProcess, echo_model
from tests.support.scorer_fixtures import produce_requests, prove_exactly_once, requests, topics_for

pytestmark = pytest.mark.kafka


def _poison(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    """Requests the echo model cannot score (x = -1): inference_error dead letters of their lane."""
    return [(f"p{i}".encode(), orjson.dumps({"id": f"{prefix}p{i}", "inputs": {"x": -1.0}})) for i in range(n)]


def _ids(batch: list[tuple[bytes, bytes]]) -> set[str]:
    return {orjson.loads(v)["id"] for _k, v in batch}


def test_twenty_models_in_one_process_survive_two_sigkills(kafka_settings, tmp_path) -> None:
    """20 models in one process under load, the process SIGKILLed twice: every model's read_committed
    output has every request exactly once (results + its own dead letters), nothing lost or doubled."""
    specs = [echo_model() for _ in range(20)]
    ensure_model_topics(kafka_settings, [t for s in specs for t in (s.topics.requests, s.topics.results,
                                                                    s.topics.dead_letters)], 4)
    models = [(f"{spec.name}-0", spec) for spec in specs]
    rids = [rid for rid, _ in models]
    expected: dict[str, set[str]] = {spec.name: set() for spec in specs}
    state = tmp_path / "host"

    def produce_phase(phase: int, n: int) -> None:
        for spec in specs:
            batch = requests(n, prefix=f"{spec.name}-{phase}-") + _poison(f"{spec.name}-{phase}-", 2)
            expected[spec.name] |= _ids(batch)
            produce_requests(kafka_settings, spec.topics.requests, batch)

    host = SharedHostProcess(state, kafka_settings.bootstrap_servers)
    try:
        host.set_models(models)
        wait_until(lambda: host.ready(rids), 120, interval=0.3,
                   message=lambda: f"20 lanes READY: {host.health()['lanes']}")
        for phase in range(2):
            produce_phase(phase, 80)
            # kill while it is scoring: some of this phase committed, probably not all
            wait_until(lambda: sum(lane["records"] for lane in host.health()["lanes"].values()) >= 300, 60,
                       interval=0.05, message="the process to score some of the phase")
            host.kill()
            host = SharedHostProcess(state, kafka_settings.bootstrap_servers)  # the same file: the same lanes
            wait_until(lambda: host.ready(rids), 120, interval=0.3,
                       message=lambda: f"20 lanes READY after SIGKILL {phase + 1}: {host.health()['lanes']}")
        produce_phase(2, 40)
        for spec in specs:
            results, dead = prove_exactly_once(kafka_settings, spec, expected[spec.name], timeout=90)
            assert len(dead) == 6, f"{spec.name}: each phase's 2 poison requests are its own dead letters"
        lanes = host.health()["lanes"]
        assert {lane["state"] for lane in lanes.values()} == {"READY"}, lanes
    finally:
        host.ensure_dead()


def test_hung_and_raising_models_do_not_stall_the_others(kafka_settings, tmp_path) -> None:
    """One model hangs on every request, one raises on every request, six are healthy: the six answer
    everything (exactly once) within the deadline; the raising one dead-letters its requests; the hung one
    is reported (health, metric) and restarted as a new generation (fencing the hung thread), FAILED after
    its third hang.  Then models are removed and added without restarting the process."""
    healthy = [echo_model() for _ in range(6)]
    hang, fail = echo_model("echo_hang"), echo_model("echo_raise")
    for spec in [*healthy, hang, fail]:
        topics_for(kafka_settings, spec)
    models = [(f"{spec.name}-0", spec) for spec in [*healthy, hang, fail]]
    host = SharedHostProcess(tmp_path / "host", kafka_settings.bootstrap_servers, "--hang-s", "2",
                             "--metrics-port", "0")
    try:
        host.set_models(models)
        wait_until(lambda: host.ready([rid for rid, _ in models]), 90, interval=0.3,
                   message=lambda: f"lanes READY: {host.health()['lanes']}")
        pid = host.proc.pid
        produce_requests(kafka_settings, hang.topics.requests, requests(20, prefix="h"))
        fail_batch = requests(40, prefix="f")
        produce_requests(kafka_settings, fail.topics.requests, fail_batch)
        batches = {spec.name: requests(300, prefix=f"{spec.name}-") for spec in healthy}
        for spec in healthy:
            produce_requests(kafka_settings, spec.topics.requests, batches[spec.name])
        # the bound: every healthy model answers all 300 within 60 s while the other two misbehave
        for spec in healthy:
            prove_exactly_once(kafka_settings, spec, _ids(batches[spec.name]), timeout=60)
        _results, dead = prove_exactly_once(kafka_settings, fail, _ids(fail_batch), timeout=60)
        assert len(dead) == 39, "all but the example-valued request (x = 1.0) are inference_error dead letters"

        hung_rid = f"{hang.name}-0"
        lane = wait_until(lambda: (lambda h: h if h["hangs"] >= 1 and h["generation"] >= 2 else None)(
            host.health()["lanes"][hung_rid]), 60, interval=0.2, message="the hung lane to be reported and restarted")
        assert lane["last_error"].startswith("hung: inference call running"), lane
        text = httpx.get(f"http://127.0.0.1:{host.health()['metrics_port']}/metrics", timeout=5).text
        hangs = re.search(rf'sie_shared_lane_hangs_total{{model_id="{hang.name}",version="1.0.0"}} (\S+)', text)
        assert hangs and float(hangs.group(1)) >= 1, "the hang is counted in /metrics"
        assert f'sie_records_in_total{{model_id="{healthy[0].name}"}}' in text, "every lane's series on one /metrics"
        wait_until(lambda: host.health()["lanes"][hung_rid]["state"] == "FAILED", 60, interval=0.2,
                   message="the lane FAILED after its third hang")
        assert all(host.health()["lanes"][f"{s.name}-0"]["state"] == "READY" for s in healthy)

        # add and remove models without a restart: the others keep their lanes (same generation)
        added = echo_model()
        topics_for(kafka_settings, added)
        host.set_models([*models[:5], (f"{added.name}-0", added)])
        wait_until(lambda: host.ready([f"{added.name}-0"]) and f"{fail.name}-0" not in host.health()["lanes"],
                   60, interval=0.2, message=lambda: f"the new lane READY, removed ones gone: {host.health()}")
        batch = requests(50, prefix="a")
        produce_requests(kafka_settings, added.topics.requests, batch)
        prove_exactly_once(kafka_settings, added, _ids(batch), timeout=60)
        health = host.health()
        assert health["pid"] == pid
        assert all(health["lanes"][f"{s.name}-0"]["generation"] == 1 for s in healthy[:5])
        assert set(health["lanes"]) == {*(f"{s.name}-0" for s in healthy[:5]), f"{added.name}-0"}
    finally:
        host.ensure_dead()
