"""The spec policy (allowed modules, model roots, plain-data maps) and YAML bounds, wherever a spec is read."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from sie.cli import cli
from sie.kernel.settings import Settings
from sie.schemas.spec import InvalidSpec, load, read_yaml_documents
from sie.schemas.spec_models import ModelService
from sie.schemas.spec_policy import SpecPolicy, check_plain_data, module_allowed
from tests.support.helpers import EXAMPLES

POPEN = """\
name: evil
version: "1"
backend:
  type: torch
  format: safetensors
  artifact: {artifact}
  moduleClass: "subprocess:Popen"
  moduleKwargs: {{args: "touch {marker}", shell: true}}
"""


def _bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_module_prefixes_match_whole_names() -> None:
    assert module_allowed("models.fraud", ["models.fraud"])
    assert module_allowed("models.fraud.rules", ["models.fraud"])
    assert not module_allowed("models.fraudster", ["models.fraud"])
    assert not module_allowed("subprocess", ["models.fraud"])


@pytest.mark.parametrize("value, error", [
    ("os", "standard library"), ("subprocess,models.fraud", "standard library"), ("", None),
    ("sie.workers", "SIE itself"), ("bad name", "not a dotted module name"), ("acme.models, models.fraud", None),
])
def test_allowed_modules_setting(value: str, error: str | None) -> None:
    if error is None:
        Settings(allowed_modules=value)
    else:
        with pytest.raises(ValueError, match=error):
            Settings(allowed_modules=value)


def test_sie_validate_refuses_the_popen_spec_naming_the_field(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "w.safetensors").write_bytes(b"x")
    spec = tmp_path / "evil.yaml"
    spec.write_text(POPEN.format(artifact="w.safetensors", marker=marker))
    result = CliRunner().invoke(cli, ["validate", "-f", str(spec)], obj=None, catch_exceptions=True)
    assert result.exit_code != 0
    error = str(result.exception)
    assert "spec.backend.moduleClass: module 'subprocess' is not in this node's allowed modules" in error
    assert "spec.backend.artifact" not in error  # next to the spec file: inside a root here
    assert not marker.exists()


def test_artifacts_must_resolve_under_a_model_root(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    inside = root / "m.pt"
    inside.write_bytes(b"x")
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes(b"x")
    (root / "link.pt").symlink_to(outside)
    policy = SpecPolicy(("models.fraud",), (root.resolve(),))
    assert policy.check_path(inside, "a") == []
    assert "outside this node's model roots" in policy.check_path(outside, "a")[0]
    assert "outside this node's model roots" in policy.check_path(root / "link.pt", "a")[0]  # symlinks followed
    assert "must not contain '..'" in policy.check_path(f"{root}/../elsewhere.pt", "a")[0]
    assert "must be an absolute path" in policy.check_path("m.pt", "a")[0]


def test_the_default_roots_let_the_demo_run() -> None:
    settings = Settings()
    for name in ("fraud-rules.yaml", "fraud-scorer.yaml"):
        assert load(EXAMPLES / name, settings, many=True)
    policy = SpecPolicy.from_settings(settings)  # a node reading the demo's specs back from Kafka
    for name in ("fraud-rules.yaml", "fraud-scorer.yaml"):
        for spec in load(EXAMPLES / name, settings, many=True):
            assert policy.check(ModelService.from_document(spec.to_document())) == []
    safetensors = EXAMPLES / "models" / "fraud" / "fraud_scorer.safetensors"
    doc = {"name": "s", "version": "1", "backend": {"type": "torch", "artifact": str(safetensors),
                                                   "moduleClass": "models.fraud.model:FraudMLP"}}
    assert policy.check(load(doc)) == []


@pytest.mark.parametrize("value, reason", [
    ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, "nested deeper than 8 levels"),
    ({"x": "y" * 20_000}, "more than 16384"),
    ({"x": float("nan")}, "finite number"),
    ({"x": {1: 2}}, "keys must be strings"),
    ({"x": {1, 2}}, "must be plain data"),
])
def test_module_kwargs_must_be_small_plain_data(value: dict, reason: str) -> None:
    problems = check_plain_data(value, "spec.backend.moduleKwargs", 16 * 1024)
    assert problems and reason in problems[0] and problems[0].startswith("spec.backend.moduleKwargs")


def test_deep_data_never_exhausts_the_stack() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert "nested deeper" in check_plain_data({"x": deep}, "f", 1 << 30)[0]


def test_the_alias_bomb_is_refused_in_milliseconds_with_bounded_memory() -> None:
    bomb = _bomb()  # 9 levels of 9 aliases: 9^9 (387 million) strings if expanded
    assert len(bomb) < 1100
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidSpec, match="aliases are not allowed"):
            read_yaml_documents(bomb, "bomb")
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.1, f"{elapsed * 1000:.1f} ms"
    assert peak < 1 << 20, f"peak {peak} bytes"


@pytest.mark.parametrize("text, reason", [
    ("[" * 100 + "]" * 100, "nested deeper than 64"),
    ("x: " + "y" * (1 << 20), "more than 1048576"),
    ("a: &x 1\nb: *x\n", "aliases are not allowed"),
    ("base: &b {cpu: 1}\nother:\n  <<: *b\n", "aliases are not allowed"),
])
def test_yaml_bounds(text: str, reason: str) -> None:
    with pytest.raises(InvalidSpec, match=reason):
        read_yaml_documents(text, "doc")


def test_anchors_without_aliases_still_parse() -> None:
    assert read_yaml_documents("a: &x 1\n", "doc") == [{"a": 1}]


def test_a_spec_from_kafka_is_checked_exactly_as_the_api_does(tmp_path: Path) -> None:
    """The control plane's state: a spec written to the topic directly is refused with the API's reasons."""
    from sie.control.reconcile.records import ClusterState

    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    doc = {"name": "evil", "version": "1", "backend": {"type": "torch", "artifact": str(weights), "format": "safetensors",
                                                      "moduleClass": "models.fraud.model:FraudMLP"}}
    spec = load(doc).model_copy(update={"backend": load(doc).backend.model_copy(
        update={"module_class": "subprocess:Popen", "module_kwargs": {"args": "id", "shell": True}})})
    policy = SpecPolicy.from_settings(Settings(cache_dir=tmp_path / "c"))
    state = ClusterState(spec_policy=policy)
    state.apply_spec("evil", {"spec_json": json.dumps(spec.to_document()), "deleted": False})
    assert "evil" not in state.specs
    assert state.spec_errors["evil"].startswith("spec refused: spec.backend.moduleClass: module 'subprocess'")
    assert "spec.backend.artifact" in state.spec_errors["evil"]


def test_an_sglang_spec_cannot_choose_the_program_its_node_runs() -> None:
    from tests.support.llm_fixtures import llm_spec_doc

    def problems(policy: SpecPolicy, **config: object) -> list[str]:
        return policy.check(load(llm_spec_doc([], **config)))

    default = SpecPolicy()
    assert problems(default) == []  # no server_entry: `python -m sglang.launch_server`
    (refused,) = problems(default, server_entry=["/bin/sh", "-c", "touch /tmp/owned"])
    assert refused.startswith("spec.backend.config.server_entry: ") and "SIE_SGLANG_SERVER_ENTRIES" in refused
    with pytest.raises(InvalidSpec, match=r"spec.backend.config.server_entry: Input should be a valid list"):
        problems(default, server_entry="/bin/sh")  # the backend config's schema refuses it before the policy
    allowing = SpecPolicy.from_settings(Settings(sglang_server_entries=["/opt/sglang/bin/python  -m 'sglang.launch_server'"]))
    assert problems(allowing, server_entry=["/opt/sglang/bin/python", "-m", "sglang.launch_server"]) == []
    assert problems(allowing, server_entry=["/opt/sglang/bin/python", "-c", "print(1)"]) != []

    (remote,) = problems(default, extra_args=["--context-length", "4096", "--trust-remote-code"])
    assert remote.startswith("spec.backend.config.extra_args: --trust-remote-code") and "SIE_SGLANG_TRUST_REMOTE_CODE" in remote
    trusting = SpecPolicy.from_settings(Settings(sglang_trust_remote_code=True))
    assert problems(trusting, extra_args=["--trust-remote-code"]) == []
