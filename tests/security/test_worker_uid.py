"""Issue 37, "no worker can read a credential other than its own": workers (any team's model code) ran as the
agent's uid and could read the agent's Kafka password file.  With ``SIE_WORKER_UID`` the agent's launcher starts
each worker as that uid (no supplementary group, no_new_privs), the agent's own secret stays a 0400 file the
worker cannot open, and the workers' credential is a copy only the worker uid may read.

The tests switch uids for real, so they need root (as CI and this machine run them); the probe is a shell script
in place of ``python -m sie.workers.worker_main`` (the interpreter here lives under /root, which another uid
cannot reach; in the image it lives under /usr): everything else (command builder, launcher, files) is the
agent's own code path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.workers.agent.launch import WorkerCommandBuilder
from sie.workers.process import SubprocessLauncher
from sie.workers.replica import DesiredReplica
from sie.workers.worker_user import WorkerUser, check_can_switch, own_folder
from tests.support.helpers import wait_until

WORKER = WorkerUser(uid=23456, gid=23457)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root (CI runs as root)")

PROBE = r"""
exec 2>&1
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
grep -E '^(NoNewPrivs|Groups):' /proc/self/status
cat "$AGENT_SECRET" >/dev/null 2>&1 && echo "agent-secret=READ" || echo "agent-secret=DENIED"
cat "$OTHER_SECRET" >/dev/null 2>&1 && echo "workers-source=READ" || echo "workers-source=DENIED"
echo "own-credential=$(cat "$SIE_SASL_PASSWORD_FILE")"
echo "spec=$(cat spec-*.json | tr -d ' \n')"
echo "appended by the worker itself" >> worker.log && echo "log-append=OK"
touch scratch && echo "folder-write=OK"
echo done
"""


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """A work directory another uid can reach (pytest's tmp_path is under a 0700 folder of root's)."""
    root = Path(tempfile.mkdtemp(prefix="sie-worker-uid-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _secret(path: Path, text: str) -> Path:
    """A secret file as the chart mounts it for the agent: owner the agent (root), mode 0400."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o400)
    return path


def _wait_exit(handle: object, deadline_s: float = 30.0) -> None:
    wait_until(lambda: handle.poll() is not None, deadline_s, 0.02, "the probe to exit")  # type: ignore[attr-defined]


