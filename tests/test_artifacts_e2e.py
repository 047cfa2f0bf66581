"""Artifacts that reach every node, on the real broker with real processes (issue 17, "done when").

A python-function model (``churn_rules.py`` next to its spec) and a safetensors model (its ``churnnet``
package and weights next to its spec) are applied through the control plane's API (``sie apply
--control-url``: it uploads the weights and the packages to the artifacts topics) and become READY on an
agent whose working directory, cache and environment never saw those files.  A second agent on another
data directory takes the replicas over when the first one dies and scores them from what it fetched from
the artifacts topic.  An artifact with a corrupt chunk is refused by its digest: the replica is FAILED with
that reason, and nothing of it lands in the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import signal
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.kernel.settings import Settings
from sie.schemas.artifact_store import ArtifactStore
from sie.schemas.spec_store import read_specs
from tests.support.cluster_harness import Cluster, StatusTail, try_get, wait_for
from tests.support.helpers import EXAMPLES, consume_all, forge_artifact, produce_json

pytestmark = pytest.mark.kafka

ALLOWED = "models.fraud,churn_rules,churnnet,churn_bad"
WEIGHTS = EXAMPLES / "models" / "fraud" / "fraud_scorer.safetensors"


def _spec(example: str, name: str, backend: dict[str, Any]) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["model"]["name"] = name
    doc["spec"]["backend"] = backend
    doc["spec"]["resources"] = {"gpuMemoryMb": 0, "cpu": 0.5, "memoryMb": 256}
    return doc


def _user_files(root: Path) -> dict[str, Path]:
    """What a user has on their laptop: specs with their code and weights next to them."""
    rules = root / "rules"
    rules.mkdir(parents=True)
    shutil.copy(EXAMPLES / "models" / "fraud" / "rules.py", rules / "churn_rules.py")
    (rules / "churn-rules.yaml").write_text(yaml.safe_dump(_spec("fraud-rules", "churn-rules", {
        "type": "python", "callable": "churn_rules:score"})))
    net = root / "net"
    (net / "churnnet").mkdir(parents=True)
    (net / "churnnet" / "__init__.py").write_text("")
    shutil.copy(EXAMPLES / "models" / "fraud" / "model.py", net / "churnnet" / "model.py")
    shutil.copy(WEIGHTS, net / "weights.safetensors")
    (net / "churn-net.yaml").write_text(yaml.safe_dump(_spec("fraud-scorer", "churn-net", {
        "type": "torch", "artifact": "weights.safetensors", "moduleClass": "churnnet.model:FraudMLP",
        "device": "cpu", "config": {"threads": 1}})))
    return {"rules": rules / "churn-rules.yaml", "net": net / "churn-net.yaml"}


def _example() -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / "fraud-rules.yaml").read_text())["spec"]["exampleInput"])


def _score(cluster: Cluster, model: str, ids: range, expected_total: int) -> list[dict[str, Any]]:
    topics = cluster.spec_topics(model)
    produce_json(cluster.settings, topics["requests"],
                 [{"id": f"{model}-{i}", "inputs": {**_example(), "amount": 10.0 + i}} for i in ids])
    results = consume_all(cluster.settings, topics["results"], expected=expected_total, timeout=90)
    return [r.json() for r in results]


def _node_of(cluster: Cluster, model: str) -> str | None:
    m = cluster.ready_model(model, 1)
    return m["replicas"][0]["node"] if m else None


def test_models_next_to_their_spec_run_on_agents_that_never_saw_them(kafka_settings: Settings, tmp_path: Path) -> None:
    specs = _user_files(tmp_path / "laptop")
    caches = {n: tmp_path / f"{n}-data" for n in ("node-a", "node-b")}
    cwds = {n: tmp_path / f"{n}-cwd" for n in ("node-a", "node-b")}
    for d in cwds.values():
        d.mkdir()
    with Cluster(kafka_settings, tmp_path / "cluster", extra_env={"SIE_ALLOWED_MODULES": ALLOWED}) as cluster:
        status = StatusTail(cluster.settings)
        cluster.start_control("c1", node_timeout=4)
        agent_a = cluster.start_agent("node-a", gpus=None, env={"SIE_CACHE_DIR": str(caches["node-a"])},
                                      cwd=cwds["node-a"])
        port = cluster.wait_leader().port
        url = f"http://127.0.0.1:{port}"
        applied = cluster.sie("apply", "--control-url", url, "-f", str(specs["rules"]), "-f", str(specs["net"]),
                              timeout=120)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "modules (1 files: churn_rules.py)" in applied.stdout
        assert "artifact weights.safetensors: sha256:" in applied.stdout and "uploaded" in applied.stdout

        # the specs on the cluster name digests, no path of the laptop
        on_topic = read_specs(cluster.settings)
        net, rules = on_topic["churn-net"].backend, on_topic["churn-rules"].backend
        assert net.artifact is None and net.artifact_ref is not None
        assert net.artifact_ref.sha256 == hashlib.sha256(WEIGHTS.read_bytes()).hexdigest()
        assert net.modules is not None and rules.modules is not None and rules.artifact is None
        assert str(tmp_path / "laptop") not in json.dumps([s.to_document() for s in on_topic.values()])

        for model in ("churn-rules", "churn-net"):
            cluster.wait_ready(model, 1, timeout=240)
        scored = _score(cluster, "churn-rules", range(10), 10)
        assert all(0.0 <= r["outputs"]["risk_score"] <= 1.0 for r in scored)
        scored = _score(cluster, "churn-net", range(10), 10)
        assert all(0.0 <= r["outputs"]["fraud_probability"] <= 1.0 for r in scored)

        # agent A runs them from its own verified copies: its workers' specs name the cache
        cached_a = {p.name for p in (caches["node-a"] / "artifacts").rglob("*") if p.is_file()}
        assert {"weights.safetensors", "modules.zip"} <= cached_a
        worker_spec = json.loads(next((tmp_path / "cluster" / "agents" / "node-a" / "churn-net-0").glob("spec-*.json"))
                                 .read_text())
        assert worker_spec["backend"]["artifact"].startswith(str(caches["node-a"] / "artifacts" / "sha256"))
        assert worker_spec["backend"]["modules_path"].endswith("modules.zip")

        # a second agent on another data directory takes over when the first is lost
        cluster.start_agent("node-b", gpus=None, env={"SIE_CACHE_DIR": str(caches["node-b"])}, cwd=cwds["node-b"])
        wait_for(lambda: _online(cluster, "node-b"), 60, "node-b online")
        cluster.stop(agent_a, signal.SIGKILL)
        for model in ("churn-rules", "churn-net"):
            wait_for(lambda: _node_of(cluster, model) == "node-b", 240,
                     lambda: f"{model} READY on node-b: {cluster.model(model)}\n{cluster.logs('agent')}")
        scored = _score(cluster, "churn-net", range(10, 20), 20)
        assert len({r["id"] for r in scored}) == 20
        scored = _score(cluster, "churn-rules", range(10, 20), 20)
        assert len({r["id"] for r in scored}) == 20
        cached_b = {p.name for p in (caches["node-b"] / "artifacts").rglob("*") if p.is_file()}
        assert {"weights.safetensors", "modules.zip"} <= cached_b  # fetched from the artifacts topic

        # a corrupt chunk: refused by its digest, the replica FAILED with the reason, nothing cached
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("churn_bad.py", "def score(xs):\n    return [{'risk_score': 0.0, 'reason': 'x'} for _ in xs]\n")
        manifest = forge_artifact(ArtifactStore(cluster.settings), archive.getvalue(), name="modules.zip", corrupt=0)
        bad = _spec("fraud-rules", "churn-bad", {"type": "python", "callable": "churn_bad:score",
                                                 "modules": {"sha256": manifest.sha256, "name": "modules.zip"}})
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        applied = cluster.sie("apply", "--control-url", url, "-f", str(tmp_path / "bad.yaml"))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        failed = wait_for(lambda: status.find(replica_id="churn-bad-0", state="FAILED"), 90,
                          lambda: f"churn-bad-0 FAILED; seen {status.find(replica_id='churn-bad-0')}")[0]
        assert failed["node"] == "node-b" and "chunk 0 is corrupt" in failed["reason"], failed
        assert not (caches["node-b"] / "artifacts" / "sha256" / manifest.sha256 / "modules.zip").exists()
        assert [r["state"] for r in status.find(replica_id="churn-bad-0")][:2] == ["PENDING", "PENDING"]
        assert not status.find(replica_id="churn-bad-0", state="STARTING")  # never launched, no crash loop
        status.close()


def _online(cluster: Cluster, node: str) -> bool:
    nodes = (try_get(cluster.api(), "/v1/nodes") or {}).get("nodes", [])
    return any(n["name"] == node and n["status"] == "online" for n in nodes)
