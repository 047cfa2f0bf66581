"""Worker supervision: desired replicas vs actual processes, one step per ``update()``.

The reconcile is level-triggered (Kubernetes/Ray Serve style): ``set_desired``
records the full target set (applying the same set twice changes nothing) and
``update()`` moves each replica at most one step and never blocks:

    PENDING --launch--> STARTING --ready event--> READY
    PENDING --launch deferred (artifacts being fetched)--> PENDING, new reason, tried again shortly
    STARTING/READY --exit or kill--> CRASHED --backoff elapsed--> STARTING   (restarts += 1)
    CRASHED (N-th crash within the window) --> FAILED                          (terminal)
    any with a process, no longer desired --SIGTERM--> DRAINING --exit--> STOPPED (forgotten)
    DRAINING past the grace period --SIGKILL--> (exit) --> STOPPED

Planned stops never wait for a session timeout: SIGTERM makes the worker's scorer commit its batch and
LEAVE its consumer group (``sie.streams.eos.transaction.leave_group``), so the other replicas take its
partitions at their next heartbeat.  A replica replaced IN PLACE (same id, new target: a new version, a
Draining rollout step) hands over instead, so its partitions pause only for the switch, not for a load:

    old READY --target changed--> DRAINING (handing over: still serving, no signal)
    new PENDING --launch with --standby--> STARTING: loads, proves readiness, reports "standby", waits
    old --SIGUSR2 (hand over: commit; keep the static membership while the group is settled, else leave it)
         --> "released"
    new --SIGUSR1 once every predecessor released--> init_transactions fences the old id; the consumer takes
         the kept static membership (group.instance.id) and its partitions without a rebalance (or joins) --> READY

It falls back to stop-then-start (SIGTERM, the old leaves; the new starts once it exited) when the new
launch cannot wait loaded (a shared process's lane, a connector), when the GPU cannot hold both, and when
the successor crashes, fails or is not loaded within ``startup_timeout_s``.  A crash is no planned stop:
a SIGKILLed worker keeps its membership and its restart takes its partitions back without a rebalance.

Every edge is listed in ``sie.schemas.replica_state.TRANSITIONS`` and ``_transition`` checks it:
a move the table does not allow raises ``ReplicaTransitionError`` instead of being published.

Readiness is the worker's own report of a real inference (``{"event": "ready"}``);
liveness is progress lines (``{"event": "progress"}``) arriving at least every
``liveness_timeout_s``: a silent worker is hung and is killed (and restarted).
Time comes from an injected clock; every process side effect goes through an
injected ``ProcessLauncher``, so all of this is unit-tested with fakes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sie.schemas.replica_state import ReplicaTransitionError, check_transition
from sie.workers.process import LaunchDeferred, LaunchRefused, LaunchSpec, ProcessLauncher
from sie.workers.replica import ActualReplica, DesiredReplica, ExitInfo, ReplicaState, ReplicaTable

log = logging.getLogger(__name__)


class Clock(Protocol):
    def monotonic(self) -> float: ...


class MonotonicClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass(frozen=True)
class SupervisorPolicy:
    """Timeouts and restart policy (seconds). Defaults suit a model that loads in well under a minute."""

    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    #: the first crash within the window restarts at once: a one-off kill (OOM, operator) should cost a
    #: cold start only (measured: the 1 s wait was a quarter of worker failover); repeats still back off
    immediate_first_restart: bool = True
    #: this many crashes within ``crash_window_s`` mark the replica FAILED
    max_crashes: int = 3
    crash_window_s: float = 300.0
    #: generous: loading a model and running the readiness inference can take minutes on a GPU
    startup_timeout_s: float = 300.0
    #: conservative: a false kill costs a cold start (progress lines come every second)
    liveness_timeout_s: float = 30.0
    #: SIGTERM -> SIGKILL after this long (the scorer commits its batch and leaves the group first)
    drain_grace_s: float = 15.0
    #: a launch deferred (artifacts being fetched) is tried again after this long
    deferred_retry_s: float = 0.5
    #: replace in place by hand-over (module docstring): the old worker serves until its successor is loaded
    hand_over: bool = True

    def backoff(self, crashes: int) -> float:
        """Delay before the restart that follows the ``crashes``-th crash within the window:
        0 (``immediate_first_restart``) or 1 s, then 2 s, 4 s ... capped."""
        if crashes <= 1 and self.immediate_first_restart:
            return 0.0
        return min(self.backoff_max_s, self.backoff_initial_s * (2 ** max(0, crashes - 1)))


@dataclass(frozen=True)
class ReplicaSnapshot:
    """A replica's reportable state (what ReplicaStatus and ReplicaReport carry)."""

    replica_id: str
    model: str
    version: str
    state: ReplicaState
    pid: int | None
    restarts: int
    records: int
    reason: str
    exit_code: int | None
    signal: int | None
    target_hash: str
    gpu_indices: tuple[int, ...]
    metrics_port: int | None = None
    lag: int | None = None
    p99_ms: float | None = None
    inference_rps: float | None = None
    #: the backend's outage the worker reports (``{"since_ms", "detail"}``), None while it scores
    outage: dict | None = None
    #: why the worker holds no partitions now (``ActualReplica.holding``), None while it may
    holding: str | None = None
    #: launch -> READY of the current worker (None until READY); ``warm``: a warm-pool worker took the launch
    start_s: float | None = None
    warm: bool = False
    #: the worker's report of the rollout's other version it serves (``ActualReplica.versions``)
    versions: dict[str, dict[str, str]] = field(default_factory=dict)


