"""Companion versions in processes of their own (``sie.workers.versions``), with real child processes.

Each test runs ``python -m sie.workers.version_host`` for real: two builds of ONE package (``churnpkg``,
different code, a lazy import inside the call) answer side by side, each with its own code; a version that
cannot load is reported failed with the reason; a SIGKILLed or hung one raises ``VersionLost`` within the
call deadline, is killed, and comes back after its backoff; printing model code cannot corrupt an answer.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.module_bundle import build_bundle
from sie.schemas.spec import load
from sie.streams.scorer.errors import VersionLost
from sie.workers.backends import InferenceError
from sie.workers.versions import AgentPrepared, ProcessVersions, prepared_file, write_document
from tests.support.helpers import wait_until
from tests.support.user_models import python_project

ROWS = [{"tenure": 100.0, "spend": 1.0, "tickets": 2.0}, {"tenure": 300.0, "spend": 1.0, "tickets": 2.0}]


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "SIE_ALLOWED_MODULES": "churnpkg", "SIE_MODEL_ROOTS": str(root),
            "SIE_CACHE_DIR": str(root / "cache")}


def _prepare(root: Path, replica_dir: Path, version: str, **project: Any) -> dict[str, Any]:
    """What the agent writes for a companion: the spec with its package as a verified module archive."""
    spec_file = python_project(root / "src", version, **project)
    spec = load(spec_file)
    archive, _names = build_bundle(spec.backend, [spec_file.parent], ["churnpkg"])
    bundle = root / "bundles" / version / "modules.zip"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(archive)
    doc = spec.to_document()
    doc["backend"] = {**doc["backend"], "modules_path": str(bundle)}
    doc["source"] = None
    write_document(prepared_file(replica_dir, version), doc)
    return doc


def _versions(root: Path, replica_dir: Path, **options: Any) -> ProcessVersions:
    settings = Settings()
    return ProcessVersions(AgentPrepared(replica_dir), "replica churn-py-0", log_dir=replica_dir,
                           call_timeout_s=options.pop("call_timeout_s", settings.companion_call_timeout_s),
                           load_timeout_s=options.pop("load_timeout_s", 120.0), env=_env(root), **options)


def _ready(versions: ProcessVersions, version: str, doc: dict[str, Any], timeout: float = 90.0) -> Any:
    wait_until(lambda: versions.backend(version, doc) is not None, timeout=timeout,
               message=lambda: f"{version} not ready: {versions.report()}")
    return versions.backend(version, doc)


@pytest.fixture()
def replica_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "agent" / "churn-py-0"
    folder.mkdir(parents=True)
    return folder


def test_two_builds_of_one_package_answer_side_by_side_each_with_its_own_code(tmp_path, replica_dir):
    one = _prepare(tmp_path, replica_dir, "1.0.0")
    two = _prepare(tmp_path, replica_dir, "1.1.0")
    versions = _versions(tmp_path, replica_dir)
    try:
        assert versions.backend("1.0.0", one) is None  # never blocks: it starts loading
        first, second = _ready(versions, "1.0.0", one), _ready(versions, "1.1.0", two)
        assert first.pid != second.pid
        for backend, built, weight in ((first, "1.0.0", 1.0), (second, "1.1.0", 1.1)):
            out = backend.infer(ROWS)
            assert [o["built"] for o in out] == [built, built]
            assert [o["weight"] for o in out] == [weight, weight]  # the lazily imported helper is its own too
        report = versions.report()["1.1.0"]
        assert {k: report[k] for k in ("state", "detail", "restarts")} == {"state": "ready", "detail": "", "restarts": 0}
        assert report["rss_mb"] > 10  # its process's memory: the agent reports it as held
        versions.retain({"1.1.0"})
        assert set(versions.report()) == {"1.1.0"}
        wait_until(lambda: _gone(first.pid), timeout=10, message="the released version's process still runs")
    finally:
        versions.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting to be reaped is gone too
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def test_a_version_that_cannot_load_is_reported_failed_with_the_reason(tmp_path, replica_dir):
    doc = _prepare(tmp_path, replica_dir, "1.1.0", broken=True)
    versions = _versions(tmp_path, replica_dir)
    try:
        versions.backend("1.1.0", doc)
        wait_until(lambda: versions.report()["1.1.0"]["state"] == "failed", timeout=90,
                   message=lambda: f"not failed: {versions.report()}")
        assert "no_such_scorer" in versions.report()["1.1.0"]["detail"]
        assert versions.backend("1.1.0", doc) is None  # failed for good: not restarted
    finally:
        versions.close()


def test_a_missing_document_waits_for_the_agent(tmp_path, replica_dir):
    versions = _versions(tmp_path, replica_dir)
    doc = {"name": "churn-py", "version": "1.1.0"}
    assert versions.backend("1.1.0", doc) is None
    assert versions.report()["1.1.0"]["state"] == "waiting"
    assert "agent" in versions.report()["1.1.0"]["detail"]


def test_a_killed_companion_is_lost_then_started_again(tmp_path, replica_dir):
    doc = _prepare(tmp_path, replica_dir, "1.1.0")
    versions = _versions(tmp_path, replica_dir)
    try:
        backend = _ready(versions, "1.1.0", doc)
        os.kill(backend.pid, signal.SIGKILL)
        with pytest.raises(VersionLost) as lost:
            wait_until(lambda: backend.state != "ready", timeout=10, message="the reader never saw the exit")
            backend.infer(ROWS)
        assert "SIGKILL" in lost.value.detail
        versions.lost("1.1.0", lost.value.detail)
        assert versions.report()["1.1.0"]["state"] == "waiting"
        again = _ready(versions, "1.1.0", doc)
        assert again.pid != backend.pid and again.infer(ROWS)[0]["built"] == "1.1.0"
        assert versions.report()["1.1.0"]["restarts"] == 1
    finally:
        versions.close()


def test_a_hung_call_is_abandoned_at_its_deadline_and_the_process_killed(tmp_path, replica_dir):
    doc = _prepare(tmp_path, replica_dir, "1.1.0", hang=True)
    versions = _versions(tmp_path, replica_dir, call_timeout_s=1.5)
    try:
        backend = _ready(versions, "1.1.0", doc)  # the example passes readiness; other requests hang
        started = time.monotonic()
        with pytest.raises(VersionLost, match="no answer within 1.5s"):
            backend.infer(ROWS)
        assert time.monotonic() - started < 6.0
        wait_until(lambda: _gone(backend.pid), timeout=10, message="the hung process was not killed")
    finally:
        versions.close()


def test_a_failed_call_is_an_inference_error_not_a_loss(tmp_path, replica_dir):
    doc = _prepare(tmp_path, replica_dir, "1.1.0")
    versions = _versions(tmp_path, replica_dir)
    try:
        backend = _ready(versions, "1.1.0", doc)
        with pytest.raises(InferenceError, match="KeyError"):
            backend.infer([{"spend": 1.0}])  # the model raises on this row: poison, for the scorer to isolate
        assert backend.infer(ROWS)[0]["built"] == "1.1.0"  # the process still answers
    finally:
        versions.close()


def test_sie_score_prepares_a_companion_itself_with_the_agents_preparation(tmp_path):
    """Without an agent (``sie score``), the process prepares the other version with ``prepare_spec``: the same
    policy check (a refusal fails the companion, naming the field) and the same document on disk."""
    from sie.schemas.spec_policy import SpecPolicy
    from sie.workers.versions import SelfPrepared

    policy = SpecPolicy.from_settings(Settings().with_overrides(allowed_modules=["churnpkg"],
                                                                model_roots=[tmp_path]))
    spec = load(python_project(tmp_path / "src", "1.1.0"))
    source = SelfPrepared(tmp_path / "prepared", policy, artifacts=None)
    path = source.prepared("1.1.0", spec.to_document())
    assert path == tmp_path / "prepared" / "version-1.1.0.json"
    bad = {**spec.to_document(), "backend": {**spec.to_document()["backend"], "callable": "os:system"}}
    versions = ProcessVersions(source, "scorer t", log_dir=tmp_path)
    assert versions.backend("1.1.0", bad) is None
    state = versions.report()["1.1.0"]
    assert state["state"] == "failed" and "spec.backend.callable" in state["detail"]
