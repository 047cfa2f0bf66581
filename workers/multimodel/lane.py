"""One model inside a multi-model worker process: a "lane".

A lane is what a single-model worker process is, minus the process: the model's backend, loaded and
proven by the readiness inference (``sie.workers.worker_main.load_proven``), and the SAME exactly-once
scorer (``sie.streams.scorer.rollout.run_rollout_scorer`` on ``sie.streams.eos``) with its own consumer
(the model's group, static membership), its own transactional producer (``transactional.id``
``sie.scorer.<model>.<replica_id>``, from ``Names``), its own batching, metrics and dead letters, on its own
thread.  Nothing of the exactly-once cycle is new here; only where it runs is.

Generations.  A lane's thread is a ``SupervisedThread``: when the scorer raises (a fatal Kafka error, a
backend that cannot load) it is restarted with backoff and reported (CRASHED, then STARTING again).  A
thread that HANGS cannot be restarted in place (Python cannot kill a thread), so the watchdog
(``problem``) reports it and ``restart_hung`` starts a new generation: a new thread with a new stop
event, the same replica id, hence the same ``transactional.id`` and ``group.instance.id``.  The new
producer's ``init_transactions`` fences the old one (a commit the hung thread attempts later fails as
fenced, and with its stop event set it never re-initialises), and the new consumer replaces the old
static member, so the model's partitions move to the new generation at once.  The hung thread itself
leaks until its call returns; after ``MAX_HANGS`` hangs the lane is FAILED and left alone (the agent's
remedy is a new process).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sie.kernel.settings import Settings
from sie.kernel.supervised import SupervisedThread
from sie.schemas.replica_state import ReplicaState

log = logging.getLogger("sie.shared.lane")

#: a lane's share of the process: smaller batches and bounded client queues than a dedicated scorer
#: (``ScorerConfig`` defaults: 1024 records, a 16 MiB prefetch, librdkafka's 1 GiB producer queue)
LANE_MAX_BATCH = 256
LANE_FETCH_KBYTES = 1024
#: hangs after which a lane is FAILED instead of restarted again (each hang may leak one thread)
MAX_HANGS = 3


def _no_companion(spec: Any) -> Any:
    raise RuntimeError(f"{spec.name} {spec.version}: this lane was started without a folder for the other "
                       "version of a rollout (it serves its own version only)")


def lane_producer_kbytes(settings: Settings) -> int:
    """The producer queue bound of a lane: 4 MiB, or two of the largest records if that is more."""
    return max(4096, 2 * settings.max_record_bytes // 1024 + 1)


class Lane:
    """One hosted model (module docstring): ``start``, then the host polls ``problem``/``health``."""

    def __init__(self, replica_id: str, spec: Any, *, settings: Settings, policy: Any, weights: Any,
                 metrics: Any, hang_s: float, start_s: float, clock: Callable[[], float] = time.monotonic,
                 scorer_overrides: dict[str, Any] | None = None, companions_dir: Path | None = None) -> None:
        self.replica_id = replica_id
        self.spec = spec
        #: where the agent prepares the other version of a rollout for this replica (``version-<v>.json``);
        #: None: a lane started without an agent serves its own version only
        self.companions_dir = companions_dir
        self._versions: Any = None
        self._settings = settings
        self._policy = policy
        self._weights = weights
        self.metrics = metrics
        self.hang_s = hang_s
        self.start_s = start_s
        self._clock = clock
        self._overrides = scorer_overrides or {}
        self._lock = threading.Lock()
        self.generation = 0
        self.state = ReplicaState.PENDING
        self._since = clock()
        self._started_at = clock()
        self._stop: threading.Event | None = None
        self._thread: SupervisedThread | None = None
        self._counter: Any = None
        #: when the current generation began loading its model (None: not loading): the start deadline
        #: covers the model's own code (load + readiness), never a wait for Kafka (an outage is retried)
        self._loading_since: float | None = None
        self._scorer: Any = None
        self._abandoned: list[SupervisedThread] = []
        self.hangs = 0
        self.crashes = 0
        self.last_error: str | None = None
        self.ready_s: float | None = None
        self.readiness_ms: float | None = None

    @property
    def label(self) -> str:
        return f"replica {self.replica_id}"

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start a new generation (the first, or the replacement of a hung one)."""
        with self._lock:
            self.generation += 1
            gen = self.generation
            stop = threading.Event()
            self._stop = stop
            self._counter = self._scorer = self._loading_since = None
            self._started_at = self._clock()
            self._set(gen, ReplicaState.STARTING)
            self._thread = SupervisedThread(f"lane {self.replica_id}#{gen}", lambda: self._run(gen, stop), stop,
                                            backoff_initial_s=0.5, backoff_max_s=10.0)
        self._thread.start()

    def stop(self) -> None:
        """Drain: the batch in flight commits, the consumer leaves, the thread ends (``finished``)."""
        with self._lock:
            if self._stop is not None:
                self._stop.set()
            if self.state not in (ReplicaState.FAILED, ReplicaState.STOPPED):
                self._set(self.generation, ReplicaState.DRAINING)

    @property
    def finished(self) -> bool:
        """The current generation's thread has ended (a drained or never-started lane)."""
        return self._thread is None or not self._thread.alive

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set(self, gen: int, state: ReplicaState) -> None:
        """Only the current generation moves the lane's state: a fenced, hung one says nothing."""
        if gen == self.generation and state is not self.state:
            self.state = state
            self._since = self._clock()

    # --- the lane's thread -----------------------------------------------------------------------------
    def _config_of(self, spec: Any) -> Any:
        """The spec's backend config; ``threads: 0``: the process caps torch's threads once, for all lanes
        (the torch backend would otherwise set its own count, process-wide, at each model's load)."""
        from sie.workers.backends import backend_config_from_spec

        config = backend_config_from_spec(spec, self._policy)
        return dataclasses.replace(config, config={**config.config, "threads": 0, "replica_id": self.replica_id})

    def _run(self, gen: int, stop: threading.Event) -> None:
        from sie.streams.scorer import ScorerConfig
        from sie.streams.scorer.rollout import InProcessVersions, run_rollout_scorer
        from sie.workers.worker_main import CountingBackend, companion_versions, load_proven

        spec = self.spec
        if gen == self.generation:  # a supervised restart after a crash starts its READY clock again
            self._started_at = self._clock()
        self._set(gen, ReplicaState.STARTING)
        try:
            if gen == self.generation:
                self._loading_since = self._clock()
            try:
                backend, result = load_proven(spec, self._config_of(spec))
            finally:
                if gen == self.generation:
                    self._loading_since = None
            try:
                counter = CountingBackend(backend)
                if gen == self.generation:
                    self._counter, self.readiness_ms = counter, round(result.latency_ms, 3)
                config = ScorerConfig(
                    settings=self._settings, spec=spec, instance=self.replica_id, static_membership=True,
                    max_batch=LANE_MAX_BATCH, fetch_queue_kbytes=LANE_FETCH_KBYTES,
                    producer_buffer_kbytes=lane_producer_kbytes(self._settings), **self._overrides)
                # the other version of a rollout runs in a process of its own (never in this shared one: its
                # imports would meet this process's other models'); a lane without an agent serves its own only
                versions = (companion_versions(self._settings, self.companions_dir, self.label,
                                               threads=self._settings.shared_process_threads)
                            if self.companions_dir is not None else InProcessVersions(_no_companion))
                if gen == self.generation:
                    self._versions = versions
                run_rollout_scorer(config, lambda _spec: counter, stop,
                                   on_ready=lambda scorer: self._ready(gen, scorer), weights=self._weights,
                                   metrics=self.metrics, versions=versions)
            finally:
                backend.close()
        except Exception as exc:
            if gen == self.generation and not stop.is_set():
                self.crashes += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._set(gen, ReplicaState.CRASHED)
            raise
        if gen == self.generation and stop.is_set() and self.state is ReplicaState.DRAINING:
            self._set(gen, ReplicaState.STOPPED)

    def _ready(self, gen: int, scorer: Any) -> None:
        """READY = the readiness inference passed AND the scorer is subscribed (as a single worker); a lane
        asked to stop meanwhile stays DRAINING."""
        stop = self._stop
        if gen != self.generation or (stop is not None and stop.is_set()):
            return
        self._scorer = scorer
        self.ready_s = round(self._clock() - self._started_at, 3)
        self._set(gen, ReplicaState.READY)
        log.info("%s (%s %s) READY in %.3fs", self.label, self.spec.name, self.spec.version, self.ready_s)

    # --- the watchdog's view ----------------------------------------------------------------------------
    def problem(self, now: float | None = None) -> str | None:
        """Why this lane is stuck (an inference call past ``hang_s``, loading + readiness past ``start_s``),
        else None."""
        now = self._clock() if now is None else now
        state, counter = self.state, self._counter
        if state is ReplicaState.READY and counter is not None:
            since = counter.busy_since
            if since is not None and now - since > self.hang_s:
                return f"inference call running for {now - since:.1f}s (deadline {self.hang_s:g}s)"
        loading = self._loading_since
        if state is ReplicaState.STARTING and loading is not None and now - loading > self.start_s:
            return f"loading the model for {now - loading:.1f}s (deadline {self.start_s:g}s)"
        return None

    def restart_hung(self, why: str) -> None:
        """Report the hang and replace the generation (module docstring); FAILED after ``MAX_HANGS``."""
        with self._lock:
            self.hangs += 1
            self.last_error = f"hung: {why}"
            if self._stop is not None:
                self._stop.set()  # the hung generation, when its call returns, commits nothing and ends
            if self._thread is not None:
                self._abandoned.append(self._thread)
            if self.hangs >= MAX_HANGS:
                log.error("%s hung %d times (%s): FAILED, not restarted again", self.label, self.hangs, why)
                self.generation += 1  # nothing of the old generation moves the state any more
                self.state, self._since, self._thread = ReplicaState.FAILED, self._clock(), None
                return
        log.error("%s hung (%s): restarting the lane; the new producer fences the hung one", self.label, why)
        self.start()

    def health(self) -> dict[str, Any]:
        counter, scorer, thread = self._counter, self._scorer, self._thread
        p99 = scorer.metrics.recent_p99() if scorer is not None else None
        return {
            "model": self.spec.name, "version": self.spec.version, "state": str(self.state),
            "generation": self.generation, "hangs": self.hangs, "crashes": self.crashes,
            "last_error": self.last_error, "ready_s": self.ready_s, "readiness_ms": self.readiness_ms,
            "records": counter.records if counter is not None else 0,
            "rate": counter.rate() if counter is not None else None,
            "lag": scorer.metrics.lag() if scorer is not None else None,
            "p99_ms": round(p99 * 1000.0, 3) if p99 is not None else None,
            "outage": scorer.metrics.outage() if scorer is not None else None,
            "thread": thread.status().to_json() if thread is not None else None,
            "abandoned_threads": sum(1 for t in self._abandoned if t.alive),
            "versions": self._versions.report() if self._versions is not None else {},
        }
