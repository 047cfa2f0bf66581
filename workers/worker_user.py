"""The unprivileged user an agent runs its workers as (``SIE_WORKER_UID``/``SIE_WORKER_GID``).

Workers run any team's uploaded model code.  Under the agent's own uid that code could read every file the
agent can, the agent's Kafka password above all.  With a worker user the agent (root in its container, with
only CAP_SETUID, CAP_SETGID and CAP_CHOWN on Kubernetes) starts each worker as that uid and gid, with no
supplementary group and ``no_new_privs``, and hands it only what it needs::

    start(launch):                                  # SubprocessLauncher with a WorkerUser
        replica folder  <- owner agent, group worker gid, 0770   (the worker reads its spec, writes files)
        worker.log      <- owner agent, group worker gid, 0660   (the worker's output; the agent reads tails)
        fork; setgroups([]); setregid(gid); setreuid(uid); prctl(NO_NEW_PRIVS, PDEATHSIG); exec
    command builder:
        worker's password file (the workers' principal, SIE_WORKER_SASL_PASSWORD_FILE) -> copied to
        <node work dir>/worker-kafka-password, owner worker uid, 0400; the worker's SIE_SASL_PASSWORD_FILE names it

The agent's own secret files stay as the chart mounts them (0400, owner root): the worker's uid is neither
their owner nor in their group, so ``open()`` fails with EACCES.

| failure | what happens |
|---|---|
| the agent lacks CAP_SETUID/CAP_SETGID/CAP_CHOWN | ``sie agent`` stops at start naming the capabilities (``check_can_switch``) |
| the artifact cache folder belongs to another uid or is writable by others | ``sie agent`` stops at start (``own_folder``): a worker could have planted files under final names |
| the worker's password file cannot be read by the agent | the launch fails (a crash with the reason, retried with backoff) |
| no worker user configured (laptops, non-root agents) | workers run as the agent's uid: no file separation (docs/security.md) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.kernel.errors import ConfigError

#: the capabilities the agent needs to start workers as another user (capabilities(7) bit numbers)
NEEDED_CAPS = {"CAP_CHOWN": 0, "CAP_SETGID": 6, "CAP_SETUID": 7}
#: the copy of the workers' Kafka password the agent hands its workers, in the node's work directory
CREDENTIAL_FILE = "worker-kafka-password"


@dataclass(frozen=True)
class WorkerUser:
    """The uid/gid workers run as."""

    uid: int
    gid: int

    @classmethod
    def from_settings(cls, settings: Any) -> WorkerUser | None:
        """``SIE_WORKER_UID``/``SIE_WORKER_GID``, or None when no worker user is configured."""
        if settings.worker_uid is None:
            return None
        return cls(settings.worker_uid, settings.worker_gid or settings.worker_uid)

    def popen_kwargs(self) -> dict[str, Any]:
        """``subprocess.Popen`` arguments that start the child as this user with no supplementary group (the
        pod's fsGroup, which may read the agent's secrets, is dropped)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def prepare_folder(self, folder: Path) -> None:
        """A folder the worker reads and writes (its replica's): the agent keeps owning it, the worker's group
        gets rwx, nobody else anything."""
        folder.mkdir(parents=True, exist_ok=True)
        adopt(folder, self.uid)
        os.chown(folder, -1, self.gid)
        os.chmod(folder, 0o770)

    def prepare_log(self, path: Path) -> None:
        """The worker's log: the agent opens it for the worker's stdout and reads its tail, the worker (re)opens
        it to append (a warm-pool worker taking a replica)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o660)
        try:
            os.fchown(fd, -1, self.gid)
            os.fchmod(fd, 0o660)
        finally:
            os.close(fd)

    def write_secret(self, path: Path, text: str) -> None:
        """``text`` into ``path``, owned by the worker's uid, mode 0400: readable by the workers and nobody else
        (the agent, root without CAP_DAC_OVERRIDE on Kubernetes, never reads it back).  Atomic: a worker never
        reads half a password.  The mode is set while the agent still owns the file: after the chown only the
        worker (or CAP_FOWNER, which the chart's agent lacks) could change it."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fchmod(fd, 0o400)
            os.fchown(fd, self.uid, self.gid)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def adopt(folder: Path, worker_uid: int) -> None:
    """Make ``folder`` and what it holds the agent's where an agent run as another user made them (a hostPath work
    directory kept across the upgrade from a non-root agent): root without CAP_DAC_OVERRIDE could not write
    them.  The worker's own files stay the worker's; links are never followed."""
    me = os.geteuid()
    for path in (folder, *folder.iterdir()):
        info = path.lstat()
        if info.st_uid not in (me, worker_uid) and not path.is_symlink():
            os.chown(path, me, -1, follow_symlinks=False)


def own_folder(folder: Path) -> None:
    """Make ``folder`` the agent's own before any worker runs, or refuse: the artifact cache trusts a file under its
    final name as verified, so a cache folder a worker made first (in a pod's world-writable ``emptyDir``) could
    hold its files under another model's names."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    info = folder.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(f"{folder} belongs to uid {info.st_uid} or is writable by others (mode "
                          f"{info.st_mode & 0o777:o}): with SIE_WORKER_UID the agent keeps its artifact cache to "
                          "itself; remove the folder and start the agent again")


def effective_caps(status: str | None = None) -> int:
    """This process's effective capability set (``CapEff`` of /proc/self/status; 0 where unreadable)."""
    try:
        text = status if status is not None else Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_can_switch(user: WorkerUser, status: str | None = None) -> None:
    """Refuse to start an agent whose workers could not be started as ``user`` (ConfigError naming the fix)."""
    caps = effective_caps(status)
    missing = [name for name, bit in NEEDED_CAPS.items() if not caps >> bit & 1]
    if missing:
        raise ConfigError(f"SIE_WORKER_UID={user.uid}: this agent (uid {os.geteuid()}) lacks {', '.join(missing)} "
                          "to start its workers as that user; run the agent as root with only CAP_SETUID, "
                          "CAP_SETGID and CAP_CHOWN (the chart's agent.workerUid does), or unset SIE_WORKER_UID")
