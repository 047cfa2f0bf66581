"""`sie get replicas`: the table's columns, PROCESS included, from model statuses (no Kafka: the read is faked)."""

from __future__ import annotations

import json

from sie.cli import main


def _replica(rid: str, node: str | None, process: str | None, state: str, **extra) -> dict:
    return {"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": "1.0.0", "node": node, "gpu_indices": [],
            "gpu_memory_mb": 0, "state": state, "reason": None, "restarts": 0, "actual_version": None,
            "process": process, "cooldowns": [], **extra}


def test_get_replicas_shows_the_process_hosting_each_replica(monkeypatch, capsys):
    from sie.commands import cluster

    old = _replica("legacy-0", "node-b", None, "READY")
    old.pop("process")  # a status from a control plane older than the field
    models = [{"name": "fraud", "replicas": [_replica("fraud-0", "node-a", "pid-4242", "READY"),
                                             _replica("fraud-1", None, None, "UNSCHEDULABLE",
                                                      reason="unschedulable: needs 679 MiB host memory")]},
              {"name": "legacy", "replicas": [old]}]
    monkeypatch.setattr(cluster, "statuses_json", lambda *a, **k: (models, None))
    assert main(["get", "replicas"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["REPLICA", "MODEL", "VERSION", "NODE", "GPU", "PROCESS", "STATE", "REASON"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["fraud-0"][:7] == ["fraud-0", "fraud", "1.0.0", "node-a", "-", "pid-4242", "READY"]
    assert rows["fraud-1"][5:7] == ["-", "UNSCHEDULABLE"] and "679 MiB host memory" in lines[2]
    assert rows["legacy-0"][5] == "-"
    assert main(["get", "replicas", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["process"] == "pid-4242"
