"""Hole 12: ``sie cdc run --metrics-port`` crashed (``CdcMetrics.serve`` took no address), and the quick fix must
not fall back to prometheus_client's ``0.0.0.0``.  Now the stage serves /metrics on ``SIE_METRICS_BIND``
(loopback by default), through the real CLI on the real broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from sie.connectors.cdc_stage import CdcMetrics
from sie.kernel.settings import Settings
from tests.support.helpers import REPO_ROOT, create_topic, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (``/proc/net/tcp``: 0A is LISTEN)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, _, port_hex = local.partition(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(host)[::-1]))
    return found


def test_the_metrics_server_binds_the_address_it_is_given():
    metrics = CdcMetrics("c")
    port = metrics.serve(0, "127.0.0.1")
    try:
        assert _listening_addresses(port) == {"127.0.0.1"}
        assert "sie_cdc_records_in" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        metrics.close()


@pytest.mark.kafka
def test_sie_cdc_run_with_metrics_port_serves_on_loopback_and_keeps_running(kafka_settings: Settings, tmp_path: Path):
    u = uuid.uuid4().hex[:10]
    source = create_topic(kafka_settings, f"test.cdc.src.{u}", 1)
    requests = create_topic(kafka_settings, f"test.cdc.req.{u}", 1)
    spec = tmp_path / "connector.yaml"
    spec.write_text(yaml.safe_dump({"kind": "CdcConnector", "metadata": {"name": f"metrics-{u}"},
                                    "spec": {"format": "canal-json", "sourceTopic": source, "model": "orders-model",
                                             "tables": ["shop.*"], "requestTopic": requests}}))
    port = _free_port()
    log = tmp_path / "stage.log"
    proc = subprocess.Popen([sys.executable, "-m", "sie", "--bootstrap-servers", kafka_settings.bootstrap_servers,
                             "cdc", "run", "-f", str(spec), "--instance", "i0", "--partitions", "1",
                             "--metrics-port", str(port), "--log-level", "warning"],
                            cwd=REPO_ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k != "SIE_METRICS_BIND"})
    try:
        def serving() -> bool:
            assert proc.poll() is None, f"sie cdc run exited {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                return "sie_cdc_records_in" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return False
        wait_until(serving, timeout=90, interval=0.5, message="the stage's /metrics")
        assert _listening_addresses(port) == {"127.0.0.1"}  # never prometheus_client's 0.0.0.0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
