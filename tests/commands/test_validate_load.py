"""`sie validate --load` and `sie predict`: what only showed up under the agent (a crash loop, a cool-down)
is found before apply: a Python file renamed fake.pt, an output of shape [B, 2] for one output field, an
example scored out of its declared range.  `admission_problems` never imports code outside its allow-list."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import yaml

from sie.cli import main
from tests.support.helpers import REPO_ROOT

FIELDS = ["amount", "merchant_risk", "hour", "account_age_days", "is_foreign", "tx_count_24h"]
EXAMPLE = {"amount": 2500.0, "merchant_risk": 0.85, "hour": 3, "account_age_days": 12, "is_foreign": True,
           "tx_count_24h": 9}


def churn_spec(directory: Path, artifact: str, outputs: list[dict] | None = None, backend: dict | None = None) -> Path:
    doc = {
        "apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": "churn"},
        "spec": {
            "model": {"name": "churn", "version": "1.0.0"},
            "backend": backend or {"type": "torch", "artifact": artifact, "device": "auto"},
            "inputSchema": {"type": "json", "fields": [
                {"name": n, "type": "bool" if n == "is_foreign" else "float"} for n in FIELDS]},
            "outputSchema": {"type": "json", "fields": outputs or [
                {"name": "churn_probability", "type": "float", "range": [0, 1]}]},
            "exampleInput": EXAMPLE,
        },
    }
    path = directory / "churn.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def scripted(directory: Path, out_features: int, bias: float, sigmoid: bool = False) -> str:
    import warnings

    import torch

    warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.squash = sigmoid
            self.linear = torch.nn.Linear(len(FIELDS), out_features)
            torch.nn.init.zeros_(self.linear.weight)
            torch.nn.init.constant_(self.linear.bias, bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            return torch.sigmoid(y) if self.squash else y

    name = f"model-{out_features}-{sigmoid}.pt"
    torch.jit.script(Model()).save(str(directory / name))
    return name


def test_a_python_file_renamed_fake_pt_is_refused_with_the_reason(tmp_path, capsys):
    (tmp_path / "fake.pt").write_text("import os\nprint('hello')\n")
    spec = churn_spec(tmp_path, "fake.pt")
    assert main(["validate", "-f", str(spec)]) == 0  # the document alone is fine...
    capsys.readouterr()
    assert main(["validate", "--load", "-f", str(spec)]) == 1  # ...loading it is not
    captured = capsys.readouterr()
    err = captured.err
    # one verdict per spec: not `ok:` on stdout and then `error:` on stderr for the same spec (issue 38)
    assert "ok: churn" not in captured.out and captured.out.startswith("failed: churn 1.0.0 (torch)\n")
    assert err.startswith("error: churn:1.0.0: load: spec.backend.artifact ")
    assert "fake.pt: declared torchscript but the file is not a zip archive; SIE never unpickles" in err


def test_an_output_of_two_columns_for_one_field_is_refused_naming_the_shapes(tmp_path, capsys):
    spec = churn_spec(tmp_path, scripted(tmp_path, out_features=2, bias=0.5, sigmoid=True))
    assert main(["validate", "--load", "-f", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "model output shape [2, 2] for a batch of 2 does not match the 1 output field(s) ['churn_probability']" in err


def test_logits_out_of_the_declared_range_are_refused_and_predict_dead_letters_them(tmp_path, capsys):
    spec = churn_spec(tmp_path, scripted(tmp_path, out_features=1, bias=-0.165))
    assert main(["validate", "--load", "-f", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "spec.outputSchema: exampleInput -> outputs.churn_probability: out of range [0, 1] (got -0.16" in err
    assert "dead letter output_violation" in err
    assert main(["predict", "-f", str(spec), "--input", json.dumps(EXAMPLE)]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dead letter output_violation: model churn 1.0.0: outputs.churn_probability: ")


def test_a_fixed_model_loads_and_predict_prints_the_scorers_result(tmp_path, capsys):
    spec = churn_spec(tmp_path, scripted(tmp_path, out_features=1, bias=-0.165, sigmoid=True))
    assert main(["validate", "--load", "-f", str(spec)]) == 0
    assert "load: ok on cpu" in capsys.readouterr().out
    request = json.dumps({"id": "c-1", "inputs": EXAMPLE, "metadata": {"customer_id": "c9"}})
    assert main(["predict", "-f", str(spec), "--input", request]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result["id"] == "c-1" and result["status"] == "ok" and result["metadata"] == {"customer_id": "c9"}
    assert result["outputs"]["churn_probability"] == pytest.approx(0.4588, abs=1e-3)


def test_predict_reports_an_invalid_request_as_its_dead_letter(capsys):
    rules = str(REPO_ROOT / "examples" / "fraud-rules.yaml")
    assert main(["predict", "-f", rules, "--input", json.dumps({**EXAMPLE, "hour": 30})]) == 4
    assert capsys.readouterr().err.startswith("dead letter schema_violation: inputs.hour: out of range [0, 23]")


def test_admission_never_imports_code_outside_the_allow_list(tmp_path):
    from sie.schemas.spec import load
    from sie.schemas.spec_policy import SpecPolicy
    from sie.workers.load_check import admission_problems

    spec = load(churn_spec(tmp_path, "", outputs=[{"name": "y", "type": "float", "range": [0, 1]}],
                           backend={"type": "python", "callable": "tests.support.scorer_fixtures:echo"}))
    policy = SpecPolicy(allowed_modules=("tests",))
    report = admission_problems(spec, policy)
    assert report.ok and report.skipped and "'tests'" in report.skipped and "allow-list" in report.skipped
    checked = admission_problems(spec, policy, allowed_modules={"tests"})
    assert not checked.ok  # echo reads inputs["x"], which this schema has no field for
    assert checked.problems[0].startswith("load: ")


def _exported(directory: Path, dynamic: bool) -> str:
    import torch

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(len(FIELDS), 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.linear(x))

    x = torch.zeros(2, len(FIELDS))
    shapes = {"x": {0: torch.export.Dim("batch")}} if dynamic else None
    name = f"model-{'dynamic' if dynamic else 'static'}.pt2"
    torch.export.save(torch.export.export(Model(), (x,), dynamic_shapes=shapes), str(directory / name))
    return name


def test_a_pt2_needs_a_dynamic_batch_dimension_and_the_error_says_how(tmp_path, capsys):
    static = churn_spec(tmp_path, _exported(tmp_path, dynamic=False))
    assert main(["validate", "--load", "-f", str(static)]) == 1
    err = capsys.readouterr().err
    assert "Guard failed" in err and "a .pt2 must be exported with a dynamic batch dimension" in err
    dynamic = churn_spec(tmp_path, _exported(tmp_path, dynamic=True))
    assert main(["validate", "--load", "-f", str(dynamic)]) == 0


def _own_package_spec(directory: Path, package_name: str = "churnpkg") -> Path:
    """A python model from the user's own package next to the spec (not the demo's ``models.fraud``)."""
    package = directory / package_name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rules.py").write_text(
        "def score(batch):\n    return [{'churn_probability': 0.25 if row['is_foreign'] else 0.5} for row in batch]\n")
    return churn_spec(directory, "", backend={"type": "python", "callable": f"{package_name}.rules:score"})


@pytest.mark.parametrize("command", ["validate", "predict"])
def test_validate_load_and_predict_honour_the_nodes_allowed_modules(tmp_path, capsys, monkeypatch, command):
    """Issue 28.1: the spec passed the policy check (SIE_ALLOWED_MODULES=churnpkg), then the load refused
    it as 'not in this node's allowed modules (models.fraud)': the backend was built without the policy."""
    spec = _own_package_spec(tmp_path)
    monkeypatch.setenv("SIE_ALLOWED_MODULES", "churnpkg")
    args = (["validate", "--load", "-f", str(spec)] if command == "validate"
            else ["predict", "-f", str(spec), "--input", json.dumps(EXAMPLE)])
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    if command == "validate":
        assert "load: ok on cpu" in out and '"churn_probability": 0.25' in out
    else:
        assert orjson.loads(out)["outputs"] == {"churn_probability": 0.25}


def test_predict_checks_the_spec_against_the_nodes_policy_before_loading_it(tmp_path, capsys):
    """``sie predict`` runs the model's code and opens its files: it checks the spec against this node's
    policy as ``validate`` and a worker do, so an artifact outside the model roots is named, never opened."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    artifact = elsewhere / scripted(elsewhere, out_features=1, bias=0.0, sigmoid=True)
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    spec = churn_spec(spec_dir, str(artifact))
    assert main(["predict", "-f", str(spec), "--input", json.dumps(EXAMPLE)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and "spec.backend.artifact" in captured.err
    assert "model roots" in captured.err or "SIE_MODEL_ROOTS" in captured.err
