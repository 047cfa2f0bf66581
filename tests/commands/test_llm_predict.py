"""`sie predict` and `sie validate --load` for an LLM spec naming running servers (issue 41 item 4): one real
request through the window's own path and configured protocol (streamed here, so the event-stream reader is in
it), against the fake LLM server on real HTTP.  Before, predict ignored the endpoints and tried to launch SGLang
("exited with code 1" and no reason) and validate --load skipped the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sie.cli import main
from tests.fakes import fake_llm_server
from tests.support.llm_fixtures import free_port, llm_spec_doc


@pytest.fixture(scope="module")
def server():
    srv = fake_llm_server.serve(fake_llm_server.parse(["--slots", "4", "--mean-s", "0.05", "--p99-s", "0.1",
                                                       "--served-model-name", "tiny"]))
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch):
    monkeypatch.setenv("SIE_SGLANG_ENDPOINTS", "127.0.0.1")


def _spec(tmp_path: Path, url: str, **config) -> Path:
    doc = llm_spec_doc([url], name="asker", protocol="openai-completions", stream=True, served_model_name="tiny",
                       **config)
    path = tmp_path / "asker.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_predict_sends_one_request_through_the_configured_protocol(server, tmp_path, capsys):
    assert main(["predict", "-f", str(_spec(tmp_path, server)), "--input", json.dumps({"question": "why?"})]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "ok" and doc["model"] == "asker" and isinstance(doc["outputs"]["answer"], str)
    assert doc["usage"]["completion_tokens"] == doc["outputs"]["completion_tokens"] > 0
    assert doc["timings"]["first_token_ms"] >= 0 and doc["timings"]["batch_size"] == 1  # streamed: timed


def test_validate_load_checks_one_real_request(server, tmp_path, capsys):
    assert main(["validate", "--load", "-f", str(_spec(tmp_path, server))]) == 0
    out = capsys.readouterr().out
    assert f"note: one request answered by {server} in" in out and "load: ok" in out and '"answer"' in out


def test_a_wrong_served_name_or_a_dead_endpoint_is_named_not_held(server, tmp_path, capsys):
    wrong = _spec(tmp_path, server, **{})
    wrong.write_text(wrong.read_text().replace("served_model_name: tiny", "served_model_name: other"))
    assert main(["validate", "--load", "-f", str(wrong)]) == 1
    err = capsys.readouterr().err
    assert f"spec.backend.config.endpoints: no endpoint answered: {server}: HTTP 404 on /v1/completions" in err
    assert "does not exist" in err
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["predict", "-f", str(_spec(tmp_path, dead)), "--input", json.dumps({"question": "x"})]) == 4
    err = capsys.readouterr().err
    assert f"dead letter unreachable: no endpoint answered: {dead}: ConnectError" in err


def test_a_spec_whose_replica_launches_its_server_is_loaded_by_validate_and_predict(tmp_path, monkeypatch, capsys):
    """No endpoints, a ``server_entry`` the node allows (here the fake server; vLLM's entry on a real node): the
    server is launched as the agent's worker launches it, proven by a real generation, then asked."""
    import shlex
    import sys

    from tests.support.llm_fixtures import FAKE_SERVER

    entry = [sys.executable, str(FAKE_SERVER), "--slots", "2", "--mean-s", "0.02", "--p99-s", "0.05"]
    monkeypatch.setenv("SIE_SGLANG_SERVER_ENTRIES", shlex.join(entry))
    doc = llm_spec_doc([], name="launched", protocol="openai-completions")
    del doc["spec"]["backend"]["config"]["endpoints"]
    doc["spec"]["backend"]["config"]["server_entry"] = entry
    path = tmp_path / "launched.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert main(["validate", "--load", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert "load: ok" in out and '"answer": "echo: ' in out
    assert main(["predict", "-f", str(path), "--input", json.dumps({"question": "hello there"})]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "ok" and result["outputs"]["answer"].startswith("echo: ")
