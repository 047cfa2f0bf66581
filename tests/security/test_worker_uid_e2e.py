"""Issue 37 end to end: ``sie agent --worker-uid`` on the real broker runs a model's worker as that uid, READY by a
real inference, scoring requests, with the workers' password handed as a copy only that uid reads.

The agent runs as a CLI process in a private mount namespace where ``/root`` is a 0755 tmpfs with only the Python
installation bound in: the interpreter of this machine's venv lives under ``/root`` (0700), which another uid
cannot reach (in the image it lives under ``/usr``).  Nothing outside the namespace changes.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sie.kernel.admin import ensure_topics
from sie.kernel.settings import Settings
from sie.kernel.topics import system_topics
from sie.schemas.spec import load
from tests.security.test_worker_uid import node_dir  # noqa: F401  (a fixture)
from tests.support.helpers import REPO_ROOT, TopicTail, consume_all, produce_json, wait_until
from tests.workers.test_agent_kafka import publish_assignment, replica_assignment

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root (CI runs as root)")]

WORKER_UID = 23456
#: the Python installation, when it lies under /root (this machine: /root/.pyenv/versions/3.11.7 -> /root/.pyenv)
PYENV = Path(sys.base_prefix).parent.parent if sys.base_prefix.startswith("/root/") else None


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _start_agent(root: Path, work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """``sie agent --worker-uid`` in a private mount namespace where the Python installation is reachable."""
    mounts = root / "pyenv"
    mounts.mkdir()
    agent_cmd = [sys.executable, "-m", "sie", "agent", "--node", "n1", "--simulate-gpus", "1xA100-80GB",
                 "--work-dir", str(work), "--worker-uid", str(WORKER_UID), "--heartbeat-s", "0.5"]
    script = (f"mount --bind {PYENV} {mounts} && mount -t tmpfs -o mode=0755 tmpfs /root && "
              f"mkdir -p {PYENV} && mount --bind {mounts} {PYENV} && exec \"$@\"") if PYENV else 'exec "$@"'
    log = root / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                  *agent_cmd], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                    "HOME": str(root), **env},
                                 cwd=str(root), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return agent, log


def _stop(agent: subprocess.Popen[bytes]) -> None:
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)


def _worker_pid(heartbeats: TopicTail) -> int | None:
    for beat in reversed(heartbeats.find(node="n1")):
        for rep in beat["replicas"]:
            if rep["replica_id"] == "fraud-rules-0" and rep["state"] == "READY" and rep["pid"]:
                return int(rep["pid"])
    return None


def test_sie_agent_runs_a_real_worker_as_its_uid_scoring_with_its_own_credential_copy(
        kafka_settings: Settings, node_dir: Path) -> None:  # noqa: F811
    assert shutil.which("unshare"), "util-linux unshare"
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = kafka_settings.with_overrides(topic_prefix=prefix)
    ensure_topics(settings, system_topics(prefix), replication_factor=1)
    doc = load(REPO_ROOT / "examples" / "fraud-rules.yaml").to_document()
    doc["topics"] = {"requests": f"{prefix}.model.fraud-rules.requests",
                     "results": f"{prefix}.model.fraud-rules.results",
                     "dead_letters": f"{prefix}.model.fraud-rules.dlq",
                     "backfill": f"{prefix}.model.fraud-rules.backfill"}
    doc["group_id"] = f"{prefix}.scorer.fraud-rules"
    # the agent's own secret and the workers' Secret, as the chart mounts them: root's, 0400 (the plaintext broker
    # ignores SASL; the worker still reads its password file when it builds a client, so it must read its copy)
    secrets = node_dir / "secrets"
    secrets.mkdir(mode=0o755)
    for name, text in (("agent", "agent-password"), ("workers", "workers-password")):
        (secrets / name).write_text(text)
        os.chmod(secrets / name, 0o400)
    work = node_dir / "work"
    env = {"SIE_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "SIE_TOPIC_PREFIX": prefix,
           "SIE_CACHE_DIR": str(node_dir / "cache"), "SIE_SASL_USERNAME": "agent",
           "SIE_SASL_PASSWORD_FILE": str(secrets / "agent"), "SIE_WORKER_SASL_USERNAME": "scorer",
           "SIE_WORKER_SASL_PASSWORD_FILE": str(secrets / "workers")}
    status = TopicTail(settings, f"{prefix}.replica-status")
    heartbeats = TopicTail(settings, f"{prefix}.heartbeats")
    agent, log = _start_agent(node_dir, work, env)
    try:
        publish_assignment(settings, "n1", 1, [replica_assignment(doc)])
        wait_until(lambda: status.find(replica_id="fraud-rules-0", state="READY"), timeout=120,
                   message=lambda: f"READY; statuses {status.values()}; agent log {log.read_text()[-2000:]}")

        pid = wait_until(lambda: _worker_pid(heartbeats), timeout=20, message="a heartbeat with the READY worker's pid")
        assert _uid_of(pid) == WORKER_UID
        credential = work / "n1" / "worker-kafka-password"
        info = credential.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode), credential.read_text()) == \
            (WORKER_UID, 0o400, "workers-password")
        assert "SIE_SASL_PASSWORD_FILE=" + str(credential) in \
            Path(f"/proc/{pid}/environ").read_bytes().decode().replace("\0", "\n").splitlines()

        example = doc["example_input"]
        produce_json(settings, doc["topics"]["requests"],
                     [{"id": f"r-{i}", "inputs": {**example, "amount": 10.0 + i}} for i in range(10)])
        results = consume_all(settings, doc["topics"]["results"], expected=10, timeout=60)
        assert sorted(r.json()["id"] for r in results) == sorted(f"r-{i}" for i in range(10))
        assert (work / "n1" / "fraud-rules-0" / "worker.log").stat().st_size > 0
    finally:
        _stop(agent)
        status.close()
        heartbeats.close()

