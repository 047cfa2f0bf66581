"""The agent's shared multi-model worker processes (``SIE_SHARED_PROCESSES`` > 0; docs/density.md).

WHY a launcher: the supervisor's state machine (``sie.workers.supervisor``) only talks to a
``ProcessLauncher`` and the ``ProcessHandle`` it returns.  ``SharedLauncher`` takes the launches the command
builder marked as shareable (``LaunchSpec.shared_spec``: P1/P2 torch/python models without whole GPUs,
``sie.schemas.spec_models.may_share_process``) and, instead of spawning a worker, writes the replica into
the ``models.json`` of a shared process (``python -m sie.workers.multimodel``) with a free slot, starting one
when none has room.  Every other launch goes to the launcher it wraps, unchanged.  So restarts, backoff,
drain, liveness and crash reasons stay the supervisor's, one rule for dedicated and shared replicas.

What a ``SharedHandle`` reports, read from the process's ``health.json`` (rewritten every tick):

    lane STARTING (first)    -> {"event": "loading"}
    lane READY (first time)  -> {"event": "ready", "metrics_port": <the process's /metrics>}
    health rewritten         -> {"event": "progress", records, lag, p99_ms, rate}   (liveness)
    lane CRASHED             -> {"event": "error", detail}  (the lane's own thread restarts it)
    lane FAILED / refused    -> poll() returns an exit: the replica is CRASHED and relaunched
    process exited           -> poll() returns that exit for EVERY replica it hosted

``terminate`` removes the replica from ``models.json`` (its lane drains: the batch in flight commits) and
``poll`` reports exit 0 once the health no longer lists it; ``kill`` removes it and reports the exit at
once (and SIGKILLs the whole process if its health went stale: a hung process, not a hung lane).  A
process in which a lane FAILED (hung ``MAX_HANGS`` times) or was killed is sealed: it keeps its other
replicas but takes no new one, so the relaunch runs in another process (whose producer fences whatever
the abandoned lane left open) and the sealed one is stopped when its last replica leaves.  A dead
process is restarted once, by the first of its replicas the supervisor relaunches; the others join it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sie.workers.multimodel.desired import HEALTH_FILE, DesiredModel, write_desired
from sie.workers.process import LaunchSpec, ProcessHandle, ProcessLauncher, SubprocessLauncher
from sie.workers.replica import ExitInfo

log = logging.getLogger("sie.agent.shared")

#: the entry point of a shared process
SHARED_MODULE = "sie.workers.multimodel"


@dataclass
class SharedProcess:
    """One shared worker process of this agent: its id (``shared-<n>``, reused by its restart), state
    directory, the replicas it should host and the running incarnation (None: not started or exited)."""

    process_id: str
    state_dir: Path
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: replica id -> its folder (where the agent prepares a rollout's other version for it)
    dirs: dict[str, str] = field(default_factory=dict)
    handle: ProcessHandle | None = None
    starts: int = 0
    #: SIGTERM sent (it hosts nothing): not given new replicas, restarted under its id once it exited
    stopping: bool = False
    #: took no new replicas since one of its lanes FAILED or was killed (hung threads may remain in it): the
    #: replica is relaunched in another process and this one retires with its last replica
    sealed: bool = False
    _health: dict[str, Any] = field(default_factory=dict)
    _health_mtime: int = -1
    _health_seen_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.handle is not None and self.handle.poll() is None

    def write_members(self) -> None:
        write_desired(self.state_dir, [DesiredModel(rid, spec, self.dirs.get(rid))
                                       for rid, spec in sorted(self.members.items())])

    def conflict(self, roots: Mapping[str, str]) -> str | None:
        """Why a model importing ``roots`` (``import_roots``) cannot join this process: one of its top-level
        packages is already imported here from other code (Python imports a package once per process)."""
        for rid, spec in sorted(self.members.items()):
            for name, origin in import_roots(spec).items():
                if name in roots and roots[name] != origin:
                    return (f"package {name!r} of {rid} comes from {origin}, this model's from {roots[name]} "
                            f"(one process imports a package once)")
        return None

    def health(self, now: float) -> dict[str, Any]:
        """The process's last ``health.json`` (re-read only when it changed); {} before the first one."""
        path = self.state_dir / HEALTH_FILE
        try:
            mtime = path.stat().st_mtime_ns
            if mtime != self._health_mtime:
                doc = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(doc, dict):
                    self._health, self._health_mtime, self._health_seen_at = doc, mtime, now
        except (OSError, ValueError):  # not written yet, or caught between writes (it is replaced atomically)
            pass
        return self._health

    def stale_for(self, now: float) -> float:
        """Seconds since the health last changed (a process that stopped ticking is hung)."""
        return now - self._health_seen_at


