"""A CDC connector applied through the control plane (issue 17): run by an agent like a replica, paused and
resumed with its offsets kept, every change event converted exactly once, described and deleted.

Real processes (``sie control``, ``sie agent``, the ``sie connector`` CLI) on the real broker; the change
events are canal flatMessage JSON produced to the source topic as canal would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.kernel.settings import Settings
from tests.support.cluster_harness import Cluster, StatusTail, try_get, wait_for
from tests.support.helpers import EXAMPLES, consume_all, create_topic, produce_json

pytestmark = pytest.mark.kafka

_TEMPLATE = json.loads((EXAMPLES / "cdc" / "canal-orders.jsonl").read_text().splitlines()[0])


def _insert(order_id: int) -> dict[str, Any]:
    """A canal INSERT of one shop.orders row (the example's first event with another id)."""
    event = json.loads(json.dumps(_TEMPLATE))
    event["data"][0]["id"] = str(order_id)
    event["id"] = order_id
    return event


def _connector_file(root: Path, source: str) -> Path:
    doc = yaml.safe_load((EXAMPLES / "cdc" / "orders-to-fraud.yaml").read_text())
    doc["metadata"]["name"] = "orders"
    doc["spec"]["sourceTopic"] = source
    doc["spec"]["model"] = "fraud-rules"
    path = root / "orders.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_connector_runs_pauses_and_resumes_exactly_once(kafka_settings: Settings, tmp_path: Path) -> None:
    with Cluster(kafka_settings, tmp_path / "cluster") as cluster:
        status = StatusTail(cluster.settings)
        cluster.start_control("c1")
        cluster.start_agent("node-a", gpus=None)
        url = f"http://127.0.0.1:{cluster.wait_leader().port}"
        done = cluster.sie("apply", "--control-url", url, "-f", str(cluster.write_spec("fraud-rules")))
        assert done.returncode == 0, done.stdout + done.stderr
        cluster.wait_ready("fraud-rules", 1, timeout=120)

        source = create_topic(cluster.settings, f"{cluster.prefix}.canal.shop.orders", partitions=2)
        done = cluster.sie("connector", "apply", "--control-url", url, "-f", str(_connector_file(tmp_path, source)))
        assert done.returncode == 0 and "applied: connector orders" in done.stdout, done.stdout + done.stderr

        def connector() -> dict[str, Any]:
            return try_get(cluster.api(), "/v1/connectors/orders") or {}

        wait_for(lambda: connector().get("phase") == "Running", 120,
                 lambda: f"connector Running: {connector()}\n{cluster.logs('agent')}")
        topics = cluster.spec_topics("fraud-rules")
        produce_json(cluster.settings, source, [_insert(1000 + i) for i in range(20)],
                     key_fn=lambda e: e["data"][0]["id"])
        requests = consume_all(cluster.settings, topics["requests"], expected=20, timeout=90)
        assert len(requests) == 20
        results = consume_all(cluster.settings, topics["results"], expected=20, timeout=90)
        assert {r.json()["id"] for r in results} == {r.json()["id"] for r in requests}
        wait_for(lambda: (connector().get("offsets") or {}).get("lag") == 0, 30, lambda: f"lag 0: {connector()}")
        offsets = connector()["offsets"]
        assert sum(p["committed"] or 0 for p in offsets["partitions"]) == 20

        # pause: the replica drains (its batch committed), new events wait on the source topic
        done = cluster.sie("connector", "pause", "orders", "--control-url", url)
        assert done.returncode == 0 and "paused: connector orders" in done.stdout, done.stdout + done.stderr
        wait_for(lambda: status.find(replica_id="cdc:orders-0", state="STOPPED"), 60,
                 lambda: f"cdc:orders-0 STOPPED; seen {status.find(replica_id='cdc:orders-0')}")
        wait_for(lambda: connector().get("phase") == "Paused" and not connector()["replicas"], 30,
                 lambda: f"Paused: {connector()}")
        produce_json(cluster.settings, source, [_insert(2000 + i) for i in range(10)],
                     key_fn=lambda e: e["data"][0]["id"])
        wait_for(lambda: (connector().get("offsets") or {}).get("lag") == 10, 30, lambda: f"lag 10: {connector()}")
        assert len(consume_all(cluster.settings, topics["requests"])) == 20  # nothing converted while paused

        described = cluster.sie("connector", "describe", "orders", "--control-url", url)
        assert described.returncode == 0 and "Phase:     Paused" in described.stdout
        assert "lag 10" in described.stdout, described.stdout

        # resume from the committed offsets: every event exactly once
        done = cluster.sie("connector", "resume", "orders", "--control-url", url)
        assert done.returncode == 0, done.stdout + done.stderr
        requests = consume_all(cluster.settings, topics["requests"], expected=30, timeout=120)
        ids = [r.json()["id"] for r in requests]
        assert len(ids) == 30 and len(set(ids)) == 30, ids
        wait_for(lambda: connector().get("phase") == "Running" and connector()["offsets"]["lag"] == 0, 60,
                 lambda: f"Running, lag 0: {connector()}")

        listed = cluster.sie("connector", "get", "--control-url", url)
        assert listed.returncode == 0 and "orders" in listed.stdout and "Running" in listed.stdout, listed.stdout
        done = cluster.sie("connector", "delete", "orders", "--control-url", url)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(lambda: status.find(replica_id="cdc:orders-0", state="STOPPED")
                 and len(status.find(replica_id="cdc:orders-0", state="STOPPED")) >= 2, 60, "drained after delete")
        gone = cluster.sie("connector", "describe", "orders", "--control-url", url)
        assert gone.returncode != 0 and "is not applied" in gone.stderr
        status.close()