@needs_root
def test_a_worker_runs_as_its_uid_and_reads_only_its_own_credential(node_dir: Path):
    secrets = node_dir / "secrets"
    agent_pw = _secret(secrets / "kafka-user" / "password", "agent-password")
    workers_pw = _secret(secrets / "kafka-workers" / "password", "workers-password")
    os.chmod(secrets, 0o755)
    settings = Settings(cache_dir=node_dir / "cache", sasl_username="agent", sasl_password_file=agent_pw,
                        worker_sasl_username="scorer", worker_sasl_password_file=workers_pw)
    work = node_dir / "agent" / "node-1"
    builder = WorkerCommandBuilder(work, base_env={"PATH": "/usr/bin:/bin"}, settings=settings, worker_user=WORKER)
    launch = builder(DesiredReplica("m-0", "m", "1", json.dumps({"probe": 1})))

    # the worker's credential: a copy owned by the worker uid, 0400, named by its SIE_SASL_PASSWORD_FILE
    credential = Path(launch.env["SIE_SASL_PASSWORD_FILE"])
    info = credential.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (WORKER.uid, 0o400)
    assert launch.env["SIE_SASL_USERNAME"] == "scorer"
    assert "agent-password" not in "".join(launch.env.values())

    probe = replace(launch, argv=("/bin/sh", "-c", PROBE, "probe"),
                    env={**launch.env, "AGENT_SECRET": str(agent_pw), "OTHER_SECRET": str(workers_pw)})
    handle = SubprocessLauncher(user=WORKER).start(probe)
    _wait_exit(handle)
    log = (work / "m-0" / "worker.log").read_text(encoding="utf-8")
    assert "done" in log, log
    assert f"uid={WORKER.uid} gid={WORKER.gid} groups={WORKER.gid}\n" in log, log
    groups = next(line for line in log.splitlines() if line.startswith("Groups:"))
    assert "NoNewPrivs:\t1" in log and groups.split() == ["Groups:"], log  # the pod's fsGroup is dropped
    assert "agent-secret=DENIED" in log and "workers-source=DENIED" in log, log
    assert "own-credential=workers-password" in log, log
    assert 'spec={"probe":1}' in log and "log-append=OK" in log and "folder-write=OK" in log, log

    # the parent-death signal survives the uid switch (prctl(2) clears it on a uid change: set after it)
    pdeathsig = ("import ctypes, ctypes.util; libc = ctypes.CDLL(ctypes.util.find_library('c')); "
                 "v = ctypes.c_int(); libc.prctl(2, ctypes.byref(v)); print('pdeathsig', v.value)")
    handle = SubprocessLauncher(user=WORKER).start(replace(launch, argv=("/usr/bin/python3", "-I", "-c", pdeathsig)))
    _wait_exit(handle)
    assert f"pdeathsig {int(signal.SIGKILL)}" in (work / "m-0" / "worker.log").read_text(encoding="utf-8")

    # a rotated workers' secret reaches the next launch
    os.chmod(workers_pw, 0o600)
    workers_pw.write_text("rotated", encoding="utf-8")
    builder(DesiredReplica("m-0", "m", "2", json.dumps({"probe": 2})))
    os.setegid(WORKER.gid)
    os.seteuid(WORKER.uid)
    try:
        assert credential.read_text(encoding="utf-8") == "rotated"
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_without_a_worker_uid_workers_run_as_the_agent_and_read_the_workers_file_where_it_is(tmp_path: Path):
    """Developer laptops, non-root agents: nothing is switched or copied (docs/security.md says what that leaves)."""
    workers_pw = tmp_path / "workers-password"
    workers_pw.write_text("workers-password", encoding="utf-8")
    settings = Settings(cache_dir=tmp_path / "cache", sasl_username="agent", sasl_password="agent-password",
                        worker_sasl_username="scorer", worker_sasl_password_file=workers_pw)
    builder = WorkerCommandBuilder(tmp_path / "work", base_env={"PATH": "/usr/bin:/bin"}, settings=settings)
    launch = builder(DesiredReplica("m-0", "m", "1", json.dumps({})))
    assert launch.env["SIE_SASL_PASSWORD_FILE"] == str(workers_pw)
    assert not (tmp_path / "work" / "worker-kafka-password").exists()
    handle = SubprocessLauncher().start(replace(launch, argv=("/bin/sh", "-c", "id -u; echo done", "probe")))
    _wait_exit(handle)
    log = (tmp_path / "work" / "m-0" / "worker.log").read_text(encoding="utf-8")
    assert log.split() == [str(os.geteuid()), "done"]


def test_an_agent_that_cannot_switch_users_refuses_to_start_naming_the_capabilities():
    no_caps = "Name:\tsie\nCapEff:\t0000000000000000\n"
    with pytest.raises(ConfigError, match="lacks CAP_CHOWN, CAP_SETGID, CAP_SETUID.*unset SIE_WORKER_UID"):
        check_can_switch(WORKER, status=no_caps)
    check_can_switch(WORKER, status="CapEff:\t00000000000000c1\n")  # exactly CHOWN, SETGID, SETUID


def test_the_worker_user_comes_from_the_settings_and_never_reaches_the_workers(tmp_path: Path):
    assert WorkerUser.from_settings(Settings(cache_dir=tmp_path)) is None
    assert WorkerUser.from_settings(Settings(cache_dir=tmp_path, worker_uid=10002)) == WorkerUser(10002, 10002)
    settings = Settings(cache_dir=tmp_path, worker_uid=10002, worker_gid=10003)
    assert WorkerUser.from_settings(settings) == WorkerUser(10002, 10003)
    assert not {"SIE_WORKER_UID", "SIE_WORKER_GID"} & set(settings.worker_environment({}))
    with pytest.raises(ValueError):
        Settings(cache_dir=tmp_path, worker_uid=0)  # a worker as root would be no separation at all


