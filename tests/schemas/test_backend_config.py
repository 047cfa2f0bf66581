"""The strict schema of ``spec.backend.config`` (issue 41 items 2 and 3): an unknown or misplaced key is a spec
error naming it and the key it probably meant; a bad port is a spec error, not a traceback; docs/llm.md lists
every key with the default the schema declares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from sie.cli import main
from sie.schemas.backend_config import (
    SGLANG_SAMPLING_PARAMS,
    CallerLimits,
    EndpointConfig,
    QuotaConfig,
    SGLangConfig,
    TorchConfig,
    check_backend_config,
)
from sie.schemas.spec import InvalidSpec, load
from tests.support.llm_fixtures import llm_spec_doc

REPO = Path(__file__).resolve().parents[2]


def _problems(**config: object) -> list[str]:
    doc = llm_spec_doc(["http://127.0.0.1:8000"], protocol="openai-completions")
    doc["spec"]["backend"]["config"].update(config)
    try:
        load(doc)
    except InvalidSpec as exc:
        return list(exc.problems)
    return []


def test_the_issue_s_typos_are_spec_errors_naming_the_key_and_the_likely_one():
    assert _problems(max_new_tokens=8) == [
        "spec.backend.config.max_new_tokens: unknown key; did you mean sampling_params.max_new_tokens?"]
    assert _problems(protocl="openai-completions") == ["spec.backend.config.protocl: unknown key; did you mean protocol?"]
    assert _problems(tokens_per_s=5) == ["spec.backend.config.tokens_per_s: unknown key; did you mean quotas.tokens_per_s?"]
    assert _problems(quotas={"policy": "delay", "defer_aftr_s": 3}) == [
        "spec.backend.config.quotas.defer_aftr_s: unknown key; did you mean defer_after_s?"]
    (bad,) = _problems(endpoints=[{"url": "http://h:1", "concurency": 4}])
    assert bad == "spec.backend.config.endpoints[0].concurency: unknown key; did you mean concurrency?"
    (bad,) = _problems(director={"hot_queu": 3})
    assert bad == "spec.backend.config.director.hot_queu: unknown key; did you mean hot_queue?"
    # the OpenAI protocols send only max_new_tokens and temperature from sampling_params
    (bad,) = _problems(sampling_params={"max_new_tokens": 8, "top_p": 0.9})
    assert bad.startswith("spec.backend.config.sampling_params.top_p: protocol openai-completions sends only")
    assert "extra_body" in bad
    assert _problems(sampling_params={"max_new_tokens": 8}, extra_body={"top_p": 0.9}) == []
    # types are strict: a string where a number belongs is refused, not read as 0
    (bad,) = _problems(max_concurrency="8")
    assert bad.startswith("spec.backend.config.max_concurrency: Input should be a valid integer")


def test_sglang_sampling_params_are_sglang_s_fields():
    assert check_backend_config("sglang", {"sampling_params": {"max_new_tokens": 8, "top_p": 0.9}}) == []
    (bad,) = check_backend_config("sglang", {"sampling_params": {"max_new_token": 8}})
    assert bad == ("sampling_params.max_new_token", "not a field of SGLang's SamplingParams; did you mean max_new_tokens?")


def test_every_backend_type_is_strict():
    assert check_backend_config("torch", {"threads": 2}) == []
    assert check_backend_config("torch", {"thread": 2}) == [("thread", "unknown key; did you mean threads?")]
    assert check_backend_config("python", {"threads": 1}) == [("threads", "unknown key")]


def test_sie_validate_refuses_the_issue_s_spec_without_a_traceback(tmp_path, capsys):
    doc = llm_spec_doc(["http://127.0.0.1:80011"], protocol="openai-completions", max_new_tokens=8, protocl="x")
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    code = main(["validate", "-f", str(path)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "spec.backend.config.endpoints[0]: port out of range 1-65535" in err
    assert "spec.backend.config.max_new_tokens: unknown key; did you mean sampling_params.max_new_tokens?" in err
    assert "spec.backend.config.protocl: unknown key; did you mean protocol?" in err


def test_the_sampling_params_list_is_sglang_s_pinned_contract():
    contract = json.loads((REPO / "tests" / "fixtures" / "sglang_contract.json").read_text())
    assert set(contract["sampling_params"]) == SGLANG_SAMPLING_PARAMS


def _render(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _tables(text: str) -> list[dict[str, str]]:
    """The docs' key tables: each a mapping key -> default cell, in order."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("| key | default | meaning |"):
            current = {}
            tables.append(current)
        elif current is not None and (m := re.match(r"\| `(\w+)` \| ([^|]+) \|", line)):
            current[m.group(1)] = m.group(2).strip().strip("`")
        elif current is not None and not line.startswith("|"):
            current = None
    return tables


def test_docs_list_every_key_with_the_schema_s_default():
    tables = _tables((REPO / "docs" / "llm.md").read_text(encoding="utf-8"))
    for model, table in zip((SGLangConfig, EndpointConfig, QuotaConfig, CallerLimits), tables, strict=True):
        assert list(table) == list(model.model_fields), model.__name__
        for name, field in model.model_fields.items():
            if field.is_required():
                assert table[name] == "(required)"
            else:
                assert table[name] == _render(field.get_default(call_default_factory=True)), (model.__name__, name)
    backends = (REPO / "docs" / "backends.md").read_text(encoding="utf-8")
    assert list(TorchConfig.model_fields) == ["threads"] and "`backend.config.threads`" in backends


def test_the_yaml_examples_in_docs_llm_pass_the_schema():
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "llm.md").read_text(encoding="utf-8"), re.S)
    assert blocks
    for block in blocks:
        doc = yaml.safe_load(block)
        assert check_backend_config("sglang", doc["backend"]["config"] if "backend" in doc else doc) == [], block
