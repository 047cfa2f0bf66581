"""bench/bench_scale.py at a tiny size, so the harness cannot rot: 5 simulated nodes, 10 models, a real leader and
standby on the test broker, every phase once (populate, steady window, probes, API, agent replay, leader SIGKILL,
node loss, cold start, topic sizes).  The numbers at scale are in bench/results/scale.txt."""

from __future__ import annotations

import json

import pytest

from bench.bench_scale import main

pytestmark = pytest.mark.kafka


def test_the_scale_harness_runs_every_phase_at_a_tiny_size(kafka_settings, tmp_path):
    [result] = main(["--bootstrap", kafka_settings.bootstrap_servers, "--sizes", "5x10", "--window", "4",
                     "--settle", "2", "--probes", "3", "--probe-interval", "0.5", "--api-repeats", "1",
                     "--size-timeout", "600", "--out-dir", str(tmp_path), "--name", "tiny"])
    assert "error" not in result, result.get("error")
    assert result["replicas"] == 30 and result["populate"]["nodes_in_use"] >= 1
    probes = result["probes"]
    assert probes["n"] == 3 and 0 < probes["apply_to_assignment_s"]["p50"] <= probes["apply_to_ready_s"]["p50"]
    assert result["steady"]["topics"]["heartbeats"]["records_per_s"] > 0  # 5 nodes heartbeat every 2 s
    assert result["steady"]["reconcile"]["passes"] >= 1 and result["steady"]["cpu_cores"]["leader"] >= 0
    assert result["api"]["sie_get_replicas"]["kafka"]["rows"] == 39  # 10 models + 3 probes, 3 replicas each
    assert result["agent_replay"]["replicas"] >= 1
    takeover = result["takeover"]
    # the new leader changed nothing its predecessor published, and no simulated replica restarted
    assert takeover["assignments_changed"] == 0 and takeover["placement_events"] == 0
    assert takeover["replicas_started"] == takeover["replicas_drained"] == 0
    assert takeover["elected_s"] <= takeover["first_pass_s"]
    loss = result["node_loss"]
    assert loss["replicas"] >= 1 and loss["replicas_started_elsewhere"] >= loss["replicas"]
    assert loss["offline_after_last_heartbeat_s"] >= 6.0  # the node timeout: never judged before it
    assert result["cold_start"]["caught_up_s"] > 0
    sizes = result["topic_sizes"]
    assert sizes["assignments"]["keys"] >= result["populate"]["nodes_in_use"]  # every node that had replicas
    assert sizes["specs"]["keys"] == 13
    saved = json.loads((tmp_path / "tiny.json").read_text())
    assert saved["results"][0]["nodes"] == 5
    assert "targets at 5x10" in (tmp_path / "tiny.txt").read_text()
