"""Which stage a worker runs (issue 12): an sglang replica's own server goes through the LLM window, with the
server first among the endpoints at its ``--max-running-requests``; other backends keep the batch scorer.
No broker, no server: the stage entry points are replaced by recorders."""

from __future__ import annotations

import io
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from sie.kernel.errors import ConfigError
from sie.schemas.spec import load
from sie.schemas.worker_status import StatusWriter
from sie.streams.llm.config import LLMConfig, launched_concurrency, serves_through_window, with_launched_server
from sie.streams.scorer.loop import ScorerSummary
from sie.workers import worker_main
from sie.workers.readiness import ReadinessResult
from tests.support.helpers import REPO_ROOT, wait_until
from tests.support.llm_fixtures import llm_spec

OWN = "http://127.0.0.1:40001"


def _launched_spec(**config: Any) -> Any:
    spec = llm_spec(["http://x"], **config)
    cfg = {k: v for k, v in spec.backend.config.items() if k != "endpoints"}
    return spec.model_copy(update={"backend": spec.backend.model_copy(update={"config": cfg})})


# --- the rule and the window's endpoints -------------------------------------------------------------------
def test_the_rule_takes_every_sglang_spec_once_a_server_answers_for_it():
    launched = _launched_spec()
    assert not serves_through_window(launched)  # nothing named and nothing launched: no endpoint to send to
    assert serves_through_window(launched, launched_server=True)
    assert serves_through_window(llm_spec(["http://x"]))  # the servers it names (sie score, a worker)
    rules = load(REPO_ROOT / "examples" / "fraud-rules.yaml")
    assert not serves_through_window(rules, launched_server=True)  # not an LLM: the batch scorer


@pytest.mark.parametrize(("cfg", "c"), [
    ({}, 16),
    ({"max_concurrency": 4}, 4),
    ({"max_concurrency": 4, "extra_args": ["--max-running-requests", "24"]}, 24),
    ({"extra_args": ["--chunked-prefill-size", "512", "--max-running-requests=12"]}, 12),
])
def test_the_windows_c_is_the_servers_max_running_requests(cfg, c):
    assert launched_concurrency(cfg) == c


@pytest.mark.parametrize("args", [["--max-running-requests", "0"], ["--max-running-requests=many"]])
def test_an_unusable_max_running_requests_is_refused_by_name(args):
    with pytest.raises(ConfigError, match="extra_args: --max-running-requests must be a whole number"):
        launched_concurrency({"extra_args": args})


def test_the_own_server_comes_first_and_the_named_endpoints_follow():
    cfg = {"extra_args": ["--max-running-requests", "32"], "max_concurrency": 8,
           "endpoints": ["http://a:1", {"url": "http://b:2", "concurrency": 3}], "protocol": "sglang"}
    llm = LLMConfig.from_backend_config(with_launched_server(cfg, OWN))
    assert [(e[0], e[1]) for e in llm.endpoints] == [(OWN, 32), ("http://a:1", 8), ("http://b:2", 3)]
    only = LLMConfig.from_backend_config(with_launched_server({"max_concurrency": 5}, OWN))
    assert [(e[0], e[1]) for e in only.endpoints] == [(OWN, 5)] and only.capacity == 5
    served = with_launched_server({"server_url": "http://c:3"}, OWN)
    assert "server_url" not in served and served["endpoints"][1:] == ["http://c:3"]


def test_the_window_asks_for_the_model_by_the_name_the_launcher_serves_it_under():
    """The launcher starts the server with --served-model-name <spec name> (or the spec's served_model_name);
    an OpenAI-compatible server refuses any other "model" (vLLM: 404), so the window sends that name."""
    assert with_launched_server({}, OWN, "llm-x")["served_model_name"] == "llm-x"
    assert with_launched_server({"served_model_name": "qwen"}, OWN, "llm-x")["served_model_name"] == "qwen"


