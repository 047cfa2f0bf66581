"""Backends: every torch artifact format scores the demo fraud model; pickles are refused without running."""

from __future__ import annotations

import io
import json
import pickle
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import torch

from sie.schemas.spec import load
from sie.workers.backends import (
    BackendConfig,
    BackendError,
    FieldRef,
    InferenceError,
    backend_config_from_spec,
    create_backend,
)
from tests.support.helpers import REPO_ROOT

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

ROOT = REPO_ROOT
FRAUD = ROOT / "examples" / "models" / "fraud"
INPUTS = tuple(
    FieldRef(n, t)
    for n, t in [
        ("amount", "float"),
        ("merchant_risk", "float"),
        ("hour", "int"),
        ("account_age_days", "int"),
        ("is_foreign", "bool"),
        ("tx_count_24h", "int"),
    ]
)
OUTPUTS = (FieldRef("fraud_probability", "float"),)
EXAMPLE = {"amount": 2500.0, "merchant_risk": 0.85, "hour": 3, "account_age_days": 12, "is_foreign": True, "tx_count_24h": 9}
FORMATS = {
    "torchscript": ("fraud_scorer.pt", {}),
    "export": ("fraud_scorer.pt2", {}),
    "safetensors": ("fraud_scorer.safetensors", {"module_class": "models.fraud.model:FraudMLP"}),
}
DEVICES = [
    "cpu",
    pytest.param(
        "cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available on this machine")
    ),
]


def fraud_config(artifact: Path | str = "fraud_scorer.pt", **overrides) -> BackendConfig:
    values = dict(
        type="torch",
        artifact=FRAUD / artifact if isinstance(artifact, str) else artifact,
        input_fields=INPUTS,
        output_fields=OUTPUTS,
        example_input=EXAMPLE,
        device="cpu",
        model_id="fraud-scorer:test",
        search_paths=(ROOT / "examples",),  # where the demo's model module lives (as the spec's directory would)
    )
    values.update(overrides)
    return BackendConfig(**values)


def transactions(n: int) -> list[dict]:
    """Deterministic, varied rows covering the feature ranges."""
    return [
        {
            "amount": float((i * 37) % 5000) + 0.5,
            "merchant_risk": (i % 10) / 10,
            "hour": i % 24,
            "account_age_days": (i * 13) % 2000,
            "is_foreign": i % 3 == 0,
            "tx_count_24h": i % 15,
        }
        for i in range(n)
    ]


def loaded(config: BackendConfig):
    backend = create_backend(config)
    backend.load()
    return backend


def _skip_missing(fmt: str) -> None:
    artifact = FRAUD / FORMATS[fmt][0]
    if fmt == "export" and not artifact.exists():
        pytest.skip(f"{artifact.name} absent: torch.export was unavailable when models/fraud/train.py ran")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_scores_a_batch_like_single_rows(fmt: str, device: str) -> None:
    _skip_missing(fmt)
    artifact, extra = FORMATS[fmt]
    backend = loaded(fraud_config(artifact, device=device, **extra))
    try:
        assert backend.device == device
        [example] = backend.infer([dict(EXAMPLE)])
        assert set(example) == {"fraud_probability"}
        assert 0.5 < example["fraud_probability"] <= 1.0  # the example is a textbook fraud pattern
        rows = transactions(64)
        batch = backend.infer(rows)
        assert len(batch) == 64
        assert all(0.0 <= out["fraud_probability"] <= 1.0 for out in batch)
        singles = [backend.infer([row])[0]["fraud_probability"] for row in rows]
        assert [out["fraud_probability"] for out in batch] == pytest.approx(singles, abs=1e-6)
        assert len({round(out["fraud_probability"], 6) for out in batch}) > 10  # really depends on the inputs
    finally:
        backend.close()


@pytest.mark.parametrize("fmt", ["export", "safetensors"])
def test_all_formats_agree_with_torchscript(fmt: str) -> None:
    _skip_missing(fmt)
    rows = transactions(32)
    reference = [o["fraud_probability"] for o in loaded(fraud_config()).infer(rows)]
    artifact, extra = FORMATS[fmt]
    other = [o["fraud_probability"] for o in loaded(fraud_config(artifact, **extra)).infer(rows)]
    assert other == pytest.approx(reference, abs=1e-6)


def test_two_instances_are_independent() -> None:
    """A scorer hosts two versions during a rollout: closing one must not affect the other."""
    old = loaded(fraud_config())
    new = loaded(fraud_config("fraud_scorer.safetensors", module_class="models.fraud.model:FraudMLP"))
    old.close()
    assert 0.0 <= new.infer([dict(EXAMPLE)])[0]["fraud_probability"] <= 1.0
    with pytest.raises(InferenceError, match="not loaded"):
        old.infer([dict(EXAMPLE)])


def test_empty_batch_returns_empty_list() -> None:
    assert loaded(fraud_config()).infer([]) == []


def test_demo_spec_loads_through_spec_api() -> None:
    spec = load(ROOT / "examples" / "fraud-scorer.yaml")
    backend = loaded(backend_config_from_spec(spec))
    assert backend.infer([dict(spec.example_input)])[0]["fraud_probability"] > 0.5