class SharedProcesses:
    """The agent's shared processes: which replica is hosted where, starting and restarting processes."""

    def __init__(self, slots: int, work_dir: Path, python: str, env: dict[str, str],
                 metrics_port: Callable[[str], int | None] = lambda _pid: 0,
                 launcher: ProcessLauncher | None = None, clock: Callable[[], float] = time.monotonic,
                 stale_s: float = 10.0) -> None:
        if slots < 1:
            raise ValueError(f"SharedProcesses: slots must be >= 1 (got {slots})")
        self.slots = slots
        self.work_dir = work_dir
        self.python = python
        self.env = env
        self._metrics_port = metrics_port
        self._launcher = launcher or SubprocessLauncher()
        self._clock = clock
        #: seconds without a new health.json after which ``kill`` takes the whole process down
        self.stale_s = stale_s
        self.processes: dict[str, SharedProcess] = {}
        #: replica id -> why it is not hosted in some running shared process (its packages conflict there);
        #: the agent reports it with the replica (``sie get replicas``/``describe``)
        self.placed_apart: dict[str, str] = {}

    # -- placement ----------------------------------------------------------------------------------
    def _pick(self, replica_id: str, spec_doc: dict[str, Any]) -> SharedProcess:
        """A running process with a free slot whose models import nothing this one imports from other code
        (the fullest: fewer processes), else a stopped one (its restart, reusing its id), else a new one."""
        for proc in self.processes.values():  # a relaunch of a replica moves it, never doubles it
            if proc.members.pop(replica_id, None) is not None:
                proc.dirs.pop(replica_id, None)
                if proc.running:
                    proc.write_members()
        roots = import_roots(spec_doc)
        conflicts = {p.process_id: why for p in self.processes.values() if (why := p.conflict(roots))}
        for process_id, why in sorted(conflicts.items()):
            log.info("replica %s: not hosted in shared process %s: %s", replica_id, process_id, why)
        self.placed_apart[replica_id] = "; ".join(f"{pid}: {why}" for pid, why in sorted(conflicts.items()))
        running = [p for p in self.processes.values() if p.running and not p.stopping and not p.sealed
                   and len(p.members) < self.slots and p.process_id not in conflicts]
        if running:
            return max(running, key=lambda p: (len(p.members), p.process_id))
        stopped = [p for p in self.processes.values()
                   if not p.running and len(p.members) < self.slots and p.process_id not in conflicts]
        if stopped:
            return min(stopped, key=lambda p: p.process_id)
        n = 0
        while f"shared-{n}" in self.processes:
            n += 1
        proc = SharedProcess(f"shared-{n}", self.work_dir / "shared" / f"shared-{n}")
        self.processes[proc.process_id] = proc
        return proc

    def place(self, replica_id: str, spec_doc: dict[str, Any],
              folder: str | None = None) -> tuple[SharedProcess, ProcessHandle]:
        """Host ``replica_id`` in a shared process: written into its ``models.json``, the process started if
        it is not running (OSError if it cannot be).  ``folder``: the replica's folder (companion versions)."""
        proc = self._pick(replica_id, spec_doc)
        proc.members[replica_id] = spec_doc
        if folder:
            proc.dirs[replica_id] = folder
        proc.write_members()
        if not proc.running:
            try:
                proc.handle = self._start(proc)
            except OSError:
                proc.members.pop(replica_id, None)
                proc.dirs.pop(replica_id, None)
                raise
        assert proc.handle is not None
        return proc, proc.handle

    def _start(self, proc: SharedProcess) -> ProcessHandle:
        port = self._metrics_port(proc.process_id)
        argv = (self.python, "-P", "-m", SHARED_MODULE, "--state-dir", str(proc.state_dir),
                *(("--metrics-port", str(port)) if port is not None else ()))
        (proc.state_dir / HEALTH_FILE).unlink(missing_ok=True)  # nothing of the last incarnation is read
        proc._health, proc._health_mtime, proc._health_seen_at = {}, -1, self._clock()
        proc.stopping = proc.sealed = False
        handle = self._launcher.start(LaunchSpec(name=proc.process_id, argv=argv, env=self.env,
                                                 cwd=str(proc.state_dir), log_path=proc.state_dir / "process.log",
                                                 status_pipe=False))
        proc.starts += 1
        log.info("shared process %s: %s (pid %s) hosting %s", proc.process_id,
                 "started" if proc.starts == 1 else "restarted", handle.pid, sorted(proc.members))
        return handle

    def remove(self, proc: SharedProcess, replica_id: str) -> None:
        """Stop hosting ``replica_id`` (its lane drains); a process left with no replica is stopped."""
        if proc.members.pop(replica_id, None) is None:
            return
        proc.dirs.pop(replica_id, None)
        self.placed_apart.pop(replica_id, None)
        if proc.running:
            proc.write_members()

    def seal(self, proc: SharedProcess, why: str) -> None:
        if not proc.sealed:
            log.warning("shared process %s: %s; it takes no new replicas (a new process will)", proc.process_id, why)
            proc.sealed = True

    def maintain(self) -> None:
        """Stop running processes that host no replica any more (their runtime is memory for nothing)."""
        for proc in self.processes.values():
            if not proc.members and not proc.stopping and proc.running and proc.handle is not None:
                log.info("shared process %s: hosts no replica; stopping it", proc.process_id)
                proc.stopping = True
                proc.handle.terminate()

    def held_memory_mb(self, per_model_mb: int) -> int:
        """Host memory the running shared processes hold beyond what placement charges their replicas (each
        replica: its declared ``memoryMb`` + ``SIE_MODEL_OVERHEAD_MB``): the runtime of each process, which
        placement does not split among its models, so the agent reports it as held (``reserved_memory_mb``).
        From each process's own ``rss_mb`` in its health (0 before its first health)."""
        held = 0
        for proc in self.processes.values():
            rss = proc._health.get("rss_mb") if proc.running else None
            if not isinstance(rss, (int, float)) or isinstance(rss, bool):
                continue
            charged = sum(per_model_mb + _declared_mb(spec) for spec in proc.members.values())
            held += max(0, int(rss) - charged)
        return held

    def by_replica(self) -> dict[str, str]:
        """replica id -> the id of the shared process hosting it (heartbeats' ``process``)."""
        return {rid: proc.process_id for proc in self.processes.values() for rid in proc.members}

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every process (SIGTERM: each lane commits its batch), SIGKILL what is left after ``timeout_s``."""
        running = [p.handle for p in self.processes.values() if p.handle is not None and p.running]
        for handle in running:
            handle.terminate()
        deadline = self._clock() + timeout_s
        while any(h.poll() is None for h in running) and self._clock() < deadline:
            time.sleep(0.05)  # production shutdown pacing (not test synchronisation)
        for handle in running:
            if handle.poll() is None:
                handle.kill()


def import_roots(spec_doc: Mapping[str, Any]) -> dict[str, str]:
    """Top-level packages a model's worker imports its code from, and where from: ``bundle <sha256>`` for a
    module archive (``backend.modules`` / its verified copy), ``folder <dir>`` for code next to a spec applied
    from a file, ``installed`` for the node's environment.  A model with an artifact and no code imports
    nothing of its own ({})."""
    backend = spec_doc.get("backend") if isinstance(spec_doc.get("backend"), Mapping) else {}
    assert isinstance(backend, Mapping)
    refs = [backend.get(k) for k in ("module_class", "callable")]
    names = {r.partition(":")[0].split(".")[0] for r in refs if isinstance(r, str) and ":" in r}
    if not names:
        return {}
    modules = backend.get("modules")
    if isinstance(modules, Mapping) and isinstance(modules.get("sha256"), str):
        origin = f"bundle {modules['sha256']}"
    elif isinstance(backend.get("modules_path"), str):
        origin = f"bundle {Path(str(backend['modules_path'])).parent.name}"
    elif isinstance(spec_doc.get("source"), str) and not str(spec_doc["source"]).startswith("<"):
        origin = f"folder {Path(str(spec_doc['source'])).parent}"
    else:
        origin = "installed"
    return {name: origin for name in sorted(names)}


def _declared_mb(spec: dict[str, Any]) -> int:
    memory = (spec.get("resources") or {}).get("memory_mb") if isinstance(spec.get("resources"), dict) else None
    return memory if type(memory) is int and memory > 0 else 0


class SharedHandle:
    """One replica hosted in a shared process, as the supervisor's ``ProcessHandle`` (module docstring)."""

    warm = False

    def __init__(self, pool: SharedProcesses, proc: SharedProcess, process: ProcessHandle, replica_id: str) -> None:
        self._pool = pool
        self._proc = proc
        #: the incarnation this replica was placed in: its exit is this replica's exit, even once restarted
        self._process: ProcessHandle = process
        self.replica_id = replica_id
        self.pid = process.pid
        self.process_id = proc.process_id
        self._ready = self._loading = False
        self._seen_at: Any = None
        self._removed_at: float | None = None  # wall time of terminate (health "at" is wall time)
        self._exit: ExitInfo | None = None

    def _lane(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        health = self._proc.health(self._pool._clock()) if self._proc.handle is self._process else {}
        lanes = health.get("lanes") if isinstance(health.get("lanes"), dict) else {}
        lane = lanes.get(self.replica_id) if lanes else None
        return health, lane if isinstance(lane, dict) else None

    def poll(self) -> ExitInfo | None:
        if self._exit is not None:
            return self._exit
        ended = self._process.poll()
        if ended is not None:
            self._exit = replace(ended, cause=f"shared process {self.process_id} (pid {self.pid}) {ended.cause}")
            self._pool.remove(self._proc, self.replica_id)
            return self._exit
        health, lane = self._lane()
        if self._removed_at is not None:
            draining = health.get("draining") if isinstance(health.get("draining"), dict) else {}
            at = health.get("at")
            if isinstance(at, (int, float)) and at > self._removed_at and lane is None \
                    and self.replica_id not in (draining or {}):
                self._exit = ExitInfo(exit_code=0, signal=None, cause="drained from its shared process")
            return self._exit
        refused = health.get("refused") if isinstance(health.get("refused"), dict) else {}
        why = (refused or {}).get(self.replica_id)
        if why is None and lane is not None and lane.get("state") == "FAILED":
            why = f"its lane FAILED: {lane.get('last_error')}"
        if why is not None:
            if lane is not None:
                self._pool.seal(self._proc, f"lane of {self.replica_id} FAILED")
            self._pool.remove(self._proc, self.replica_id)
            self._exit = ExitInfo(exit_code=1, signal=None, cause=f"shared process {self.process_id}: {why}")
        return self._exit

    def events(self) -> list[dict[str, Any]]:
        health, lane = self._lane()
        if lane is None or self._removed_at is not None:
            return []
        at = health.get("at")
        if at == self._seen_at:
            return []
        self._seen_at = at
        state = lane.get("state")
        numbers = {k: lane.get(k) for k in ("records", "lag", "p99_ms", "rate", "versions", "outage")}
        if state == "STARTING" and not self._loading:
            self._loading = True
            return [{"event": "loading", "pid": self.pid, "replica": self.replica_id, "model": lane.get("model")}]
        if state == "READY" and not self._ready:
            self._ready = True
            return [{"event": "ready", "metrics_port": health.get("metrics_port"), **numbers}]
        if state == "READY":
            return [{"event": "progress", **numbers}]
        if state == "CRASHED":
            return [{"event": "error", "detail": f"lane crashed: {lane.get('last_error')}"}]
        return []

    def terminate(self) -> None:
        if self._removed_at is None:
            self._removed_at = time.time()
            self._pool.remove(self._proc, self.replica_id)

    def hand_over(self) -> None:
        """A lane has no standby successor (``LaunchSpec.standby`` is None for shared launches): it drains and
        leaves the group, as on ``terminate``."""
        self.terminate()

    def serve(self) -> None:
        """Never started in standby (see ``hand_over``): nothing to release."""

    def kill(self) -> None:
        """Stop hosting it now (its lane is abandoned, fenced by the next one); a process whose health went
        stale is hung as a whole and is SIGKILLed (every replica it hosted sees that exit)."""
        if self._exit is not None:
            return
        if self._removed_at is None and self._proc.handle is self._process:  # hung or never ready, not a slow drain
            self._pool.seal(self._proc, f"{self.replica_id} was killed by the supervisor")
        self._pool.remove(self._proc, self.replica_id)
        if self._proc.handle is self._process and self._proc.stale_for(self._pool._clock()) > self._pool.stale_s:
            log.warning("shared process %s: no health for %.0fs; SIGKILL", self.process_id,
                        self._proc.stale_for(self._pool._clock()))
            self._process.kill()
        self._exit = ExitInfo(exit_code=None, signal=None, cause=f"removed from shared process {self.process_id}")

    def log_tail(self, lines: int = 5) -> str:
        return self._process.log_tail(lines)


class SharedLauncher:
    """A ``ProcessLauncher``: shareable launches (``spec.shared_spec``) go into a shared process, the rest to
    ``dedicated`` (a warm pool or new processes)."""

    def __init__(self, pool: SharedProcesses, dedicated: ProcessLauncher) -> None:
        self.pool = pool
        self.dedicated = dedicated

    def start(self, spec: LaunchSpec) -> ProcessHandle:
        if spec.shared_spec is None:
            return self.dedicated.start(spec)
        proc, process = self.pool.place(spec.name, dict(spec.shared_spec), spec.cwd)
        log.info("replica %s: hosted in shared process %s (pid %s)", spec.name, proc.process_id, process.pid)
        return SharedHandle(self.pool, proc, process, spec.name)


def live_process_ids(pool: SharedProcesses | None) -> Iterable[str]:
    """Ids of the shared processes running now (their /metrics ports stay taken)."""
    return [] if pool is None else [p.process_id for p in pool.processes.values() if p.running]
