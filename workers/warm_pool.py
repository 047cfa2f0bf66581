"""The agent's warm pool: worker processes started ahead of time, runtime imported, waiting for a replica.

WHY: most of a cold replica start is not the model.  Starting the interpreter and importing torch, the
backends, the scorer and the Kafka client takes seconds, the model load and the readiness inference of a
small model milliseconds (docs/elasticity.md, "Warm pool"; bench/bench_elasticity.py).  A warm worker
has done the imports already (``worker_main --warm``) and waits on its stdin; a placement takes it
(``PooledLauncher``) and the worker goes straight to reading the spec, applying the node's spec policy,
loading the backend and proving readiness.

Rules:

* ``size`` processes are kept (``sie agent --warm-pool N``; 0 = no pool, every start is cold).  A worker
  counts as warm once it reported ``{"event": "warm"}``; only warm ones are handed out.
* After a worker is taken, its replacement is started only ``refill_delay_s`` later, one per loop pass:
  importing torch takes a core for seconds, and the replica that was just placed should have it first.
* A pool worker that dies is replaced after ``backoff_s`` (a pool that cannot start, e.g. a broken
  environment, costs one attempt per backoff, never a spawn loop); the pool's health says why.
* The host memory the pool holds (resident set of its processes) is reported in every heartbeat
  (``reserved_memory_mb``), and the control plane's placement subtracts it from the node's memory.
  GPU memory: none, a warm worker has not touched CUDA.
* Workers are started from the agent's loop thread (PR_SET_PDEATHSIG: they die with the agent) through the
  same ``ProcessLauncher`` wrapper as every other process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.workers.process import LaunchSpec, ProcessHandle, ProcessLauncher, SubprocessLauncher
from sie.workers.supervisor import Clock, MonotonicClock

log = logging.getLogger(__name__)

WORKER_MODULE = "sie.workers.worker_main"


def rss_mb(pid: int) -> int:
    """Resident memory of a process in MiB (0 when it cannot be read, e.g. it just exited)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)


@dataclass
class _PoolWorker:
    handle: Any
    started_at: float
    warm_at: float | None = None
    import_s: float | None = None


