"""The ONE wrapper for the agent's side effects on processes: spawn, signal, reap, read status lines.

Why one wrapper: the supervisor's state machine only talks to ``ProcessLauncher``
and ``ProcessHandle``; unit tests swap in fakes and a fake clock, so restarts,
backoff, drain and crash causes are tested without a single real process or sleep.

Every child is started with ``PR_SET_PDEATHSIG(SIGKILL)``: when the agent dies
(even by SIGKILL), the kernel kills its workers, which is how "node lost" looks.
Each worker leads a process group of its own; once it is killed or its exit is
seen, what is left of the group (its server's own children) is SIGKILLed too.
Caveat from prctl(2): the signal fires when the *thread* that forked the child
exits, so children must be spawned from a long-lived thread (the agent's main
loop does this).

Workers report on a dedicated status pipe (fd passed with ``pass_fds`` and named
by ``--status-fd``), one JSON object per line, so a library printing to stdout
can never be mistaken for a status report.  stdout/stderr go to a per-replica log
file whose tail is quoted in crash reasons.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sie.kernel.errors import SieError
from sie.workers.replica import ExitInfo
from sie.workers.worker_user import WorkerUser

log = logging.getLogger(__name__)


class LaunchRefused(SieError):
    """A replica this node will not start at all (its spec breaks the node's policy): the supervisor
    marks it FAILED with this reason at once instead of retrying a launch that can never be allowed."""


class LaunchDeferred(SieError):
    """Not yet: something the replica needs is on its way (its artifacts are being fetched).  The replica
    stays PENDING with this reason and the launch is tried again shortly; no crash is counted."""


PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one worker process."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    log_path: Path | None = None
    #: pass a status pipe and append ``--status-fd N`` to argv
    status_pipe: bool = True
    #: a worker's own arguments (argv after ``-m sie.workers.worker_main``): a warm-pool worker can take this
    #: launch instead of a new process (``sie.workers.warm_pool``); None: only a new process will do
    warm_args: tuple[str, ...] | None = None
    #: the (checked, localized) spec document of a replica a shared multi-model process may host instead of a
    #: worker of its own (``sie.workers.agent.shared``); None: a process of its own
    shared_spec: Mapping[str, Any] | None = None

    def standby(self) -> LaunchSpec | None:
        """This launch as a successor that loads, then waits for ``ProcessHandle.serve`` (``--standby``), or
        None if it cannot wait that way (a shared process's lane, a connector: they stop, then start)."""
        if self.warm_args is None or self.shared_spec is not None:
            return None
        return replace(self, argv=(*self.argv, "--standby"), warm_args=(*self.warm_args, "--standby"))


class ProcessHandle(Protocol):
    """A started process as the supervisor sees it."""

    pid: int

    def poll(self) -> ExitInfo | None:
        """Exit information once the process has ended (reaped), else None. Never blocks."""

    def events(self) -> list[dict[str, Any]]:
        """Status lines received since the last call (parsed JSON objects). Never blocks."""

    def terminate(self) -> None:
        """Ask to stop (SIGTERM): the worker drains and exits."""

    def kill(self) -> None:
        """Stop now (SIGKILL)."""

    def hand_over(self) -> None:
        """Stop for a loaded successor (SIGUSR2): drain like ``terminate``; the worker keeps its static group
        membership for the successor while the group is settled (``sie.streams.eos.stage.leaves_group``)."""

    def serve(self) -> None:
        """Start serving (SIGUSR1): a ``--standby`` worker whose predecessor released the replica."""

    def log_tail(self, lines: int = 5) -> str:
        """Last lines of the process's stdout/stderr log (for crash reasons)."""


class ProcessLauncher(Protocol):
    def start(self, spec: LaunchSpec) -> ProcessHandle:
        """Start a process; raises OSError if it cannot be spawned."""


def describe_exit(returncode: int) -> ExitInfo:
    """Decode Popen's returncode (negative = killed by that signal) into a cause a human can act on."""
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        if signum == signal.SIGKILL:
            cause = "killed by SIGKILL (OOM killer or operator)"
        else:
            cause = f"killed by {name}"
        return ExitInfo(exit_code=None, signal=signum, cause=cause)
    if returncode == 0:
        return ExitInfo(exit_code=0, signal=None, cause="exited with code 0")
    return ExitInfo(exit_code=returncode, signal=None, cause=f"exited with code {returncode}")


def _load_prctl() -> Any:
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:  # not Linux: no parent-death signal
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    return getattr(libc, "prctl", None)


# Resolved once in the parent: the preexec function must not import or allocate much after fork().
_PRCTL = _load_prctl()


def pdeathsig_preexec(parent_pid: int, no_new_privs: bool = False) -> Any:
    """A preexec_fn that makes the child die with SIGKILL when its parent (thread) dies (and, ``no_new_privs``,
    can never gain privileges through a set-user-ID or file-capability program: a worker).

    Popen runs it after switching to ``user``/``group`` (a uid change clears the parent-death signal, prctl(2)).
    The getppid check closes the race where the parent died between fork() and prctl().
    """

    def _preexec() -> None:
        if _PRCTL is not None:
            if no_new_privs:
                _PRCTL(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return _preexec


class SubprocessHandle:
    """A real child process: Popen plus a reader thread for its status pipe.  ``warm``: the process was
    started ahead of time by the warm pool and handed this replica (``assign``) instead of being spawned
    for it."""

    warm = False

    def __init__(self, popen: subprocess.Popen[bytes], status_fd: int | None, log_path: Path | None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._group_killed = False
        self._log_path = log_path
        self._events: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        if status_fd is not None:
            self._reader = threading.Thread(target=self._read, args=(status_fd,), name=f"status-{self.pid}", daemon=True)
            self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("worker %s: not a status line: %r", self.pid, line[:200])
                    continue
                if isinstance(event, dict):
                    with self._lock:
                        self._events.append(event)

    def poll(self) -> ExitInfo | None:
        returncode = self._popen.poll()
        if returncode is None:
            return None
        self._kill_group()
        if self._reader is not None:
            self._reader.join(timeout=1.0)  # EOF follows exit; keep the last lines (e.g. the error event)
        return describe_exit(returncode)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            drained = list(self._events)
            self._events.clear()
        return drained

    def _signal(self, signum: int) -> None:
        if self._popen.returncode is None:
            try:
                self._popen.send_signal(signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def hand_over(self) -> None:
        self._signal(signal.SIGUSR2)

    def serve(self) -> None:
        self._signal(signal.SIGUSR1)

    def assign(self, payload: Mapping[str, Any], log_path: Path | None) -> None:
        """Hand a waiting warm worker its replica: one JSON line on its stdin (OSError if it is gone).
        Its output goes to ``log_path`` from now on (the worker redirects itself), so crash reasons quote
        the replica's log."""
        stdin = self._popen.stdin
        if stdin is None:
            raise OSError(f"worker {self.pid} was not started to wait for an assignment")
        stdin.write(json.dumps(dict(payload)).encode() + b"\n")
        stdin.flush()
        stdin.close()
        self.warm = True
        self._log_path = log_path

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self._kill_group()

    def _kill_group(self) -> None:
        """SIGKILL what is left of the worker's process group (it leads one: ``start_new_session``).  The
        worker's own children die with it (PDEATHSIG), but not theirs: a SIGKILLed worker left vLLM's
        engine and ``resource_tracker`` processes (its server's children) orphaned.  Sent when the worker is
        killed and once its exit is seen: while any member lives the kernel does not reuse the group's id."""
        if self._group_killed:
            return
        self._group_killed = True
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # nothing left in the group (or not ours)
            pass

    def log_tail(self, lines: int = 5) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.strip().splitlines()[-lines:])


class SubprocessLauncher:
    """Starts real processes with PDEATHSIG, no_new_privs, a status pipe and a log file (``keep_stdin``: a pipe to
    the child's stdin stays open, for the warm pool's workers that wait for an assignment there).  ``user``: the
    child runs as that uid/gid, its folder and log prepared for it (``sie.workers.worker_user``)."""

    def __init__(self, keep_stdin: bool = False, user: WorkerUser | None = None) -> None:
        self.keep_stdin = keep_stdin
        self.user = user

    def start(self, spec: LaunchSpec) -> SubprocessHandle:
        argv = list(spec.argv)
        read_fd = write_fd = None
        if spec.status_pipe:
            read_fd, write_fd = os.pipe()
            argv += ["--status-fd", str(write_fd)]
        log_file = None
        if spec.log_path is not None:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            if self.user is not None:
                self.user.prepare_folder(spec.log_path.parent)
                self.user.prepare_log(spec.log_path)
            log_file = open(spec.log_path, "ab")
        if self.user is not None and spec.cwd is not None:
            self.user.prepare_folder(Path(spec.cwd))
        try:
            popen = subprocess.Popen(
                argv,
                env=dict(spec.env),  # built from an allow-list by the caller; never the agent's whole environment
                cwd=spec.cwd,
                stdin=subprocess.PIPE if self.keep_stdin else subprocess.DEVNULL,
                stdout=log_file if log_file is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,) if write_fd is not None else (),
                preexec_fn=pdeathsig_preexec(os.getpid(), no_new_privs=True),
                start_new_session=True,  # a Ctrl-C on the agent's terminal reaches the agent only; it drains workers
                **(self.user.popen_kwargs() if self.user is not None else {}),
            )
        except OSError:
            if read_fd is not None:
                os.close(read_fd)
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)  # the child holds its copy; EOF on read_fd then means "child gone"
            if log_file is not None:
                log_file.close()
        return SubprocessHandle(popen, read_fd, spec.log_path)


def spawn_child(argv: Sequence[str], env: Mapping[str, str] | None = None, log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a helper process that dies with its parent (used by a worker for its SGLang server).  ``env`` None:
    the allow-list of ``child_environment`` (never the worker's whole environment, its credentials among it)."""
    from sie.kernel.settings import child_environment

    log_file = open(log_path, "ab") if log_path is not None else None
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else child_environment(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=log_file if log_file is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=pdeathsig_preexec(os.getpid()),
        )
    finally:
        if log_file is not None:
            log_file.close()