def test_run_llm_scorer_puts_the_launched_server_in_the_pool(monkeypatch):
    from sie.streams.llm import stage

    seen: list[LLMConfig] = []
    config = SimpleNamespace(spec=_launched_spec(extra_args=["--max-running-requests", "6"]))
    backend_configs: list[dict] = []
    monkeypatch.setattr(stage, "LLMScorer", lambda cfg, llm, **kw: SimpleNamespace(
        llm=llm, run=lambda stop, on_ready=None: seen.append(llm) or backend_configs.append(kw["backend_config"])
        or "done"))
    assert stage.run_llm_scorer(config, threading.Event(), launched_url=OWN) == "done"  # type: ignore[arg-type]
    assert [(e[0], e[1]) for e in seen[0].endpoints] == [(OWN, 6)]
    assert backend_configs[0]["served_model_name"] == config.spec.name  # what the launcher serves it as


# --- the worker's choice ---------------------------------------------------------------------------------
class _Backend:
    def __init__(self, launched_url: str | None) -> None:
        self.launched_url = launched_url
        self.closed = False

    def fatal_error(self) -> str | None:
        return None

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise AssertionError("the window never infers through the batch backend")

    def close(self) -> None:
        self.closed = True


def _run_worker(monkeypatch, spec: Any, backend: _Backend, tmp_path) -> tuple[int, list[dict[str, Any]], dict]:
    import signal

    import sie.kernel.admin
    import sie.streams.llm.stage
    import sie.streams.scorer.rollout

    calls: dict[str, Any] = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(worker_main, "read_spec_file", lambda path: spec)
    monkeypatch.setattr(worker_main, "check_spec", lambda *a: None)
    monkeypatch.setattr(worker_main, "load_proven", lambda s, c: (backend, ReadinessResult({"answer": "x"}, 1.5)))
    monkeypatch.setattr(worker_main, "_backend_config", lambda *a: None)
    monkeypatch.setattr(sie.kernel.admin, "ensure_model_topics", lambda *a: None)
    stream = io.StringIO()
    status = StatusWriter(stream)

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    scorer = SimpleNamespace(metrics=SimpleNamespace(port=9123, lag=lambda: 4, recent_p99=lambda: 0.25, outage=lambda: None),
                             summary=lambda: ScorerSummary(3, 7, 7, 0, 0, 0, 0))

    def window(config, stop, on_ready=None, launched_url=None):
        calls["window"] = (config.instance, launched_url)
        on_ready(scorer)
        wait_until(lambda: any(e["event"] == "progress" for e in events()), 10, message="a progress line")
        return scorer.summary()

    def build(config, load_version, versions=None):
        return SimpleNamespace(instance=config.instance)

    def batch(built, stop, on_ready=None):
        calls["batch"] = built.instance
        return ScorerSummary(0, 0, 0, 0, 0, 0, 0)

    monkeypatch.setattr(sie.streams.llm.stage, "run_llm_scorer", window)
    monkeypatch.setattr(sie.streams.scorer.rollout, "build_rollout_scorer", build)
    monkeypatch.setattr(sie.streams.scorer.rollout, "serve_rollout_scorer", batch)
    args = worker_main.parse_args(["--spec-file", str(tmp_path / "spec.json"), "--replica-id", "llm-0",
                                   "--progress-interval", "0.01"])
    return worker_main.run_worker(args, status), events(), calls


def test_a_worker_serves_its_own_sglang_server_through_the_window(monkeypatch, tmp_path):
    backend = _Backend(OWN)
    code, events, calls = _run_worker(monkeypatch, _launched_spec(), backend, tmp_path)
    assert code == 0 and calls == {"window": ("llm-0", OWN)} and backend.closed
    kinds = [e["event"] for e in events]
    assert kinds[0] == "loading" and kinds[1] == "ready" and kinds[-1] == "stopped"
    assert events[1]["metrics_port"] == 9123 and events[1]["outputs"] == {"answer": "x"}
    progress = next(e for e in events if e["event"] == "progress")
    assert progress == {"event": "progress", "records": 7, "rate": None, "lag": 4, "p99_ms": 250.0, "outage": None}
    assert events[-1]["records"] == 7


def test_a_worker_without_a_launched_server_or_endpoints_keeps_the_batch_scorer(monkeypatch, tmp_path):
    spec = load(REPO_ROOT / "examples" / "fraud-rules.yaml")
    code, _events, calls = _run_worker(monkeypatch, spec, _Backend(None), tmp_path)
    assert code == 0 and calls == {"batch": "llm-0"}
