"""Reads at size without Kafka: an in-process control API (as tests/control/api build it) over a fabricated state of
MODELS models x 3 replicas on NODES nodes, served by uvicorn on a loopback port; times `sie get replicas` (JSON and
table, full, filtered, one page; best of REPEATS subprocess runs), the status page's routes and the full lists.
What it leaves out (Kafka, a leader's passes) bench_scale.py measures; this one reaches 10,000 models in a minute.

  python bench/bench_reads.py [MODELS] [NODES] [REPEATS]        (default 10000 1000 5; results: bench/results/reads.txt)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support: the API fixtures the tests use

from sie.control.api.auth import TokenStore
from sie.control.api.routes import create_app
from sie.control.api.server import ApiServer
from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.control.service import ControlService
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from sie.schemas.spec import load
from tests.support.helpers import VIEWER_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import echo_spec_doc

MODELS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
NODES = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 5


def build() -> ControlService:
    settings = with_api_tokens(Settings(cache_dir=Path(tempfile.mkdtemp()) / "cache"))
    service = ControlService(settings, http_port=None)
    now = time.time()
    service.clock = time.time
    state = service.state
    per_node: dict[str, list[dict]] = {f"node-{n:04d}": [] for n in range(NODES)}
    statuses = {}
    for m in range(MODELS):
        name = f"model-{m:05d}"
        state.specs[name] = load(echo_spec_doc(name), origin="measure", topic_prefix=settings.topic_prefix)
        views = []
        for k in range(3):
            node = f"node-{(m * 3 + k) % NODES:04d}"
            rid = f"{name}-{k}"
            views.append(ReplicaView(rid, name, "1.0.0", node, (), 0, ReplicaState.READY, process=f"pid-{m * 3 + k}",
                                     actual_version="1.0.0"))
            per_node[node].append({"replica_id": rid, "model": name, "version": "1.0.0", "state": "READY", "pid": 1,
                                   "restarts": 0, "reason": None, "metrics_address": None, "lag": 0, "p99_ms": 3})
        statuses[name] = ModelStatus(name, "1.0.0", "P1", "scoring", "Ready", None, 3, 3, tuple(views), epoch=1,
                                     updated_at_ms=int(now * 1000))
    for node, replicas in per_node.items():
        state.apply_node(node, {"cpu_count": 32, "memory_mb": 256000, "simulated": True, "gpus": []})
        state.apply_heartbeat({"node": node, "ts_ms": int(now * 1000), "seq": 1, "gpus": [], "replicas": replicas},
                              seen_at=now + 3600)  # online for the whole run
    service.controller.statuses = statuses
    service.rollouts = SimpleNamespace(list=lambda: [], last_error=None)
    return service


def best(label: str, run, repeats: int = REPEATS) -> float:
    try:
        return _best(label, run, repeats)
    except AssertionError as exc:
        print(f"{label:<58} n/a ({str(exc).strip().splitlines()[-1][:80] if str(exc).strip() else exc!r})", flush=True)
        return float("nan")


def _best(label: str, run, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        info = run()
        times.append(time.perf_counter() - t0)
    print(f"{label:<58} best {min(times):6.3f} s  median {sorted(times)[len(times) // 2]:6.3f} s  {info or ''}",
          flush=True)
    return min(times)


def main() -> None:
    t0 = time.perf_counter()
    service = build()
    print(f"state: {MODELS} models, {MODELS * 3} replicas, {NODES} nodes (built in {time.perf_counter() - t0:.1f} s)")
    app = create_app(service, TokenStore(service.settings), (), SimpleNamespace(record=lambda *a: None))
    server = ApiServer(app, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{server.port}"
    auth = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    env = {**os.environ, "SIE_API_TOKEN": VIEWER_TOKEN, "SIE_CONTROL_URL": url}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
        def get(path: str):
            return lambda: f"{len(http.get(path).raise_for_status().content):,} B"

        first = time.perf_counter()
        http.get("/v1/replicas").raise_for_status()
        print(f"{'GET /v1/replicas, first (builds the index + JSON)':<58} {time.perf_counter() - first:6.3f} s")
        for path in ("/v1/replicas", "/v1/replicas?model=model-04242", "/v1/replicas?node=node-0042",
                     "/v1/replicas?limit=100", "/v1/replicas?state=READY&limit=100", "/v1/models",
                     "/v1/models?limit=100", "/v1/models?model=model-04242", "/v1/nodes", "/v1/nodes?limit=100"):
            best(f"GET {path}", get(path))
        page = ["/healthz", "/v1/nodes?limit=100", "/v1/models?limit=100", "/v1/replicas?limit=100",
                "/v1/events?limit=30", "/v1/rollouts"]
        best("status page refresh (its 6 routes, one after another)", lambda: [get(p)() for p in page] and None)

    def cli(*args: str):
        def run() -> str:
            done = subprocess.run([sys.executable, "-m", "sie", *args], env=env, capture_output=True, text=True, cwd=os.environ.get("MEASURE_CWD"),
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-500:]
            return f"{len(done.stdout):,} chars out"
        return run

    best("python -m sie --help", cli("--help"))
    best("python -m sie get replicas --help", cli("get", "replicas", "--help"))
    best("sie get replicas -o json (everything)", cli("get", "replicas", "-o", "json"))
    best("sie get replicas (table, everything)", cli("get", "replicas"))
    best("sie get replicas --model model-04242", cli("get", "replicas", "--model", "model-04242"))
    best("sie get replicas --limit 100", cli("get", "replicas", "--limit", "100"))
    best("sie get models --limit 100", cli("get", "models", "--limit", "100"))
    best("sie get nodes --limit 100", cli("get", "nodes", "--limit", "100"))
    server.stop() if hasattr(server, "stop") else None


if __name__ == "__main__":
    main()
