"""Hole 7: ``sie apply`` uploaded any file under the spec's folder, dot-folders included: a spec in ``~`` with
``artifact: .ssh/id_rsa`` and an explicit ``format`` uploaded the key to the cluster.  Now only regular files of a
model artifact format (suffix agreeing with the format), outside dot-files and dot-folders, leave the machine;
the check runs before anything is uploaded or published.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from sie.cli import cli
from sie.commands._artifacts import for_cluster
from sie.kernel.settings import Settings
from sie.schemas.spec import load
from tests.support.helpers import EXAMPLES

WEIGHTS = EXAMPLES / "models" / "fraud" / "fraud_scorer.safetensors"


class RecordingUploader:
    def __init__(self) -> None:
        self.uploads: list[str] = []

    def upload(self, sha256: str, name: str, size: int, chunks: Any) -> bool:
        self.uploads.append(name)
        return True


def _spec(home: Path, artifact: str, fmt: str | None = "safetensors") -> Path:
    doc = yaml.safe_load((EXAMPLES / "fraud-scorer.yaml").read_text())
    backend = doc["spec"]["backend"]
    backend.update(artifact=artifact, moduleClass="models.fraud.model:FraudMLP")
    backend.pop("format", None)
    if fmt is not None:
        backend["format"] = fmt
    path = home / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (home / "models").mkdir()
    (home / "models" / "w.safetensors").write_bytes(WEIGHTS.read_bytes())
    (home / ".hidden.safetensors").write_bytes(WEIGHTS.read_bytes())
    (home / "notes.txt").write_text("not a model")
    os.symlink(home / ".ssh" / "id_rsa", home / "models" / "innocent.safetensors")
    return home


@pytest.mark.parametrize(("artifact", "fmt", "reason"), [
    (".ssh/id_rsa", "safetensors", "is inside a hidden file or folder ('.ssh')"),
    (".hidden.safetensors", "safetensors", "is inside a hidden file or folder ('.hidden.safetensors')"),
    ("models/innocent.safetensors", "safetensors", "is inside a hidden file or folder ('.ssh')"),  # symlink followed
    ("notes.txt", "safetensors", "notes.txt is not a model artifact (.pt, .pt2, .safetensors, .ts)"),
    ("models/w.safetensors", "torchscript", "is a safetensors file by its suffix, the spec says format torchscript"),
])
def test_only_model_artifact_files_outside_dot_folders_are_uploaded(home: Path, tmp_path: Path, artifact: str,
                                                                    fmt: str, reason: str):
    settings = Settings(cache_dir=tmp_path / "cache")
    spec_file = _spec(home, artifact, fmt)
    spec = load(spec_file, settings)  # the spec policy itself lets it through: it is under the folder
    uploader = RecordingUploader()
    with pytest.raises(click.ClickException, match="spec.backend.artifact: ") as refused:
        for_cluster(spec, spec_file, settings, uploader)
    assert reason in refused.value.message and uploader.uploads == []


def test_a_model_artifact_next_to_the_spec_is_uploaded(home: Path, tmp_path: Path):
    settings = Settings(cache_dir=tmp_path / "cache")
    spec_file = _spec(home, "models/w.safetensors")
    uploader = RecordingUploader()
    uploaded = for_cluster(load(spec_file, settings), spec_file, settings, uploader)
    assert uploader.uploads[0] == "w.safetensors" and uploaded.backend.artifact_ref is not None


def test_sie_apply_refuses_before_it_uploads_or_publishes_anything(home: Path, tmp_path: Path):
    spec_file = _spec(home, ".ssh/id_rsa")
    # nothing listens on port 1: the refusal comes before Kafka is asked (else this would be a connect timeout)
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "apply", "-f", str(spec_file)],
                                env={"SIE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code != 0
    said = result.output + str(result.exception)
    assert "fraud-scorer: spec.backend.artifact:" in said and "'.ssh'" in said and "secret" not in said