class WarmPool:
    """``size`` pre-started workers (module docstring).  ``maintain()`` is called from the agent's loop."""

    def __init__(self, size: int, env: Mapping[str, str], log_dir: Path, python: str = sys.executable,
                 clock: Clock | None = None, launcher: ProcessLauncher | None = None, refill_delay_s: float = 3.0,
                 backoff_s: float = 5.0, rss: Callable[[int], int] = rss_mb) -> None:
        if size < 0:
            from sie.kernel.errors import ConfigError

            raise ConfigError(f"warm pool size: must be >= 0 (got {size})")
        self.size = size
        self.env = dict(env)
        self.log_dir = log_dir
        self.python = python
        self._clock = clock or MonotonicClock()
        self._launcher = launcher or SubprocessLauncher(keep_stdin=True)
        self.refill_delay_s = refill_delay_s
        self.backoff_s = backoff_s
        self._rss = rss
        self._workers: list[_PoolWorker] = []
        self._next_spawn = 0.0
        self._spawned = 0
        self.taken = 0
        self.deaths = 0
        self.last_error: str | None = None
        self.import_s: float | None = None

    # -- the agent's loop ----------------------------------------------------------------------------
    def maintain(self) -> None:
        """Note warm reports, replace dead workers (after a backoff), start at most one new worker."""
        now = self._clock.monotonic()
        for worker in list(self._workers):
            for event in worker.handle.events():
                if event.get("event") == "warm" and worker.warm_at is None:
                    worker.warm_at = now
                    worker.import_s = event.get("import_s")
                    self.import_s = worker.import_s
                elif event.get("event") == "error":
                    self.last_error = str(event.get("detail"))
            exit_info = worker.handle.poll()
            if exit_info is not None:
                self._workers.remove(worker)
                self.deaths += 1
                tail = worker.handle.log_tail(3)
                self.last_error = f"pool worker {worker.handle.pid} {exit_info.cause}" + (f": {tail}" if tail else "")
                log.warning("warm pool: %s; next start in %gs", self.last_error, self.backoff_s)
                self._next_spawn = max(self._next_spawn, now + self.backoff_s)
        if len(self._workers) < self.size and now >= self._next_spawn:
            self._spawn(now)

    def _spawn(self, now: float) -> None:
        index = self._spawned
        self._spawned += 1
        # ``-P`` and a folder of its own, as a cold worker (launch.py): nothing near the agent is on its sys.path;
        # it moves to the replica's folder when it takes a replica (``take_assignment``)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec = LaunchSpec(name=f"warm-{index}", argv=(self.python, "-P", "-m", WORKER_MODULE, "--warm"), env=self.env,
                          cwd=str(self.log_dir), log_path=self.log_dir / f"warm-{index % max(1, 2 * self.size)}.log")
        try:
            handle = self._launcher.start(spec)
        except OSError as exc:
            self.last_error = f"could not start a pool worker: {exc}"
            log.warning("warm pool: %s", self.last_error)
            self._next_spawn = now + self.backoff_s
            return
        self._workers.append(_PoolWorker(handle, now))

    def take(self) -> Any | None:
        """The longest-waiting warm worker (removed from the pool), or None when none is warm yet."""
        warm = [w for w in self._workers if w.warm_at is not None]
        if not warm:
            return None
        worker = min(warm, key=lambda w: w.warm_at or 0.0)
        self._workers.remove(worker)
        self.taken += 1
        self._next_spawn = max(self._next_spawn, self._clock.monotonic() + self.refill_delay_s)
        return worker.handle

    # -- reporting -----------------------------------------------------------------------------------
    def ready(self) -> int:
        return sum(1 for w in self._workers if w.warm_at is not None)

    def memory_mb(self) -> int:
        """Host memory the pool's processes hold now (what placement must not hand out)."""
        return sum(self._rss(w.handle.pid) for w in self._workers)

    def status(self) -> dict[str, Any]:
        return {"size": self.size, "warm": self.ready(), "starting": len(self._workers) - self.ready(),
                "taken": self.taken, "deaths": self.deaths, "memory_mb": self.memory_mb(),
                "import_s": self.import_s, "last_error": self.last_error}

    def close(self) -> None:
        """Stop every waiting worker (they hold no replica: nothing to drain)."""
        for worker in self._workers:
            worker.handle.kill()
        self._workers.clear()


class PooledLauncher:
    """A ``ProcessLauncher`` that hands a worker launch to a warm pool worker when one is warm, and starts a
    new process otherwise (``cold``).  Launches that are not workers always start a new process."""

    def __init__(self, pool: WarmPool, cold: ProcessLauncher | None = None) -> None:
        self.pool = pool
        self.cold = cold or SubprocessLauncher()
        self.warm_starts = 0
        self.cold_starts = 0

    def start(self, spec: LaunchSpec) -> ProcessHandle:
        if spec.warm_args is not None:
            handle = self.pool.take()
            if handle is not None:
                env = {k: v for k, v in spec.env.items() if self.pool.env.get(k) != v}
                payload = {"args": list(spec.warm_args), "env": env, "cwd": spec.cwd,
                           "log_path": str(spec.log_path) if spec.log_path is not None else None}
                try:
                    handle.assign(payload, spec.log_path)
                    self.warm_starts += 1
                    log.info("replica %s: warm start in pool worker %s", spec.name, handle.pid)
                    return handle
                except OSError as exc:  # the pool worker died meanwhile: start cold
                    log.warning("replica %s: warm worker %s unusable (%s); starting cold", spec.name, handle.pid, exc)
                    handle.kill()
        self.cold_starts += 1
        return self.cold.start(spec)
