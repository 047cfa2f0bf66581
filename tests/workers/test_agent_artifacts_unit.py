"""The agent's side of artifacts without Kafka: background fetches that never block the loop, deferred
launches (PENDING with a reason), refusals (FAILED at once, no crash loop), the worker's spec naming the
verified copies, connector replicas, and imports from a module archive only."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import threading
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import ArtifactRefused, ArtifactUnavailable
from sie.schemas.artifact_store import Manifest
from sie.schemas.connector_spec import connector_replica_doc, parse_connector_spec
from sie.schemas.spec import load
from sie.schemas.spec_models import ArtifactRef
from sie.schemas.spec_policy import SpecPolicy
from sie.workers.agent.artifacts import ArtifactFetcher
from sie.workers.agent.launch import CONNECTOR_MODULE, WORKER_MODULE, WorkerCommandBuilder
from sie.workers.backends.base import BackendError, import_object
from sie.workers.process import LaunchDeferred, LaunchRefused, LaunchSpec
from sie.workers.replica import DesiredReplica, ReplicaState
from sie.workers.supervisor import Supervisor, SupervisorPolicy
from tests.fakes.workers import FakeClock, FakeLauncher
from tests.support.helpers import EXAMPLES, wait_until


class FakeStore:
    """``ArtifactStore`` stand-in: the test decides what a lookup finds and how a fetch ends."""

    manifest_topic = "t.artifacts"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None
        self.fetches = 0

    def put(self, data: bytes, name: str = "w.safetensors") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        self.data[sha] = data
        return ArtifactRef(sha256=sha, name=name, size=len(data))

    def lookup(self, sha256: str, timeout: float = 30.0) -> Manifest | None:
        if sha256 not in self.data:
            return None
        return Manifest(sha256, "w", len(self.data[sha256]), 4, 1, 0, 0, 0, 0)

    def require(self, sha256: str, label: str, timeout: float = 30.0) -> Manifest:
        found = self.lookup(sha256, timeout)
        if found is None:
            raise ArtifactRefused(f"artifact {label} is not on the cluster's artifacts topic ({self.manifest_topic})")
        return found

    def fetch(self, manifest: Manifest, sink: Any, timeout: float = 300.0) -> None:
        self.fetches += 1
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        sink.write(self.data[manifest.sha256])


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", allowed_modules="models.fraud,zbundle")


def _fetcher(settings: Settings, store: FakeStore, clock: FakeClock) -> ArtifactFetcher:
    return ArtifactFetcher(settings, SpecPolicy.from_settings(settings), store=store,  # type: ignore[arg-type]
                           backoff_initial_s=2, forget_refusal_s=30, clock=clock.monotonic)


def _settle(fetcher: ArtifactFetcher, ref: ArtifactRef) -> Any:
    """``resolve`` once the background job ended: its path, or the exception it now raises."""
    job = fetcher._jobs.get(ref.sha256)  # noqa: SLF001 - waiting on the fetch the test started
    if job is not None:
        wait_until(job.done, timeout=10, message="background fetch")
    try:
        return fetcher.resolve(ref)
    except (LaunchDeferred, LaunchRefused) as exc:
        return exc


def test_a_fetch_runs_in_the_background_and_the_copy_is_verified(settings: Settings) -> None:
    store, clock = FakeStore(), FakeClock()
    fetcher = _fetcher(settings, store, clock)
    ref = store.put(b"weights" * 100)
    store.release.clear()
    with pytest.raises(LaunchDeferred, match=r"fetching artifact sha256:\w{12} \(w.safetensors\) \(700 bytes\)"):
        fetcher.resolve(ref)  # returns at once: the agent's loop never waits for a download
    with pytest.raises(LaunchDeferred):
        fetcher.resolve(ref)
    store.release.set()
    path = _settle(fetcher, ref)
    assert path == settings.artifact_cache_dir / "sha256" / ref.sha256 / "w.safetensors"
    assert path.read_bytes() == b"weights" * 100 and store.fetches == 1
    assert fetcher.resolve(ref) == path and store.fetches == 1  # cached: no second fetch
    fetcher.close()


def test_refused_bytes_fail_at_once_and_are_retried_only_after_a_while(settings: Settings) -> None:
    store, clock = FakeStore(), FakeClock()
    fetcher = _fetcher(settings, store, clock)
    ref = store.put(b"weights")
    store.fail = ArtifactRefused("artifact x: chunk 0 is corrupt")
    with pytest.raises(LaunchDeferred):
        fetcher.resolve(ref)
    refused = _settle(fetcher, ref)
    assert isinstance(refused, LaunchRefused) and "chunk 0 is corrupt" in str(refused)
    with pytest.raises(LaunchRefused):  # remembered: a relaunch does not refetch
        fetcher.resolve(ref)
    assert store.fetches == 1
    store.fail = None
    clock.advance(31)  # uploaded again meanwhile: the next launch fetches afresh
    with pytest.raises(LaunchDeferred):
        fetcher.resolve(ref)
    assert _settle(fetcher, ref).read_bytes() == b"weights" and store.fetches == 2
    missing = ArtifactRef(sha256="0" * 64, name="x.pt")
    with pytest.raises(LaunchDeferred):
        fetcher.resolve(missing)
    assert "is not on the cluster's artifacts topic" in str(_settle(fetcher, missing))
    fetcher.close()


def test_an_unavailable_source_is_retried_with_backoff(settings: Settings) -> None:
    store, clock = FakeStore(), FakeClock()
    fetcher = _fetcher(settings, store, clock)
    ref = store.put(b"weights")
    store.fail = ArtifactUnavailable("broker did not answer")
    with pytest.raises(LaunchDeferred):
        fetcher.resolve(ref)
    deferred = _settle(fetcher, ref)
    assert isinstance(deferred, LaunchDeferred) and "broker did not answer; retrying in 2s" in str(deferred)
    with pytest.raises(LaunchDeferred, match="retrying in 2s"):
        fetcher.resolve(ref)
    assert store.fetches == 1  # not before the backoff
    store.fail = None
    clock.advance(2)
    with pytest.raises(LaunchDeferred, match="fetching"):
        fetcher.resolve(ref)
    assert _settle(fetcher, ref).read_bytes() == b"weights"
    fetcher.close()


def test_a_deferred_launch_stays_pending_with_its_reason_and_no_crash(settings: Settings) -> None:
    clock, launcher = FakeClock(), FakeLauncher()
    ready = {"now": False}

    def build(d: DesiredReplica) -> LaunchSpec:
        if not ready["now"]:
            raise LaunchDeferred("fetching artifact sha256:ab12 (w.safetensors)")
        return LaunchSpec(name=d.replica_id, argv=("worker",))

    sup = Supervisor(launcher, build, clock, SupervisorPolicy(deferred_retry_s=0.5))
    sup.set_desired([DesiredReplica("m-0", "m", "1", "{}")])
    first = sup.update()
    assert [(c.state, c.reason) for c in first] == [(ReplicaState.PENDING, "assigned"),
                                                    (ReplicaState.PENDING, "fetching artifact sha256:ab12 (w.safetensors)")]
    clock.advance(0.6)
    assert sup.update() == []  # same reason: nothing new to publish
    ready["now"] = True
    assert sup.update() == []  # not before deferred_retry_s
    clock.advance(0.6)
    assert [c.state for c in sup.update()] == [ReplicaState.STARTING]
    assert launcher.started and sup.snapshots()[0].restarts == 0


# ------------------------------------------------------------------------------------ command builder


def _zip(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return out.getvalue()


class FakeFetcher:
    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def resolve(self, ref: ArtifactRef) -> Path:
        return self.paths[ref.sha256]


def _builder(settings: Settings, tmp_path: Path, fetcher: Any) -> WorkerCommandBuilder:
    return WorkerCommandBuilder(tmp_path / "work", base_env={}, settings=settings,
                                spec_policy=SpecPolicy.from_settings(settings), artifacts=fetcher)


def test_the_worker_gets_the_verified_copies_and_no_working_directory_on_its_path(settings: Settings,
                                                                                  tmp_path: Path) -> None:
    cache = settings.artifact_cache_dir / "sha256"
    bundle = _zip({"models/__init__.py": "", "models/fraud/__init__.py": "", "models/fraud/rules.py": ""})
    bsha, wsha = hashlib.sha256(bundle).hexdigest(), "cd" * 32
    (cache / bsha).mkdir(parents=True)
    (cache / bsha / "modules.zip").write_bytes(bundle)
    (cache / wsha).mkdir(parents=True)
    (cache / wsha / "w.pt").write_bytes(b"x")
    doc = load(EXAMPLES / "fraud-scorer.yaml").to_document()
    doc["backend"].update(artifact=None, artifact_ref={"sha256": wsha, "name": "w.pt"},
                          modules={"sha256": bsha, "name": "modules.zip"})
    builder = _builder(settings, tmp_path, FakeFetcher({bsha: cache / bsha / "modules.zip", wsha: cache / wsha / "w.pt"}))
    launch = builder(DesiredReplica("fraud-scorer-0", "fraud-scorer", "1.0.0", json.dumps(doc)))
    assert launch.argv[1:4] == ("-P", "-m", WORKER_MODULE)  # no working directory on the worker's sys.path
    assert launch.cwd == str(tmp_path / "work" / "fraud-scorer-0")
    written = json.loads(Path(launch.argv[launch.argv.index("--spec-file") + 1]).read_text())
    assert written["backend"]["artifact"] == str(cache / wsha / "w.pt")
    assert written["backend"]["modules_path"] == str(cache / bsha / "modules.zip")

    evil = _zip({"models/fraud/rules.py": "", "sitecustomize.py": "import os"})
    esha = hashlib.sha256(evil).hexdigest()
    (cache / esha).mkdir()
    (cache / esha / "modules.zip").write_bytes(evil)
    doc["backend"]["modules"] = {"sha256": esha, "name": "modules.zip"}
    builder = _builder(settings, tmp_path, FakeFetcher({esha: cache / esha / "modules.zip", wsha: cache / wsha / "w.pt"}))
    with pytest.raises(LaunchRefused, match="holds module 'sitecustomize', outside this node's allowed modules"):
        builder(DesiredReplica("fraud-scorer-0", "fraud-scorer", "1.0.0", json.dumps(doc)))


def test_a_connector_replica_runs_the_cdc_worker(settings: Settings, tmp_path: Path) -> None:
    spec = parse_connector_spec({"name": "orders", "format": "canal-json", "source_topic": "canal.orders",
                                 "model": "fraud-scorer", "tables": ["shop.orders"]})
    doc = connector_replica_doc(spec, {"amount": "float"}, "sie.model.fraud-scorer.requests")
    launch = _builder(settings, tmp_path, None)(DesiredReplica("cdc:orders-0", "cdc:orders", "v1", json.dumps(doc)))
    assert launch.argv[1:4] == ("-P", "-m", CONNECTOR_MODULE) and "--gpu-indices" not in launch.argv
    assert json.loads(Path(launch.argv[launch.argv.index("--spec-file") + 1]).read_text()) == doc


# -------------------------------------------------------------------------------------- imports


def test_modules_are_imported_from_their_archive_and_nowhere_else(tmp_path: Path) -> None:
    name = f"zbundle{uuid.uuid4().hex[:8]}"
    archive = tmp_path / "modules.zip"
    archive.write_bytes(_zip({f"{name}/__init__.py": "", f"{name}/rules.py": "def score(xs):\n    return xs\n"}))
    try:
        fn = import_object(f"{name}.rules:score", allowed_modules=[name], bundle=archive)
        assert fn([1]) == [1] and sys.modules[f"{name}.rules"].__file__.startswith(str(archive) + "/")
        other = tmp_path / "other.zip"
        other.write_bytes(_zip({f"{name}/__init__.py": "", f"{name}/rules.py": "def score(xs):\n    return []\n"}))
        with pytest.raises(BackendError, match=f"module '{name}' is already loaded from .*modules.zip"):
            import_object(f"{name}.rules:score", allowed_modules=[name], bundle=other)
        with pytest.raises(BackendError, match="cannot import module"):
            import_object(f"{name}x.rules:score", allowed_modules=[f"{name}x"], bundle=archive)
    finally:
        for key in [k for k in sys.modules if k.startswith(name)]:
            del sys.modules[key]
        while str(archive) in sys.path:
            sys.path.remove(str(archive))
