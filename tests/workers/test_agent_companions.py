"""The agent prepares each replica's companion version with the one preparation of a version (policy,
artifacts fetched and verified) into ``version-<v>.json``, reports the agent's state until then, and removes
the file once the assignment no longer names it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sie.kernel.settings import Settings
from sie.schemas.spec_policy import SpecPolicy
from sie.workers.agent.companions import Companions
from sie.workers.process import LaunchDeferred, LaunchRefused
from sie.workers.replica import DesiredReplica
from tests.support.scorer_fixtures import echo_version_spec


class Commands:
    """The parts of ``WorkerCommandBuilder`` the companions use."""

    def __init__(self, work_dir: Path, artifacts: Any = None) -> None:
        self.work_dir = work_dir
        self.spec_policy = SpecPolicy.from_settings(Settings().with_overrides(
            allowed_modules=["tests.support.scorer_fixtures"], model_roots=[work_dir]))
        self.artifacts = artifacts

    def replica_dir(self, replica_id: str) -> Path:
        return self.work_dir / replica_id


class Fetching:
    """An artifact fetcher whose download is still running, then done, then refused (as the test says)."""

    def __init__(self, path: Path) -> None:
        self.path, self.mode = path, "fetching"

    def resolve(self, ref: Any) -> Path:
        if self.mode == "fetching":
            raise LaunchDeferred(f"fetching artifact {ref.label}")
        if self.mode == "refused":
            raise LaunchRefused(f"artifact {ref.label}: sha256 mismatch")
        return self.path


@dataclass
class Actual:
    desired: DesiredReplica
    retiring: bool = False
    replica_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.replica_id = self.desired.replica_id


def replica(*companions: dict[str, Any]) -> Actual:
    own = echo_version_spec("m", "1.0.0")
    return Actual(DesiredReplica("m-0", "m", "1.0.0", json.dumps(own.to_document()),
                                 companions=tuple(json.dumps(c) for c in companions)))


def test_a_companion_is_prepared_into_the_replica_folder_and_removed_when_no_longer_named(tmp_path):
    canary = echo_version_spec("m", "1.1.0", "echo_canary").to_document()
    companions = Companions(Commands(tmp_path))
    companions.reconcile([replica(canary)])
    written = tmp_path / "m-0" / "version-1.1.0.json"
    assert json.loads(written.read_text())["backend"]["callable"] == "tests.support.scorer_fixtures:echo_canary"
    assert companions.versions_of("m-0", {}) == {"1.1.0": {"state": "waiting", "detail":
                                                           "prepared; the worker has not picked it up yet"}}
    worker = {"1.1.0": {"state": "ready", "detail": ""}}
    assert companions.versions_of("m-0", worker) == worker
    companions.reconcile([replica()])  # the rollout ended: the assignment names no companion
    assert not written.exists() and companions.versions_of("m-0", worker) == {}


def test_a_companion_the_policy_refuses_is_failed_with_the_field_named(tmp_path):
    bad = echo_version_spec("m", "1.1.0").to_document()
    bad["backend"] = {**bad["backend"], "callable": "os:system"}
    companions = Companions(Commands(tmp_path))
    companions.reconcile([replica(bad)])
    state = companions.versions_of("m-0", {"1.1.0": {"state": "ready", "detail": ""}})["1.1.0"]
    assert state["state"] == "failed" and "spec.backend.callable" in state["detail"]
    assert not (tmp_path / "m-0" / "version-1.1.0.json").exists()


def test_a_companion_whose_artifact_is_being_fetched_waits_then_is_written(tmp_path):
    from sie.schemas.spec_models import ArtifactRef

    fetcher = Fetching(tmp_path / "cache" / "weights.bin")
    canary = echo_version_spec("m", "1.1.0").to_document()
    canary["backend"] = {**canary["backend"], "artifact_ref": ArtifactRef(sha256="ab" * 32, name="w.bin").model_dump()}
    companions = Companions(Commands(tmp_path, fetcher))
    companions.reconcile([replica(canary)])
    assert companions.versions_of("m-0", {})["1.1.0"] == {"state": "waiting",
                                                         "detail": "fetching artifact sha256:abababababab (w.bin)"}
    fetcher.mode = "done"
    companions.reconcile([replica(canary)])
    doc = json.loads((tmp_path / "m-0" / "version-1.1.0.json").read_text())
    assert doc["backend"]["artifact"] == str(fetcher.path)
