"""`sie get replicas|models|nodes` filter and page: ``--model``/``--node``/``--state``, ``--phase``, ``--status``,
``--limit N`` and ``--after NAME``, through a served control API (uvicorn on loopback: the control plane filters and
pages), against a control plane of a release before (it answers everything: the CLI filters and pages), and from
Kafka (the read faked as in test_get_replicas.py).  Following stderr's "more:" line walks every page once, in
order; bad values are usage errors naming the option.  And the CLI's start-up imports no web stack, scorer or
Kafka client for ``sie --help`` and ``sie get ... --help``."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sie.cli import main
from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.schemas.replica_state import ReplicaState
from tests.support.helpers import VIEWER_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import echo_spec_doc

NOW_S = 1_796_000_000.0
MODELS = {"a": 11, "a-1": 2, "fraud": 3}
NODES = ("gpu-1", "gpu-2", "cpu-1")
STATES = (ReplicaState.READY, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.FAILED)


def _statuses() -> dict[str, ModelStatus]:
    out = {}
    for name, count in MODELS.items():
        views = tuple(ReplicaView(f"{name}-{k}", name, "1.0.0", NODES[k % 3], (), 0, STATES[k % 4]) for k in range(count))
        out[name] = ModelStatus(name, "1.0.0", "P1", "scoring", "Degraded" if name == "a-1" else "Ready", None, count,
                                count, views)
    return out


def _replicas() -> list[dict[str, Any]]:
    return sorted((r.to_record() for s in _statuses().values() for r in s.replicas), key=lambda r: r["replica_id"])


@pytest.fixture()
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A control API over a fabricated state, served by uvicorn on a loopback port; the requests' paths+queries."""
    import time

    from sie.control.api.auth import TokenStore
    from sie.control.api.routes import create_app
    from sie.control.api.server import ApiServer
    from sie.control.service import ControlService
    from sie.kernel.settings import Settings
    from sie.schemas.spec import load

    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache"))
    service = ControlService(settings, http_port=None)
    now = time.time()
    for node in NODES:
        service.state.apply_node(node, {"cpu_count": 8, "memory_mb": 1000})
    for node in ("gpu-1", "cpu-1"):  # gpu-2 never sent a heartbeat: offline
        service.state.apply_heartbeat({"node": node, "ts_ms": int(now * 1000), "seq": 1, "gpus": [], "replicas": []},
                                      seen_at=now + 3600)
    for name in MODELS:
        service.state.specs[name] = load(echo_spec_doc(name), origin="test", topic_prefix=settings.topic_prefix)
    service.controller.statuses = _statuses()
    app = create_app(service, TokenStore(settings), (), SimpleNamespace(record=lambda *_a: None))
    seen: list[str] = []

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        seen.append(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return await call_next(request)

    server = ApiServer(app, "127.0.0.1", 0).start()
    monkeypatch.setenv("SIE_API_TOKEN", VIEWER_TOKEN)
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{server.port}", seen=seen)
    finally:
        server.stop()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _walk(capsys: pytest.CaptureFixture[str], *args: str) -> list[list[dict[str, Any]]]:
    """Every page of ``sie *args -o json``, following the command line stderr names for the next one."""
    pages = []
    command = [*args, "-o", "json"]
    for _ in range(100):
        code, out, err = _run(capsys, *command)
        assert code == 0, err
        pages.append(json.loads(out))
        more = [line for line in err.splitlines() if line.startswith("(more: sie ")]
        if not more:
            return pages
        command = shlex.split(more[0].removeprefix("(more: sie ").removesuffix(")"))
        assert "--output" in command or "-o" in command
        command = [c for c in command if c not in ("--output", "json")] + ["-o", "json"]
    raise AssertionError("the pages never ended")


def test_replicas_through_the_api_filtered_by_the_control_plane(control: SimpleNamespace,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    every = _replicas()
    code, out, _ = _run(capsys, "get", "replicas", "--control-url", control.url, "-o", "json")
    assert code == 0 and json.loads(out) == every  # everything, as before
    for options, keep in ((("--model", "a-1"), lambda r: r["model"] == "a-1"),
                          (("--node", "gpu-2"), lambda r: r["node"] == "gpu-2"),
                          (("--state", "FAILED"), lambda r: r["state"] == "FAILED"),
                          (("--model", "a", "--node", "cpu-1", "--state", "STARTING"),
                           lambda r: (r["model"], r["node"], r["state"]) == ("a", "cpu-1", "STARTING"))):
        code, out, _ = _run(capsys, "get", "replicas", "--control-url", control.url, *options, "-o", "json")
        assert code == 0 and json.loads(out) == [r for r in every if keep(r)] != [], options
    assert "/v1/replicas?model=a&node=cpu-1&state=STARTING" in control.seen  # the control plane filtered
    code, out, _ = _run(capsys, "get", "replicas", "--control-url", control.url, "--model", "nope")
    assert code == 0 and "(no replicas match)" in out


def test_replica_pages_through_the_api_cover_the_list_once(control: SimpleNamespace,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    every = _replicas()
    pages = _walk(capsys, "get", "replicas", "--control-url", control.url, "--limit", "4")
    assert [len(p) for p in pages] == [4, 4, 4, 4]  # 16 replicas
    assert [r for p in pages for r in p] == every
    assert any("limit=4&after=" in path for path in control.seen)  # the control plane paged
    pages = _walk(capsys, "get", "replicas", "--control-url", control.url, "--state", "READY", "--limit", "3")
    assert [r for p in pages for r in p] == [r for r in every if r["state"] == "READY"]
    code, out, err = _run(capsys, "get", "replicas", "--control-url", control.url, "--limit", "5")
    assert code == 0 and len(out.splitlines()) == 6  # the table: header + one page
    assert f"(more: sie get replicas --control-url {control.url} --limit 5 --after {every[4]['replica_id']})" in err


def test_models_and_nodes_through_the_api(control: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    pages = _walk(capsys, "get", "models", "--control-url", control.url, "--limit", "2")
    assert [[m["name"] for m in p] for p in pages] == [["a", "a-1"], ["fraud"]]
    code, out, _ = _run(capsys, "get", "models", "--control-url", control.url, "--phase", "Degraded", "-o", "json")
    assert code == 0 and [m["name"] for m in json.loads(out)] == ["a-1"]
    code, out, _ = _run(capsys, "get", "models", "--control-url", control.url, "--model", "fraud")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["NAME", "fraud"]
    code, out, _ = _run(capsys, "get", "nodes", "--control-url", control.url, "--status", "offline", "-o", "json")
    assert code == 0 and [n["name"] for n in json.loads(out)] == ["gpu-2"]
    pages = _walk(capsys, "get", "nodes", "--control-url", control.url, "--status", "online", "--limit", "1")
    assert [[n["name"] for n in p] for p in pages] == [["cpu-1"], ["gpu-1"]]
    assert "/v1/nodes?status=online&limit=1&after=cpu-1" in control.seen


def test_a_control_plane_of_a_release_before_is_filtered_and_paged_here(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Its list routes ignore the query and answer everything, without ``next``."""
    from sie.commands import _api

    every = _replicas()
    nodes = [{"name": n, "status": "offline" if n == "gpu-2" else "online"} for n in sorted(NODES)]
    models = [{"name": n, "phase": s.phase} for n, s in sorted(_statuses().items())]
    answers = {"/v1/replicas": {"replicas": every}, "/v1/nodes": {"nodes": nodes}, "/v1/models": {"models": models}}
    monkeypatch.setattr(_api.ControlApi, "get", lambda self, path: answers[path.split("?")[0]])
    monkeypatch.setenv("SIE_API_TOKEN", VIEWER_TOKEN)
    url = "http://127.0.0.1:9"
    pages = _walk(capsys, "get", "replicas", "--control-url", url, "--model", "a", "--limit", "5")
    assert [r for p in pages for r in p] == [r for r in every if r["model"] == "a"] and len(pages) == 3
    pages = _walk(capsys, "get", "models", "--control-url", url, "--phase", "Ready", "--limit", "1")
    assert [[m["name"] for m in p] for p in pages] == [["a"], ["fraud"]]
    code, out, _ = _run(capsys, "get", "models", "--control-url", url, "--model", "fraud", "-o", "json")
    assert code == 0 and json.loads(out) == [{"name": "fraud", "phase": "Ready"}]
    code, out, _ = _run(capsys, "get", "nodes", "--control-url", url, "--status", "offline", "-o", "json")
    assert code == 0 and json.loads(out) == [{"name": "gpu-2", "status": "offline"}]


def test_from_kafka_the_cli_filters_and_pages(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from sie.commands import cluster

    every = _replicas()
    statuses = [s.to_record() for _n, s in sorted(_statuses().items())]
    monkeypatch.setattr(cluster, "statuses_json", lambda *a, **k: (statuses, None))
    nodes = [{"name": n, "status": "offline" if n == "gpu-2" else "online"} for n in sorted(NODES)]
    monkeypatch.setattr(cluster, "nodes_json", lambda *a, **k: nodes)
    code, out, _ = _run(capsys, "get", "replicas", "-o", "json")
    assert code == 0 and json.loads(out) == every
    code, out, _ = _run(capsys, "get", "replicas", "--model", "a", "--state", "READY", "-o", "json")
    assert code == 0 and json.loads(out) == [r for r in every if r["model"] == "a" and r["state"] == "READY"]
    pages = _walk(capsys, "get", "replicas", "--node", "gpu-1", "--limit", "2")
    assert [r for p in pages for r in p] == [r for r in every if r["node"] == "gpu-1"] and len(pages) == 3
    pages = _walk(capsys, "get", "nodes", "--limit", "2")
    assert [[n["name"] for n in p] for p in pages] == [["cpu-1", "gpu-1"], ["gpu-2"]]


@pytest.mark.parametrize(("args", "says"), [
    (("get", "replicas", "--limit", "0"), "--limit"),
    (("get", "replicas", "--limit", "10001"), "--limit"),
    (("get", "replicas", "--state", "RUNNING"), "'RUNNING' is not one of"),
    (("get", "replicas", "--model", "Fraud"), "lowercase"),
    (("get", "replicas", "--node", "a/b"), "a node name"),
    (("get", "replicas", "--after", "../x"), "no '/'"),
    (("get", "models", "--phase", "Sleeping"), "'Sleeping' is not one of"),
    (("get", "models", "--after", "UP"), "lowercase"),
    (("get", "nodes", "--status", "up"), "'up' is not one of"),
])
def test_a_bad_option_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                                 says: str) -> None:
    code, _out, err = _run(capsys, *args)
    assert code == 2 and says in err, err
    option = next(a for a in args if a.startswith("--"))
    assert option in err, err


#: what a listing or a read of the API never needs at start-up
HEAVY = ("numpy", "confluent_kafka", "prometheus_client", "fastapi", "starlette", "uvicorn", "torch",
         "sie.streams.scorer", "sie.control.reconcile")


@pytest.mark.parametrize("args", [["--help"], ["get", "replicas", "--help"], ["get", "models", "--help"],
                                  ["get", "nodes", "--help"]])
def test_the_cli_starts_without_the_web_stack_the_scorer_or_kafka(args: list[str]) -> None:
    code = ("import sys; from sie.cli import main\n"
            f"try: main({args!r})\nexcept SystemExit: pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
