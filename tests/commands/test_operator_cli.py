"""`sie operator crd|resource` and `sie --version`: what a user runs before `kubectl apply`."""

from __future__ import annotations

import yaml

from sie.cli import main
from sie.k8s.crd import CRD_PATH
from sie.schemas.spec import load
from tests.support.helpers import REPO_ROOT


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "sie 0.1.0"


def test_crd_prints_the_committed_crd(capsys):
    assert main(["operator", "crd"]) == 0
    assert capsys.readouterr().out == CRD_PATH.read_text()


def test_resource_of_the_flat_article_spec_parses_back_to_it(capsys):
    spec_file = REPO_ROOT / "examples" / "article" / "model-spec.yaml"
    assert main(["operator", "resource", "-f", str(spec_file), "-n", "models", "--no-upload"]) == 0
    resource = yaml.safe_load(capsys.readouterr().out)
    assert (resource["kind"], resource["metadata"]) == ("ModelService", {"name": "qwen2-7b-scoring", "namespace": "models"})
    (original,) = load(spec_file, many=True)
    back = load(resource)
    assert {k: v for k, v in back.to_document().items() if k not in ("source", "warnings")} == \
        {k: v for k, v in original.to_document().items() if k not in ("source", "warnings")}