CommandBuilder = Callable[[DesiredReplica], LaunchSpec]


class Supervisor:
    """Owns the replica table; the agent calls ``set_desired`` on each assignment and ``update`` in its loop."""

    def __init__(
        self,
        launcher: ProcessLauncher,
        command_builder: CommandBuilder,
        clock: Clock | None = None,
        policy: SupervisorPolicy | None = None,
        gpu_capacity_mb: Mapping[int, int] | None = None,
    ) -> None:
        self._launcher = launcher
        #: node-local GPU index -> MiB: a replica is not started on a GPU that processes still running there
        #: (an evicted or moved replica draining) would over-commit; None: not checked (simulated GPUs too)
        self.gpu_capacity_mb = dict(gpu_capacity_mb) if gpu_capacity_mb else None
        self._build = command_builder
        self._clock = clock or MonotonicClock()
        self.policy = policy or SupervisorPolicy()
        self.table = ReplicaTable()
        self._changes: list[ReplicaSnapshot] = []
        #: by handle (``id``): replicas sharing one multi-model process share its pid
        self._kill_reasons: dict[int, str] = {}

    # -- target ----------------------------------------------------------------
    def set_desired(self, replicas: Iterable[DesiredReplica]) -> None:
        """Record the full desired set. Idempotent: the same set again changes nothing."""
        desired: dict[str, DesiredReplica] = {}
        for replica in replicas:
            desired[replica.replica_id] = replica
        for actual in self.table.all():
            if actual.retiring:
                continue
            want = desired.get(actual.replica_id)
            if want is None or want.target_hash != actual.desired.target_hash:
                actual.retiring = True
                log.info("replica %s: %s", actual.replica_id, "no longer assigned" if want is None else "target changed")
            elif want != actual.desired:
                actual.desired = want  # same process target, new epoch: nothing to do
        now = self._clock.monotonic()
        for replica_id, want in desired.items():
            if self.table.current(replica_id) is None:
                actual = ActualReplica(desired=want, next_start_at=now, reason="assigned")
                self.table.add(actual)
                self._record(actual)

    def desired(self) -> list[DesiredReplica]:
        return [r.desired for r in self.table.all() if not r.retiring]

    # -- loop ----------------------------------------------------------------------
    def update(self) -> list[ReplicaSnapshot]:
        """Move every replica one step; return the state changes since the last call (to publish).

        A failing step (an OSError from a process handle) is logged and the other replicas still
        move.  A disallowed transition is a bug in this state machine, not a replica's trouble: the
        other replicas still move, then the first ``ReplicaTransitionError`` is raised (the changes
        recorded so far stay queued for the next call) so tests fail and the agent logs it loudly.
        """
        now = self._clock.monotonic()
        bugs: list[ReplicaTransitionError] = []
        for replica in self.table.all():
            try:
                self._step(replica, now)
            except ReplicaTransitionError as exc:
                bugs.append(exc)
            except Exception as exc:  # one broken replica must not stop the others
                log.exception("replica %s: supervision step failed", replica.replica_id)
                replica.reason = f"supervisor error: {exc}"
        if bugs:
            raise bugs[0]
        changes, self._changes = self._changes, []
        return changes

    def snapshots(self) -> list[ReplicaSnapshot]:
        return [self._snapshot(r) for r in self.table.all()]

    def all_stopped(self) -> bool:
        return not any(r.state.has_process for r in self.table.all())

    # -- one step ------------------------------------------------------------------
    def _step(self, replica: ActualReplica, now: float) -> None:
        if replica.state.has_process:
            self._consume_events(replica, now)
            exit_info = replica.handle.poll()
            if exit_info is not None:
                self._on_exit(replica, exit_info, now)
                return
            self._check_process(replica, now)
            return
        if replica.retiring:  # PENDING / CRASHED / FAILED with no process: nothing to drain
            self._transition(replica, ReplicaState.STOPPED, "no longer assigned")
            self.table.remove(replica)
            return
        if replica.state in (ReplicaState.PENDING, ReplicaState.CRASHED) and now >= replica.next_start_at:
            predecessors = self._predecessors(replica)
            if len(predecessors) == 1 and predecessors[0].handing_over:
                self._launch_successor(replica, predecessors[0], now)
                return
            if predecessors:
                return  # same id, old target still draining: don't double the memory on the GPU
            busy = self._gpu_busy(replica)
            if busy is not None:
                replica.reason = busy  # reported with the next heartbeat; launched once the GPU has room
                return
            self._launch(replica, now)

    def _consume_events(self, replica: ActualReplica, now: float) -> None:
        for event in replica.handle.events():
            kind = event.get("event")
            replica.last_progress_at = now
            if "records" in event and isinstance(event["records"], int):
                replica.records = event["records"]
            _take_reported(replica, event)
            if kind == "standby":
                replica.standby_ready = True
            elif kind == "released":
                replica.released = True
            if kind == "ready" and replica.state == ReplicaState.STARTING:
                replica.start_s = now - replica.started_at
                self._transition(replica, ReplicaState.READY, "readiness inference passed"
                                 + (" (warm start)" if replica.warm else ""))
            elif kind == "error":
                replica.worker_error = str(event.get("detail", "worker reported an error"))

    def _check_process(self, replica: ActualReplica, now: float) -> None:
        policy = self.policy
        if replica.handing_over:
            self._hand_over_step(replica, now)
        elif replica.retiring and replica.state in (ReplicaState.STARTING, ReplicaState.READY):
            if replica.state == ReplicaState.READY and policy.hand_over and self._successor(replica) is not None:
                # serves on until its successor is loaded (module docstring); the successor's launch, next in
                # this same pass, decides: a standby launch (this one DRAINING, still serving) or stop first
                replica.handing_over = True
                replica.drain_deadline = now + policy.startup_timeout_s  # the successor's own start deadline
                return
            replica.handle.terminate()
            replica.drain_deadline = now + policy.drain_grace_s
            self._transition(replica, ReplicaState.DRAINING, "draining: SIGTERM sent")
        elif replica.state == ReplicaState.DRAINING:
            if now >= replica.drain_deadline and id(replica.handle) not in self._kill_reasons:
                self._kill(replica, f"drain took longer than {policy.drain_grace_s:g}s")
        elif replica.state == ReplicaState.STARTING:
            if replica.standby and replica.standby_ready:  # loaded: the predecessor hands over now, not next pass
                for predecessor in self._predecessors(replica):
                    if predecessor.handing_over:
                        self._hand_over_step(predecessor, now)
            if replica.standby and replica.standby_ready and not replica.serving and \
                    all(p.released for p in self._predecessors(replica)):
                replica.serving = True
                replica.handle.serve()
                replica.reason = "its predecessor released the replica: serving (SIGUSR1 sent)"
                self._record(replica)
            if now - replica.started_at > policy.startup_timeout_s and id(replica.handle) not in self._kill_reasons:
                self._kill(replica, f"not ready within {policy.startup_timeout_s:g}s (readiness inference never passed)")
        elif replica.state == ReplicaState.READY:
            if now - replica.last_progress_at > policy.liveness_timeout_s and id(replica.handle) not in self._kill_reasons:
                self._kill(replica, f"hung: no progress report for {policy.liveness_timeout_s:g}s")

    # -- replace in place: hand-over (module docstring) ----------------------------------------------------
    def _hand_over_step(self, old: ActualReplica, now: float) -> None:
        """A retired replica still serving: hand over once its successor is loaded, or stop (SIGTERM) if that
        is not going to happen."""
        successor = self._successor(old)
        if successor is not None and successor.state == ReplicaState.STARTING and successor.standby_ready:
            old.handing_over = False
            old.handle.hand_over()
            old.drain_deadline = now + self.policy.drain_grace_s
            self._retire(old, "handing over: its successor is loaded; SIGUSR2 sent")
            return
        if successor is None or successor.state not in (ReplicaState.PENDING, ReplicaState.STARTING):
            why = "its successor " + (f"is {successor.state.value}" if successor is not None else "is gone")
        elif now >= old.drain_deadline:
            why = f"its successor was not loaded within {self.policy.startup_timeout_s:g}s"
        else:
            return  # still loading (or waiting for its artifacts): the old one keeps serving
        self._end_hand_over(old, now, why)

    def _end_hand_over(self, old: ActualReplica, now: float, why: str) -> None:
        """Give the hand-over up: the old worker stops (SIGTERM: it leaves the group), its successor starts after."""
        old.handing_over = False
        old.handle.terminate()
        old.drain_deadline = now + self.policy.drain_grace_s
        log.info("replica %s: no hand-over: %s", old.replica_id, why)
        self._retire(old, f"draining: SIGTERM sent ({why})")

    def _retire(self, old: ActualReplica, reason: str) -> None:
        """``old`` is DRAINING with ``reason`` (a transition from READY, else a new reason)."""
        if old.state == ReplicaState.DRAINING:
            old.reason = reason
            self._record(old)
        else:
            self._transition(old, ReplicaState.DRAINING, reason)

    def _launch_successor(self, replica: ActualReplica, predecessor: ActualReplica, now: float) -> None:
        """Start ``replica`` with ``--standby`` next to its serving predecessor, if it can wait that way and the
        GPU holds both; else the predecessor stops first.  While the launch is deferred (its artifacts are
        being fetched) the predecessor stays READY and serves."""
        busy = self._gpu_busy(replica)
        if busy is not None:
            self._end_hand_over(predecessor, now, f"no room for both: {busy}")
            return
        self._launch(replica, now, predecessor)
        if replica.state == ReplicaState.STARTING and predecessor.handing_over and predecessor.state != ReplicaState.DRAINING:
            self._retire(predecessor, f"handing over: serving until its successor (pid {replica.pid}) is loaded")

    def _successor(self, replica: ActualReplica) -> ActualReplica | None:
        """The replica that replaces ``replica`` in place (same id, not retiring), if any."""
        current = self.table.current(replica.replica_id)
        return current if current is not replica else None

    def _predecessors(self, replica: ActualReplica) -> list[ActualReplica]:
        """Other replicas with the same id whose process still runs (being retired)."""
        return [other for other in self.table.all()
                if other is not replica and other.replica_id == replica.replica_id and other.state.has_process]

    def _kill(self, replica: ActualReplica, why: str) -> None:
        log.warning("replica %s (pid %s): %s; sending SIGKILL", replica.replica_id, replica.pid, why)
        self._kill_reasons[id(replica.handle)] = why
        replica.handle.kill()

    def _on_exit(self, replica: ActualReplica, exit_info: ExitInfo, now: float) -> None:
        replica.exit = exit_info
        kill_reason = self._kill_reasons.pop(id(replica.handle), None)
        replica.handle = None
        if replica.state == ReplicaState.DRAINING:
            why = "drained" if exit_info.exit_code == 0 else f"drained ({kill_reason or exit_info.cause})"
            self._transition(replica, ReplicaState.STOPPED, why)
            self.table.remove(replica)
            return
        if kill_reason is not None:
            cause = f"{kill_reason} ({exit_info.cause})"
        elif replica.worker_error:
            cause = f"{replica.worker_error} ({exit_info.cause})"  # the worker's own error event says why
        else:
            cause = exit_info.cause
        self._on_crash(replica, cause, now)

    def _on_crash(self, replica: ActualReplica, cause: str, now: float) -> None:
        policy = self.policy
        replica.crash_times = [t for t in replica.crash_times if now - t < policy.crash_window_s] + [now]
        crashes = len(replica.crash_times)
        if crashes >= policy.max_crashes:
            self._transition(
                replica, ReplicaState.FAILED, f"crashed {crashes} times within {policy.crash_window_s:g}s; last: {cause}"
            )
            return
        delay = policy.backoff(crashes)
        replica.next_start_at = now + delay
        self._transition(replica, ReplicaState.CRASHED, f"{cause}; " + (f"restarting in {delay:g}s" if delay else "restarting now"))

    def _launch(self, replica: ActualReplica, now: float, predecessor: ActualReplica | None = None) -> None:
        """Start ``replica``'s worker; ``predecessor``: as its successor, with ``--standby`` (hand-over)."""
        is_restart = replica.state == ReplicaState.CRASHED
        try:
            spec = self._build(replica.desired)
            if predecessor is not None:
                standby = spec.standby()
                if standby is None:
                    self._end_hand_over(predecessor, now, "its successor cannot start in standby (shared process "
                                                          "or connector)")
                    return
                spec = standby
            replica.handle = self._launcher.start(spec)
        except LaunchRefused as exc:  # the node's policy refuses the spec: no retry can change that
            replica.handle = None
            self._transition(replica, ReplicaState.FAILED, str(exc))
            return
        except LaunchDeferred as exc:  # e.g. artifacts still being fetched: same state, a new reason
            replica.handle = None
            replica.next_start_at = now + self.policy.deferred_retry_s
            if replica.reason != str(exc):
                replica.reason = str(exc)
                self._record(replica)
            return
        except Exception as exc:  # OSError, or a spec the command builder cannot read
            replica.handle = None
            self._on_crash(replica, f"could not start worker: {exc}", now)
            return
        if is_restart:
            replica.restarts += 1
        replica.started_at = replica.last_progress_at = now
        replica.exit = None
        replica.worker_error = None
        replica.metrics_port = replica.lag = replica.p99_ms = replica.inference_rps = replica.start_s = None
        replica.outage = replica.holding = None
        replica.warm = bool(getattr(replica.handle, "warm", False))
        replica.standby, replica.standby_ready, replica.serving, replica.released = predecessor is not None, False, False, False
        self._transition(replica, ReplicaState.STARTING, f"{'restarting' if is_restart else 'launched'}: pid {replica.pid}"
                         + (" (standby: its predecessor serves until this one is loaded)" if predecessor else ""))

    def _gpu_busy(self, replica: ActualReplica) -> str | None:
        """Why ``replica`` must wait before it starts: a GPU it is assigned would be over-committed by the
        processes still running on it (an evicted replica draining its last batch), else None."""
        capacity = self.gpu_capacity_mb
        want = replica.desired
        if capacity is None or not want.gpu_indices or not want.gpu_memory_mb:
            return None
        share = want.gpu_memory_mb / len(want.gpu_indices)
        for index in want.gpu_indices:
            holders = [o for o in self.table.all() if o is not replica and o.state.has_process
                       and index in o.desired.gpu_indices]
            held = sum(o.desired.gpu_memory_mb / max(1, len(o.desired.gpu_indices)) for o in holders)
            if holders and held + share > capacity.get(index, 0):
                names = ", ".join(sorted(o.replica_id for o in holders))
                return (f"waiting for GPU {index}: {held:.0f} MiB still held by {names} (draining) + {share:.0f} "
                        f"MiB > {capacity.get(index, 0)} MiB")
        return None

    # -- reporting -----------------------------------------------------------------
    def _transition(self, replica: ActualReplica, state: ReplicaState, reason: str) -> None:
        """Move ``replica`` to ``state`` and queue the change for publishing; raises
        ``ReplicaTransitionError`` (and changes nothing) if the lifecycle table forbids the move."""
        check_transition(replica.state, state, replica.replica_id)
        log.info("replica %s: %s -> %s (%s)", replica.replica_id, replica.state.value, state.value, reason)
        replica.state = state
        replica.reason = reason
        self._record(replica)

    def _record(self, replica: ActualReplica) -> None:
        self._changes.append(self._snapshot(replica))

    @staticmethod
    def _snapshot(replica: ActualReplica) -> ReplicaSnapshot:
        exit_info = replica.exit
        return ReplicaSnapshot(
            replica_id=replica.replica_id,
            model=replica.desired.model,
            version=replica.desired.version,
            state=replica.state,
            pid=replica.pid,
            restarts=replica.restarts,
            records=replica.records,
            reason=replica.reason,
            exit_code=exit_info.exit_code if exit_info else None,
            signal=exit_info.signal if exit_info else None,
            target_hash=replica.desired.target_hash,
            gpu_indices=replica.desired.gpu_indices,
            metrics_port=replica.metrics_port if replica.state.has_process else None,
            lag=replica.lag if replica.state.has_process else None,
            p99_ms=replica.p99_ms if replica.state.has_process else None,
            inference_rps=replica.inference_rps if replica.state.has_process else None,
            outage=replica.outage if replica.state.has_process else None,
            holding=replica.holding if replica.state.has_process else None,
            start_s=replica.start_s,
            warm=replica.warm,
            versions=dict(replica.versions) if replica.state.has_process else {},
        )


