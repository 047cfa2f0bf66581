"""A worker SIGKILLed leaves no orphans (issue 41 item 6): its server's own children (vLLM's engine core,
``resource_tracker``) are not the worker's children, so PDEATHSIG does not reach them; the agent's handle kills
what is left of the worker's process group once the worker is killed or its exit is seen."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

from sie.workers.process import LaunchSpec, SubprocessLauncher
from tests.support.helpers import wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_killed_worker_s_grandchildren_are_killed_with_its_group(tmp_path: Path):
    pidfile = tmp_path / "grandchild.pid"
    # the worker starts a "server" (its child, with PDEATHSIG in the real worker), which starts its own child
    # (no PDEATHSIG, like vLLM's engine and resource_tracker) and records its pid; each only sleeps, to live until
    # the test kills the group (their lifetime, not a synchronisation)
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        server = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(600)"])
        time.sleep(600)
    """)
    handle = SubprocessLauncher().start(LaunchSpec(name="w", argv=(sys.executable, "-c", script), status_pipe=False))
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), 30, message="grandchild up")
        grandchild = int(pidfile.read_text())
        assert _alive(grandchild)
        os.kill(handle.pid, signal.SIGKILL)  # the worker dies as in the issue: SIGKILL, no cleanup of its own
        wait_until(lambda: handle.poll() is not None, 10, message="the worker's exit is seen")
        wait_until(lambda: not _alive(grandchild), 10, message="the grandchild dies with the worker's group")
    finally:
        try:
            os.killpg(handle.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
