"""Start in any order, as every pod of a Helm release does: an agent and a control plane started before
SIE's topics exist wait (their /readyz says for what), then run once `sie topics ensure` made them."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from sie.kernel.settings import Settings
from tests.support.cluster_harness import REPO, free_port, wait_for
from tests.support.helpers import OPERATOR_TOKEN, with_api_tokens

pytestmark = pytest.mark.kafka


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()
    except OSError as e:
        return 0, str(e)


def test_agent_and_control_plane_started_before_the_topics_wait_then_become_ready(kafka_settings: Settings,
                                                                                    tmp_path: Path):
    import json

    prefix = f"order{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers, "SIE_TOPIC_PREFIX": prefix,
           "SIE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1", "SIE_API_TOKEN": OPERATOR_TOKEN,
           "SIE_API_TOKENS": json.dumps([e.model_dump() for e in with_api_tokens(kafka_settings).api_tokens])}
    agent_port, control_port = free_port(), free_port()
    procs = []
    try:
        for name, args in (
            ("agent", ["agent", "--node", "n1", "--simulate-gpus", "1xL4", "--work-dir", str(tmp_path / "agent"),
                       "--health-port", str(agent_port)]),
            ("control", ["control", "--http-port", "0", "--no-ensure-topics", "--health-port", str(control_port)]),
        ):
            log = open(tmp_path / f"{name}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "sie", *args], cwd=REPO, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            log.close()

        def logs() -> str:
            return "\n".join(f"--- {p}\n" + p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("*.log"))

        for port, topic in ((agent_port, f"{prefix}.assignments"), (control_port, f"{prefix}.specs")):
            code, text = wait_for(lambda: (lambda r: r if r[0] == 503 and "topics" in r[1] else None)(_readyz(port)),
                                  60, lambda: f"/readyz 503 waiting for topics; {logs()}")
            assert text.startswith("waiting for: topics [") and topic in text, text
        assert all(p.poll() is None for p in procs), "a component exited instead of waiting:\n" + logs()
        ensured = subprocess.run([sys.executable, "-m", "sie", "topics", "ensure"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert ensured.returncode == 0, ensured.stderr
        for port in (agent_port, control_port):
            wait_for(lambda: _readyz(port)[0] == 200, 90, lambda: f"/readyz 200 on {port}; {logs()}")
        assert "registered" in _readyz(agent_port)[1]
        assert _readyz(control_port)[1].startswith("serving")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_with_wait_for_kafka_an_agent_outlives_a_missing_broker_and_says_so(tmp_path: Path):
    """The chart's agents start with --wait-for-kafka: no broker yet is a 503 naming Kafka, not an exit 1."""
    port = free_port()
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "SIE_CACHE_DIR": str(tmp_path / "cache"),
           "SIE_CONNECT_TIMEOUT_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sie", "agent", "--node", "n1", "--simulate-gpus", "1xL4",
                             "--work-dir", str(tmp_path / "agent"), "--wait-for-kafka", "--health-port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        code, text = wait_for(lambda: (lambda r: r if r[0] == 503 and "Kafka" in r[1] else None)(_readyz(port)), 60,
                              "/readyz 503 naming Kafka")
        assert text.startswith("waiting for: Kafka") and "127.0.0.1:1" in text, text
        assert proc.poll() is None, "the agent exited instead of waiting"
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