def _take_reported(replica: ActualReplica, event: dict) -> None:
    """A worker's own numbers from a status line, each taken only if it has the right type and range
    (the line comes from another process: a bad value is ignored, never trusted)."""
    port = event.get("metrics_port")
    if type(port) is int and 0 < port < 65536:
        replica.metrics_port = port
    lag = event.get("lag")
    if type(lag) is int and lag >= 0:
        replica.lag = lag
    if "p99_ms" in event:
        p99 = event["p99_ms"]
        replica.p99_ms = float(p99) if type(p99) in (int, float) and 0 <= p99 < 1e12 else None
    if "rate" in event:
        rate = event["rate"]
        replica.inference_rps = float(rate) if type(rate) in (int, float) and 0 < rate < 1e12 else None
    if "outage" in event:
        replica.outage = _outage(event["outage"])
    if "holding" in event:
        holding = event["holding"]
        replica.holding = " ".join(holding.split())[:500] or None if isinstance(holding, str) else None
    if "versions" in event:
        replica.versions = _versions_reported(event["versions"])


def _outage(value: object) -> dict | None:
    """``{"since_ms": int, "detail": str}`` from a worker's line, or None (absent, ended, or malformed)."""
    if not isinstance(value, dict):
        return None
    since, detail = value.get("since_ms"), value.get("detail")
    if type(since) is not int or not 0 < since < 1 << 53 or not isinstance(detail, str):
        return None
    return {"since_ms": since, "detail": " ".join(detail.split())[:500]}


#: what a worker may say of the rollout's other version
VERSION_STATES = frozenset({"waiting", "loading", "ready", "failed"})


def _versions_reported(value: Any) -> dict[str, dict[str, Any]]:
    """The ``versions`` of a status line, kept only where well-formed (a few versions, known states, short text)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for version, info in list(value.items())[:4]:
        if isinstance(version, str) and 0 < len(version) <= 64 and isinstance(info, dict) \
                and info.get("state") in VERSION_STATES:
            out[version] = {"state": str(info["state"]), "detail": str(info.get("detail") or "")[:500]}
            rss = info.get("rss_mb")
            if type(rss) is int and 0 < rss < 10_000_000:
                out[version]["rss_mb"] = rss
    return out