# --- no unpickling ------------------------------------------------------------------------------------------


class _Boom:
    """Unpickling this creates a marker file: proof that a loader ran pickle code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _marker(tmp_path: Path) -> Path:
    return tmp_path / f"pwned-{uuid.uuid4().hex}"


def test_torch_save_checkpoint_named_pt_is_refused_without_unpickling(tmp_path: Path) -> None:
    marker = _marker(tmp_path)
    checkpoint = tmp_path / "model.pt"
    torch.save({"weights": torch.zeros(3), "payload": _Boom(marker)}, checkpoint)
    with pytest.raises(BackendError, match="never"):
        loaded(fraud_config(checkpoint))
    assert not marker.exists()


def test_raw_pickle_is_refused_without_unpickling(tmp_path: Path) -> None:
    marker = _marker(tmp_path)
    legacy = tmp_path / "model.pt"
    legacy.write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(BackendError, match="raw pickle"):
        loaded(fraud_config(legacy))
    with pytest.raises(BackendError, match="safetensors"):
        loaded(fraud_config(legacy, format="safetensors", module_class="models.fraud.model:FraudMLP"))
    assert not marker.exists()


def _rewrite_pt2(src: Path, dst: Path, edit) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, edit(info.filename, zin.read(info.filename)))


def test_export_archive_with_pickled_payloads_is_refused(tmp_path: Path) -> None:
    _skip_missing("export")
    marker = _marker(tmp_path)

    def pickled_weight(name: str, data: bytes) -> bytes:
        if name.endswith("weights/model_weights_config.json"):
            config = json.loads(data)
            next(iter(config["config"].values()))["use_pickle"] = True
            return json.dumps(config).encode()
        return data

    def evil_sample_inputs(name: str, data: bytes) -> bytes:
        if "/data/sample_inputs/" in name:
            buffer = io.BytesIO()
            torch.save(_Boom(marker), buffer)
            return buffer.getvalue()
        return data

    for edit, why in [(pickled_weight, "pickles"), (evil_sample_inputs, "sample inputs")]:
        bad = tmp_path / f"{edit.__name__}.pt2"
        _rewrite_pt2(FRAUD / "fraud_scorer.pt2", bad, edit)
        with pytest.raises(BackendError, match=why):
            loaded(fraud_config(bad))
    assert not marker.exists()


# --- load-time errors name the thing and the fix --------------------------------------------------------------


def test_wrong_output_arity_is_a_load_error_naming_shapes() -> None:
    two = OUTPUTS + (FieldRef("is_fraud", "bool"),)
    with pytest.raises(BackendError, match=r"output shape \[2\].*2 output field"):
        loaded(fraud_config(output_fields=two))


def test_string_input_field_is_rejected_at_load() -> None:
    fields = INPUTS + (FieldRef("merchant_name", "string"),)
    with pytest.raises(BackendError, match="'merchant_name'.*python backend"):
        loaded(fraud_config(input_fields=fields))


def test_missing_artifact_names_the_path() -> None:
    with pytest.raises(BackendError, match="does-not-exist.pt does not exist"):
        loaded(fraud_config("does-not-exist.pt"))


def test_safetensors_needs_a_matching_module_class() -> None:
    with pytest.raises(BackendError, match="module_class: required"):
        loaded(fraud_config("fraud_scorer.safetensors"))
    with pytest.raises(BackendError, match="do not fit"):
        loaded(fraud_config("fraud_scorer.safetensors", module_class="models.fraud.model:FraudMLP", module_kwargs={"hidden": 8}))


def test_unknown_backend_type_is_refused() -> None:
    with pytest.raises(BackendError, match="'onnx' has no backend"):
        create_backend(BackendConfig(type="onnx"))


def test_multi_output_columns_map_to_typed_fields(tmp_path: Path) -> None:
    class Three(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([x[:, 0] * 0.5, x[:, 0] + 0.4, x[:, 1]], dim=1)

    path = tmp_path / "three.pt"
    torch.jit.script(Three()).save(str(path))
    config = BackendConfig(
        type="torch",
        artifact=path,
        device="cpu",
        input_fields=(FieldRef("a", "float"), FieldRef("flag", "bool")),
        output_fields=(FieldRef("half", "float"), FieldRef("rounded", "int"), FieldRef("flag_out", "bool")),
    )
    backend = loaded(config)  # warm-up with neutral zeros: no example input given
    assert backend.infer([{"a": 3.0, "flag": True}, {"a": 1.0, "flag": False}]) == [
        {"half": 1.5, "rounded": 3, "flag_out": True},
        {"half": 0.5, "rounded": 1, "flag_out": False},
    ]


# --- batch-time errors are InferenceErrors (the scorer dead-letters the batch) ---------------------------------


def test_non_numeric_and_missing_inputs_raise_inference_error() -> None:
    backend = loaded(fraud_config())
    with pytest.raises(InferenceError, match=r"inputs\[1\]\.amount: not a number"):
        backend.infer([dict(EXAMPLE), dict(EXAMPLE, amount="lots")])
    incomplete = dict(EXAMPLE)
    del incomplete["hour"]
    with pytest.raises(InferenceError, match="'hour'"):
        backend.infer([incomplete])


# --- python backend -------------------------------------------------------------------------------------------

RULES_OUT = (FieldRef("risk_score", "float"), FieldRef("reason", "string"))


def python_config(callable_ref: str, **overrides) -> BackendConfig:
    values = dict(type="python", callable=callable_ref, example_input=EXAMPLE, output_fields=RULES_OUT,
                  search_paths=(ROOT / "examples",))
    values.update(overrides)
    return BackendConfig(**values)


def test_python_backend_rules_happy_path() -> None:
    backend = loaded(python_config("models.fraud.rules:score"))
    assert backend.device == "cpu"
    quiet = {"amount": 20.0, "merchant_risk": 0.1, "hour": 14, "account_age_days": 900, "is_foreign": False, "tx_count_24h": 1}
    risky, calm = backend.infer([dict(EXAMPLE), quiet])
    assert calm == {"risk_score": 0.0, "reason": "none"}
    assert 0.5 < risky["risk_score"] <= 1.0
    assert "foreign" in risky["reason"].split(",")


def test_python_rules_spec_loads_through_spec_api() -> None:
    spec = load(ROOT / "examples" / "fraud-rules.yaml")
    backend = loaded(backend_config_from_spec(spec))
    assert backend.infer([dict(spec.example_input)])[0]["risk_score"] > 0.5


@pytest.fixture
def user_module(tmp_path: Path):
    """A throwaway module in a directory NOT on sys.path, imported via search_paths."""
    name = f"usermod_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "def short(inputs):\n    return [{'risk_score': 0.1, 'reason': 'x'} for _ in inputs[:-1]]\n"
        "def fails(inputs):\n    raise ValueError('feature store down')\n"
        "def no_reason(inputs):\n    return [{'risk_score': 0.1} for _ in inputs]\n"
    )
    yield name, tmp_path
    sys.modules.pop(name, None)


def test_python_backend_wrong_length_is_inference_error(user_module) -> None:
    name, where = user_module
    backend = create_backend(python_config(f"{name}:short", search_paths=(where,), allowed_modules=(name,)))
    assert str(where) not in sys.path
    with pytest.raises(BackendError, match="warm-up"):
        backend.load()  # the warm-up already sees 0 outputs for 1 input
    assert str(where) not in sys.path  # the import path was added only for the import
    with pytest.raises(InferenceError, match=rf"{name}:short returned 2 outputs for 3 inputs"):
        backend.infer([dict(EXAMPLE)] * 3)


def test_python_backend_exception_is_inference_error(user_module) -> None:
    name, where = user_module
    backend = create_backend(python_config(f"{name}:fails", search_paths=(where,), allowed_modules=(name,)))
    with pytest.raises(BackendError, match="feature store down"):
        backend.load()
    with pytest.raises(InferenceError, match=rf"{name}:fails raised ValueError: feature store down"):
        backend.infer([dict(EXAMPLE)])


def test_python_backend_checks_output_fields_and_import_errors(user_module) -> None:
    name, where = user_module
    with pytest.raises(BackendError, match=r"returned no \['reason'\]"):
        loaded(python_config(f"{name}:no_reason", search_paths=(where,), allowed_modules=(name,)))
    with pytest.raises(BackendError, match="'package.module:name'"):
        loaded(python_config("models.fraud.rules.score"))
    with pytest.raises(BackendError, match="has no attribute 'nope'"):
        loaded(python_config("models.fraud.rules:nope"))
    with pytest.raises(BackendError, match="cannot import module 'no_such_pkg_sie.x'"):
        loaded(python_config("no_such_pkg_sie.x:score", allowed_modules=("no_such_pkg_sie",)))


@pytest.fixture
def sneaky_module(tmp_path: Path):
    """An allowed module that imports the standard library: its re-exports must still be refused."""
    name = f"sneaky_{uuid.uuid4().hex}"
    marker = tmp_path / "pwned"
    (tmp_path / f"{name}.py").write_text("import os\nfrom subprocess import Popen\n")
    yield name, tmp_path, marker
    sys.modules.pop(name, None)


def test_code_outside_the_allow_list_is_never_imported_or_called(sneaky_module) -> None:
    name, where, marker = sneaky_module
    kwargs = {"args": f"touch {marker}", "shell": True}
    with pytest.raises(BackendError, match="module 'subprocess' is not in this node's allowed modules"):
        loaded(fraud_config("fraud_scorer.safetensors", module_class="subprocess:Popen", module_kwargs=kwargs))
    for ref, why in ((f"{name}:Popen", "is defined in 'subprocess'"), (f"{name}:os.system", "steps into module 'os'"),
                     (f"{name}:__builtins__", "__dunder__")):
        with pytest.raises(BackendError, match=why):
            loaded(fraud_config("fraud_scorer.safetensors", module_class=ref, module_kwargs=kwargs,
                                search_paths=(where,), allowed_modules=(name,)))
        with pytest.raises(BackendError, match=why):
            loaded(python_config(ref, search_paths=(where,), allowed_modules=(name,)))
    assert not marker.exists()