@needs_root
def test_the_artifact_cache_must_be_the_agents_before_a_worker_runs(node_dir: Path):
    """A worker could make the cache folder first in a world-writable emptyDir and plant files under final names."""
    own_folder(node_dir / "cache" / "artifacts")  # made by the agent: fine
    planted = node_dir / "planted" / "artifacts"
    planted.mkdir(parents=True)
    os.chown(planted, WORKER.uid, WORKER.gid)
    with pytest.raises(ConfigError, match="belongs to uid 23456 .*remove the folder"):
        own_folder(planted)


@needs_root
def test_an_agent_with_a_worker_uid_starts_every_kind_of_worker_as_that_user(node_dir: Path):
    """The agent's wiring: cold launches, the warm pool and the credential copy all use SIE_WORKER_UID; the artifact
    cache folder is made the agent's at start."""
    from sie.workers.agent import Agent, AgentConfig

    workers_pw = _secret(node_dir / "secrets" / "workers-password", "workers-password")
    settings = Settings(cache_dir=node_dir / "cache", worker_uid=WORKER.uid, worker_gid=WORKER.gid,
                        sasl_username="agent", sasl_password="agent-password", worker_sasl_username="scorer",
                        worker_sasl_password_file=workers_pw)
    agent = Agent(AgentConfig(node="n1", simulate_gpus="1xA100-80GB", warm_pool=1), settings)
    assert agent.worker_user == WORKER
    assert agent.pool is not None and agent.pool._launcher.user == WORKER  # type: ignore[attr-defined]
    cold = agent.supervisor._launcher.cold  # type: ignore[attr-defined]
    assert cold.user == WORKER
    credential = agent.commands.credential_file
    assert (credential.stat().st_uid, stat.S_IMODE(credential.stat().st_mode)) == (WORKER.uid, 0o400)
    assert agent.pool.env["SIE_SASL_PASSWORD_FILE"] == str(credential)
    assert "agent-password" not in agent.pool.env.values()
    assert settings.artifact_cache_dir.stat().st_uid == os.geteuid()


