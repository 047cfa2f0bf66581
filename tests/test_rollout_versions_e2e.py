"""Rollouts of a user's own models, the way users ship them (issue 22): `sie control` + two `sie agent`
processes on a real broker, each version's code and weights uploaded by `sie apply` from a folder of its own
(``tests/support/user_models.py``: DIFFERENT code per version, outputs that name the code that answered), a steady
request stream throughout.

* python ``churn-py`` 1.0.0 -> 1.1.0: Complete; every committed result's ``version`` label names the code that
  produced it (both builds are the package ``churnpkg``: in one interpreter they were one module); then a
  canary that hangs on every request is rolled back, and an aborted rollout returns to 100 % stable at once;
* torch ``churn-net`` (safetensors + moduleClass) 1.0.0 -> 1.1.0 Complete, then a 1.2.0 whose moduleClass does
  not exist: the rollout fails with that reason and the stable replicas are never restarted;
* TorchScript ``churn-ts`` 1.0.0 -> 1.1.0 Complete;
* two models whose bundles hold different builds of ``churnpkg`` on an agent with shared processes: each in a
  process of its own, each answering with its own code.

Every run ends with the exactly-once proof (read_committed: every request exactly one answer).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from sie.schemas.spec import load
from tests.support.cluster_harness import Cluster, RequestStream, try_get, wait_for
from tests.support.scorer_fixtures import prove_exactly_once
from tests.support.user_models import (
    ALLOWED_MODULES,
    python_project,
    torch_module_project,
    torchscript_project,
    version_code,
)

pytestmark = pytest.mark.kafka

ROLLOUT = {"steps": [50, 100], "intervalSeconds": 3, "surgeTimeoutSeconds": 120,
           "gates": {"minSamples": 10, "p99MaxMs": 30_000, "p99SlackMs": 5_000, "p99MaxRatio": 10}}
#: what the stream sends (tickets 2: the hanging canary hangs on it; its readiness example has tickets 1)
INPUTS = {"tenure": 120.0, "spend": 40.0, "tickets": 2.0}


def _cluster(kafka_settings: Any, tmp_path: Path, agents: int = 2, **env: str) -> Cluster:
    c = Cluster(kafka_settings, tmp_path / "cluster", extra_env={
        "SIE_ALLOWED_MODULES": ALLOWED_MODULES, "SIE_COMPANION_CALL_TIMEOUT_S": "3", **env})
    c.start_control("cp-1")
    for i in range(agents):  # separate caches: each agent fetches what `sie apply` uploaded
        c.start_agent(f"node-{'ab'[i]}", gpus=None, env={"SIE_CACHE_DIR": str(tmp_path / f"cache-{i}")})
    c.wait_leader(60)
    # every agent registered before a spec is applied: replicas placed on the first node alone would be moved back
    # toward the spread meanwhile (docs/control-plane.md, "Spread restored"), a move these tests do not measure
    wait_for(lambda: len([n for n in (try_get(c.api(), "/v1/nodes") or {}).get("nodes", [])
                          if n["status"] == "online"]) == agents, 60, lambda: "agents online; " + c.logs("agent"))
    return c


def _apply(c: Cluster, spec_file: Path) -> None:
    done = c.sie("apply", "--control-url", f"http://127.0.0.1:{c.api()}", "-f", str(spec_file), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _rollout_end(c: Cluster, model: str, timeout: float = 240) -> dict[str, Any]:
    def now() -> Any:
        return try_get(c.api(), f"/v1/rollouts/{model}")

    return wait_for(lambda: (r := now()) and r["phase"] in ("Complete", "RolledBack", "Failed") and r, timeout,
                    lambda: f"the rollout of {model} ends ({now()}); logs:\n{c.logs()}")


def _workers(c: Cluster, model: str, replicas: int) -> dict[str, int]:
    """replica id -> worker pid once the model runs exactly ``replicas`` workers (a surge replica stopped)."""
    def now() -> dict[str, int]:
        return {rid: pid for rid, (_node, pid) in c.all_workers().items() if rid.startswith(f"{model}-")}

    return wait_for(lambda: len(w := now()) == replicas and w, 60, lambda: f"{replicas} workers of {model}: {now()}")


def _stream(c: Cluster, model: str) -> RequestStream:
    topics = c.spec_topics(model)
    return RequestStream(c.settings, topics["requests"], INPUTS, f"{model}-{uuid.uuid4().hex[:6]}",
                         rate_per_s=25).start()


def _answers(c: Cluster, spec_file: Path, stream: RequestStream) -> list[dict[str, Any]]:
    """Every request answered exactly once (read_committed); the committed results."""
    sent = stream.stop()
    spec = load(spec_file, topic_prefix=c.prefix)
    results, dead = prove_exactly_once(c.settings, spec, {f"{stream.tag}-{n}" for n in range(sent)}, timeout=120)
    assert not dead, [d.headers() for d in dead[:3]]
    return [orjson.loads(r.value()) for r in results]


def test_python_versions_are_answered_by_their_own_code_a_hanging_canary_rolls_back_and_abort_restores_stable(
        kafka_settings, tmp_path):
    src = tmp_path / "src"
    c = _cluster(kafka_settings, tmp_path)
    stream = None
    try:
        v1 = python_project(src, "1.0.0", replicas=2)
        _apply(c, v1)
        c.wait_ready("churn-py", 2, timeout=180)
        stream = _stream(c, "churn-py")  # one stream through all three rollouts: one exactly-once proof
        _apply(c, python_project(src, "1.1.0", rollout=ROLLOUT, replicas=2))
        final = _rollout_end(c, "churn-py")
        assert final["phase"] == "Complete", final["events"]
        surged = next(e["reason"] for e in final["events"] if e["from"] == "Surging")
        assert "every replica serves both versions" in surged, final["events"]

        # a canary that passes readiness but hangs on every request: rolled back, stable never restarted
        c.wait_ready("churn-py", 2, timeout=120)
        stable = _workers(c, "churn-py", 2)
        _apply(c, python_project(src, "1.2.0", hang=True, rollout=ROLLOUT, replicas=2))
        final = _rollout_end(c, "churn-py")
        assert final["phase"] == "RolledBack", final["events"]
        why = next(e["reason"] for e in final["events"] if e["to"] == "RollingBack")
        print(f"hanging canary: {why}")
        # its companions are lost at each call (the replicas holding them hand their partitions over, no version
        # answers for another): three losses fail it, or, first, the step's deadline with no canary answer
        assert ("1.2.0" in why and ("lost" in why or "answered no request" in why)) or "canary answered 0 <" in why, why
        c.wait_ready("churn-py", 2, timeout=120)
        assert _workers(c, "churn-py", 2) == stable, "the stable replicas were never restarted"

        # abort mid-step: 100 % stable at once, the canary's replica stops, stable untouched
        slow = {**ROLLOUT, "steps": [50, 100], "intervalSeconds": 600}
        _apply(c, python_project(src, "1.3.0", rollout=slow, replicas=2))
        wait_for(lambda: (r := try_get(c.api(), "/v1/rollouts/churn-py")) and r["phase"] == "Canary", 180,
                 lambda: f"Canary: {try_get(c.api(), '/v1/rollouts/churn-py')}\n{c.logs()}")
        aborted = c.sie("rollout", "abort", "churn-py", "--control-url", f"http://127.0.0.1:{c.api()}")
        assert aborted.returncode == 0, aborted.stdout + aborted.stderr
        final = _rollout_end(c, "churn-py", timeout=60)
        assert final["phase"] == "RolledBack" and final["weight_percent"] == 0, final
        c.wait_ready("churn-py", 2, timeout=120)
        assert _workers(c, "churn-py", 2) == stable

        answers = _answers(c, v1, stream)
        stream = None
        labels = {(a["version"], a["outputs"]["built"], a["outputs"]["weight"]) for a in answers}
        print(f"{len(answers)} answers, labels {sorted(labels)}")
        # every committed result's version is the code that produced it (one package name, two builds)
        assert labels <= {("1.0.0", "1.0.0", 1.0), ("1.1.0", "1.1.0", 1.1), ("1.3.0", "1.3.0", 1.3)}, labels
        assert {"1.0.0", "1.1.0"} <= {v for v, _b, _w in labels}, "both versions answered during the rollout"
    finally:
        if stream is not None:
            stream.stop()
        c.close()


def test_torch_module_class_rollout_completes_and_a_canary_that_cannot_load_leaves_stable_untouched(
        kafka_settings, tmp_path):
    src = tmp_path / "src"
    c = _cluster(kafka_settings, tmp_path)
    stream = None
    try:
        v1 = torch_module_project(src, "1.0.0", replicas=2)
        _apply(c, v1)
        c.wait_ready("churn-net", 2, timeout=180)
        stream = _stream(c, "churn-net")
        _apply(c, torch_module_project(src, "1.1.0", rollout=ROLLOUT, replicas=2))
        final = _rollout_end(c, "churn-net")
        assert final["phase"] == "Complete", final["events"]
        c.wait_ready("churn-net", 2, timeout=120)
        stable = _workers(c, "churn-net", 2)
        _apply(c, torch_module_project(src, "1.2.0", broken=True, rollout=ROLLOUT, replicas=2))
        final = _rollout_end(c, "churn-net")
        assert final["phase"] == "Failed" and final["weight_percent"] == 0, final["events"]
        print(f"broken canary: {final['reason']}")
        assert "NoSuchNet" in final["reason"], final["reason"]
        c.wait_ready("churn-net", 2, timeout=120)
        assert _workers(c, "churn-net", 2) == stable, "a canary that cannot load restarted no stable replica"
        answers = _answers(c, v1, stream)
        stream = None
        for a in answers:
            assert a["outputs"]["code"] == pytest.approx(version_code(a["version"])), a
        assert {a["version"] for a in answers} == {"1.0.0", "1.1.0"}
    finally:
        if stream is not None:
            stream.stop()
        c.close()


def test_torchscript_rollout_completes_with_every_answer_from_its_own_version(kafka_settings, tmp_path):
    src = tmp_path / "src"
    c = _cluster(kafka_settings, tmp_path, agents=1)
    stream = None
    try:
        v1 = torchscript_project(src, "1.0.0")
        _apply(c, v1)
        c.wait_ready("churn-ts", 1, timeout=180)
        stream = _stream(c, "churn-ts")
        _apply(c, torchscript_project(src, "1.1.0", rollout=ROLLOUT))
        final = _rollout_end(c, "churn-ts")
        assert final["phase"] == "Complete", final["events"]
        answers = _answers(c, v1, stream)
        stream = None
        for a in answers:
            assert a["outputs"]["code"] == pytest.approx(version_code(a["version"])), a
        assert {a["version"] for a in answers} == {"1.0.0", "1.1.0"}
    finally:
        if stream is not None:
            stream.stop()
        c.close()


def test_two_builds_of_one_package_in_shared_processes_each_get_a_process_and_answer_with_their_code(
        kafka_settings, tmp_path):
    c = _cluster(kafka_settings, tmp_path, agents=1, SIE_SHARED_PROCESSES="4")
    try:
        specs = {}
        for name, version in (("churn-a", "1.0.0"), ("churn-b", "2.0.0")):
            path = python_project(tmp_path / "src" / name, version, name=name)
            doc = yaml.safe_load(path.read_text())
            doc["spec"]["priorityLevel"] = "P2"  # small models share processes
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            _apply(c, path)
            specs[name] = path
        models = {name: c.wait_ready(name, 1, timeout=180) for name in specs}
        processes = {name: m["replicas"][0].get("process") for name, m in models.items()}
        assert processes["churn-a"] != processes["churn-b"], processes
        assert all(p and p.startswith("shared-") for p in processes.values()), processes
        for name, version in (("churn-a", "1.0.0"), ("churn-b", "2.0.0")):
            stream = RequestStream(c.settings, c.spec_topics(name)["requests"], INPUTS, f"{name}-s", rate_per_s=50)
            stream.send(40)
            answers = _answers(c, specs[name], stream)
            assert {a["outputs"]["built"] for a in answers} == {version}
    finally:
        c.close()
