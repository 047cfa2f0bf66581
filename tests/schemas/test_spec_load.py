"""``sie.schemas.spec.load``: the one way to read a ModelService, from a file or a document, with or without
this node's policy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sie.kernel.settings import Settings
from sie.schemas.spec import InvalidSpec, load
from sie.schemas.spec_policy import SpecPolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_file_and_its_document_load_to_the_same_spec():
    path = EXAMPLES / "fraud-scorer.yaml"
    from_file = load(path)
    from_doc = load(yaml.safe_load(path.read_text()), origin=str(path), base_dir=path.parent)
    assert from_file == from_doc
    assert from_file.source == str(path)


def test_many_returns_every_document_and_one_refuses_several(tmp_path):
    text = (EXAMPLES / "fraud-rules.yaml").read_text()
    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    both = tmp_path / "both.yaml"
    both.write_text(text + "\n---\n" + text.replace("name: fraud-rules", "name: fraud-rules-b"))
    specs = load(both, many=True)
    assert [s.name for s in specs] == ["fraud-rules", "fraud-rules-b"]
    assert [s.source for s in specs] == [f"{both}#1", f"{both}#2"]
    with pytest.raises(InvalidSpec, match="expected one ModelService, found 2"):
        load(both)


def test_the_topic_prefix_comes_from_the_policy_unless_given():
    path = EXAMPLES / "fraud-scorer.yaml"
    assert load(path).topics.requests.startswith("sie.")
    settings = Settings(topic_prefix="blue")
    assert load(path, settings).topics.requests.startswith("blue.")
    assert load(path, SpecPolicy.from_settings(settings)).group_id.startswith("blue.")
    assert load(path, settings, topic_prefix="green").topics.requests.startswith("green.")


def test_a_policy_refuses_what_the_node_may_not_run_naming_the_field(tmp_path):
    doc = yaml.safe_load((EXAMPLES / "fraud-rules.yaml").read_text())
    doc["spec"]["backend"]["callable"] = "os.path:join"
    assert load(doc).backend.callable == "os.path:join"  # the document alone is fine
    with pytest.raises(InvalidSpec) as exc:
        load(doc, Settings())
    assert any(p.startswith("spec.backend.callable:") for p in exc.value.problems)


def test_a_files_own_folder_is_a_model_root_for_the_policy(tmp_path):
    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    shutil.copy(EXAMPLES / "fraud-scorer.yaml", tmp_path / "fraud-scorer.yaml")
    settings = Settings(model_roots=[tmp_path / "elsewhere"], cache_dir=tmp_path / "cache")
    assert load(tmp_path / "fraud-scorer.yaml", settings).backend.artifact is not None
    doc = yaml.safe_load((tmp_path / "fraud-scorer.yaml").read_text())
    with pytest.raises(InvalidSpec) as exc:  # a document has no folder of its own: the node's roots only
        load(doc, settings, base_dir=tmp_path)
    assert any(p.startswith("spec.backend.artifact:") for p in exc.value.problems)


def test_anything_but_a_mapping_is_refused_as_a_document():
    with pytest.raises(InvalidSpec, match="document: must be a mapping"):
        load([{"name": "x"}])  # type: ignore[arg-type]