@needs_root
def test_sie_agent_with_a_worker_uid_but_without_the_capabilities_stops_with_one_line(tmp_path: Path):
    """``sie agent --worker-uid`` as root whose bounding set lacks SETUID/SETGID/CHOWN (a pod without the chart's
    capabilities): one line naming them, before anything talks to Kafka."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is part of the test image"
    result = subprocess.run(
        [setpriv, "--bounding-set=-setuid,-setgid,-chown", sys.executable, "-m", "sie", "agent", "--node", "n1",
         "--worker-uid", "23456", "--simulate-gpus", "1xA100-80GB"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "SIE_CACHE_DIR": str(tmp_path), "SIE_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.returncode == 1, result.stderr
    assert "lacks CAP_CHOWN, CAP_SETGID, CAP_SETUID" in result.stderr and "Traceback" not in result.stderr


@needs_root
def test_a_work_directory_kept_from_a_non_root_agent_becomes_the_agents(node_dir: Path):
    """A hostPath work directory kept across the upgrade from an agent run as 10001: the agent (root without
    CAP_DAC_OVERRIDE on Kubernetes) takes its folders and files back; the worker's own files stay the worker's."""
    legacy = 10001
    work = node_dir / "agent" / "node-1"
    replica = work / "m-0"
    replica.mkdir(parents=True)
    (replica / "worker.log").write_text("old output\n", encoding="utf-8")
    (replica / "spec-1.json").write_text("{}", encoding="utf-8")
    (replica / "scratch").write_text("the worker's", encoding="utf-8")
    for path in (work, replica, replica / "worker.log", replica / "spec-1.json"):
        os.chown(path, legacy, legacy)
    os.chown(replica / "scratch", WORKER.uid, WORKER.gid)
    workers_pw = _secret(node_dir / "secrets" / "workers-password", "workers-password")
    settings = Settings(cache_dir=node_dir / "cache", worker_sasl_username="scorer",
                        worker_sasl_password_file=workers_pw)
    builder = WorkerCommandBuilder(work, base_env={}, settings=settings, worker_user=WORKER)
    builder(DesiredReplica("m-0", "m", "1", json.dumps({})))
    owners = {p.name: p.stat().st_uid for p in (work, replica, *replica.iterdir())}
    assert {n: owners[n] for n in ("node-1", "m-0", "worker.log", "spec-1.json", "scratch")} == \
        {"node-1": 0, "m-0": 0, "worker.log": 0, "spec-1.json": 0, "scratch": WORKER.uid}
    # the launch keeps the process before's log as worker.previous.log (`sie logs --previous`), taken back too
    assert owners["worker.previous.log"] == 0
    assert (replica / "worker.previous.log").read_text(encoding="utf-8") == "old output\n"


def test_a_workers_password_file_the_agent_cannot_read_is_one_line_at_start(tmp_path: Path):
    settings = Settings(cache_dir=tmp_path, worker_sasl_username="scorer",
                        worker_sasl_password_file=tmp_path / "missing")
    with pytest.raises(ConfigError, match="workers' password file .*missing: cannot copy it for SIE_WORKER_UID"):
        WorkerCommandBuilder(tmp_path / "work", base_env={}, settings=settings, worker_user=WORKER)


#: what the chart's agent container holds (agent.workerUid): root with only these capabilities
CHART_AGENT_CAPS = "--bounding-set=-all,+chown,+setgid,+setuid"
_COPY_AS_THE_CHARTS_AGENT = """
import json, os, sys
from pathlib import Path
from sie.kernel.settings import Settings
from sie.workers.agent.launch import WorkerCommandBuilder
from sie.workers.worker_user import WorkerUser
work, secret, uid, gid = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
settings = Settings(cache_dir=work.parent / "cache", worker_sasl_username="scorer", worker_sasl_password_file=secret)
builder = WorkerCommandBuilder(work, base_env={}, settings=settings, worker_user=WorkerUser(uid, gid))
info = os.stat(builder.credential_file)
caps = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:"))
print(json.dumps([info.st_uid, info.st_gid, oct(info.st_mode & 0o7777), caps]))
"""


@needs_root
def test_an_agent_holding_only_the_charts_capabilities_copies_the_workers_credential_for_them(node_dir: Path):
    """The chart's agent container is root with only CAP_CHOWN, CAP_SETGID and CAP_SETUID (no CAP_FOWNER): the copy
    used to be chmod-ed after its chown to the worker uid, which only the file's owner may do, and the agent pod
    stopped at start with "cannot copy it for SIE_WORKER_UID (Operation not permitted)" (found by
    tests/k8s/test_pods_secured.py; root with every capability, as here, never saw it)."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is part of the test image"
    secret = _secret(node_dir / "secrets" / "workers-password", "workers-password")
    result = subprocess.run([setpriv, CHART_AGENT_CAPS, sys.executable, "-c", _COPY_AS_THE_CHARTS_AGENT,
                             str(node_dir / "agent" / "n1"), str(secret), str(WORKER.uid), str(WORKER.gid)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    # owned by the worker, 0400, made by an agent whose effective capabilities were exactly chown, setgid, setuid
    assert json.loads(result.stdout) == [WORKER.uid, WORKER.gid, "0o400", "00000000000000c1"]
    assert (node_dir / "agent" / "n1" / "worker-kafka-password").read_text(encoding="utf-8") == "workers-password"
