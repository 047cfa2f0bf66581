"""``sie control`` as one object: state feeder, leader elector, controller loop, HTTP API.

Start order: feeder (rebuild state from the topics) -> elector (join the group) -> loop (reconcile
only once the feeder caught up; a new leader only once its ``Takeover`` loaded what the old one
published) -> HTTP (``sie.control.api.routes``: FastAPI on uvicorn, bearer tokens from
``sie.control.api.auth``; loopback unless another address is asked for).  Stop order is the reverse, and the elector closes its
consumer so the group hands partition 0 to a standby at once (no 6 s session wait on a clean stop).

Every background thread runs under a ``SupervisedThread`` (``sie.kernel.supervised``): if one dies it
is restarted with backoff, in-process, because each can start from scratch (the feeder resumes where
it stopped and counts as stale until caught up again; the elector rejoins the group, and a death while
leading steps down first; the loop and the HTTP server hold no state of their own).  ``health()``
reports each thread and subsystem, ``ok`` False with the reasons while any is not well.

The clock is ``SteadyWallClock``: wall-clock seconds that never jump (an NTP step would otherwise make
every node look offline, or a dead one alive, for the size of the step).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sie.control.placement.host_memory import HostOverheads
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller, ReconcileReport
from sie.control.reconcile.feeder import StateFeeder
from sie.control.reconcile.leader import LeaderElector, TransactionalPublisher
from sie.control.reconcile.records import ClusterState, StateSnapshot
from sie.control.reconcile.signals import BacklogSampler
from sie.kernel.clients import KafkaClients
from sie.kernel.supervised import SupervisedThread
from sie.schemas.replica_state import ReplicaState

log = logging.getLogger(__name__)

#: the phases of a model's status (``sie_control_model_phase`` is one-hot over these)
MODEL_PHASES = ("Ready", "Progressing", "Degraded", "Unschedulable", "Invalid")


class ControlMetrics:
    """Prometheus metrics of one control-plane instance (own registry: several can run in one process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.models = Gauge("sie_control_models", "Models with an applied spec", registry=self.registry)
        # every state / node state is set on every pass (0 when none): a series never keeps an old count
        self.replicas = Gauge("sie_control_replicas", "Desired replicas by actual state", ["state"], registry=self.registry)
        self.nodes = Gauge("sie_control_nodes", "Registered nodes by liveness (online: a heartbeat within the timeout)",
                           ["state"], registry=self.registry)
        model = ["model_id", "priority_level"]
        self.model_desired = Gauge("sie_control_model_replicas_desired",
                                   "Replicas the model should have (the spec's count, or the autoscaler's)", model,
                                   registry=self.registry)
        self.model_ready = Gauge("sie_control_model_replicas_ready", "Replicas of the model READY on its version", model,
                                 registry=self.registry)
        self.model_phase = Gauge("sie_control_model_phase", "1 for the model's current phase, 0 for the others",
                                 [*model, "phase"], registry=self.registry)
        #: model -> the status its series were last set from (a status object kept by the pass is not set again)
        self._observed: dict[str, Any] = {}
        self._replica_states: dict[ReplicaState, int] = {}  # replicas per state, over ``_observed``
        self.leader = Gauge("sie_control_leader", "1 while this instance leads", registry=self.registry)
        self.epoch = Gauge("sie_control_leader_epoch", "Leader epoch this instance knows", registry=self.registry)
        self.reconcile_seconds = Histogram(
            "sie_control_reconcile_seconds", "Duration of one reconcile pass", registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.reconcile_cpu = Counter("sie_control_reconcile_cpu_seconds", "CPU time of the reconcile passes (the "
                                     "loop thread's; against sie_control_reconcile_seconds: how long a pass waited "
                                     "for a core)", registry=self.registry)
        self.placements = Counter("sie_control_placement_events_total", "Placement decisions published", ["kind"], registry=self.registry)
        self.errors = Counter("sie_control_errors_total", "Reconcile subsystem failures", ["subsystem"], registry=self.registry)
        self.planned = Gauge("sie_control_reconcile_planned_models",
                             "Models the last pass planned (all of them on a full pass)", registry=self.registry)
        self.checks = Counter("sie_control_incremental_checks_total",
                              "Full passes that checked the state kept between passes", registry=self.registry)
        self.mismatches = Counter("sie_control_incremental_mismatches_total",
                                  "Kept values a check found differing from a pass from scratch (repaired)",
                                  registry=self.registry)
        self.unplaced = Gauge("sie_control_replicas_unplaced", "Desired replicas without a node", registry=self.registry)
        self.guard = Gauge("sie_control_liveness_guard", "1 while the mass-offline guard holds nodes online",
                           registry=self.registry)
        self.stale = Gauge("sie_control_state_stale", "1 while reconcile passes are skipped (the state is stale)",
                           registry=self.registry)
        self.takeover = Gauge("sie_control_takeover_load_seconds",
                              "Seconds this instance's last takeover spent loading what the old leader published "
                              "(read barrier + rollouts) before its first pass", registry=self.registry)
        self.skipped = Counter("sie_control_state_records_skipped_total",
                               "Control records the state reader could not read or apply (skipped)", ["topic"],
                               registry=self.registry)
        self.restarts = Gauge("sie_control_thread_restarts", "Restarts of a supervised background thread",
                              ["thread"], registry=self.registry)
        # desired vs ready of an autoscaled model: sie_control_model_replicas_desired/ready (the autoscaler's count)
        self.lag = Gauge("sie_autoscale_lag_records", "Records waiting in the model's request topic (scorer group lag)",
                         ["model_id"], registry=self.registry)
        self.scale_events = Counter("sie_autoscale_events_total", "Scaling decisions published", ["model_id", "action"],
                                    registry=self.registry)
        self.preemptions = Counter("sie_control_preemptions_total", "Replicas evicted for a higher-priority one",
                                   ["victim_priority", "by_priority"], registry=self.registry)
        self._autoscaled: set[str] = set()

    def observe(self, report: ReconcileReport, snap: StateSnapshot, now: float, timeout_s: float) -> None:
        self.reconcile_seconds.observe(report.durations.get("total", 0.0))
        self.reconcile_cpu.inc(max(0.0, report.durations.get("cpu", 0.0)))
        self.leader.set(1 if report.leader else 0)
        self.guard.set(1 if report.guard else 0)
        self.stale.set(1 if report.skipped else 0)
        self.models.set(len(snap.specs))
        self.planned.set(len(snap.specs) if report.planned is None else len(report.planned))
        if report.checked:
            self.checks.inc()
        if report.mismatched:
            self.mismatches.inc(report.mismatched)
        online = sum(1 for n in snap.nodes if snap.node_online(n, now, timeout_s))
        self.nodes.labels("online").set(online)
        self.nodes.labels("offline").set(len(snap.nodes) - online)
        self._observe_models(report.statuses)
        for state in ReplicaState:
            self.replicas.labels(state.value).set(self._replica_states.get(state, 0))
        if report.plan is not None:
            self.unplaced.set(len(report.plan.unplaced))
        for event in report.of("events"):
            if event.value is not None:
                self.placements.labels(event.value["kind"]).inc()
        for name in report.errors:
            self.errors.labels(name).inc()
        self._observe_elasticity(report)

    def _observe_elasticity(self, report: ReconcileReport) -> None:
        """The backlog of each autoscaled model, scaling decisions and evictions (desired vs ready is in the
        per-model gauges: an autoscaled model's desired count is the autoscaler's)."""
        for name, decision in report.decisions.items():
            if decision.lag is not None:
                self.lag.labels(name).set(decision.lag)
        for gone in self._autoscaled - set(report.decisions):
            try:
                self.lag.remove(gone)
            except KeyError:
                pass
        self._autoscaled = set(report.decisions)
        for event in report.of("events"):
            if event.value is None or event.value.get("model") is None:
                continue
            made = report.decisions.get(event.value["model"])
            if made is not None and made.scaled and event.value["kind"] in _SCALE_EVENTS:
                self.scale_events.labels(event.value["model"], made.action).inc()
        if report.plan is not None:
            for rid, pre in report.plan.preempted.items():
                if any(r.value is not None and r.value["kind"] == "preempted" and r.value["replica_id"] == rid
                       for r in report.of("events")):
                    self.preemptions.labels(pre.victim_priority, pre.by_priority).inc()

    def _observe_models(self, statuses: Any) -> None:
        """Per-model gauges and replicas per state, set from the statuses that changed since the last pass (a
        pass keeps the status object of a model nothing touched); the series of a model that is gone (or
        changed priority) are removed."""
        last = self._observed
        states = self._replica_states
        for name in set(last) - set(statuses):
            self._forget_model(name, last[name])
        for name, status in statuses.items():
            before = last.get(name)
            if before is status:
                continue
            if before is not None:
                self._forget_model(name, before, keep_series=(before.priority_level or "") == (status.priority_level or ""))
            priority = status.priority_level or ""
            self.model_desired.labels(name, priority).set(status.desired_replicas)
            self.model_ready.labels(name, priority).set(status.ready_replicas)
            for phase in MODEL_PHASES:
                self.model_phase.labels(name, priority, phase).set(1 if status.phase == phase else 0)
            for r in status.replicas:
                states[r.state] = states.get(r.state, 0) + 1
        self._observed = dict(statuses)

    def _forget_model(self, name: str, status: Any, keep_series: bool = False) -> None:
        for r in status.replicas:
            self._replica_states[r.state] -= 1
        if not keep_series:
            priority = status.priority_level or ""
            self.model_desired.remove(name, priority)
            self.model_ready.remove(name, priority)
            for phase in MODEL_PHASES:
                self.model_phase.remove(name, priority, phase)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class HeapKeeper:
    """The state a control plane holds lives for hours, and Python's full collection walks all of it: 0.35 s at
    10,000 models (bench_reconcile), a stall of every thread (an apply, the state reader, the API) whenever
    enough new objects pile up.  After the first acting pass, and then every ``every_s``, collect once and
    freeze what survives (``gc.freeze``): the collections between walk only what came since.  Unfreezing
    first lets a cycle that became garbage among the frozen objects go at the next refreeze."""

    def __init__(self, every_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self._clock = every_s, clock
        self._last: float | None = None

    def after_pass(self, acted: bool) -> None:
        now = self._clock()
        if not acted or (self._last is not None and now - self._last < self.every_s):
            return
        import gc

        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._last = now


_SCALE_EVENTS = frozenset({"scaled_up", "scaled_down", "scaled_to_zero", "woke_from_zero", "scale_blocked",
                           "scaled_to_bounds"})


class SteadyWallClock:
    """Seconds since the Unix epoch that never jump: the wall time at creation plus the monotonic time
    elapsed since.  Liveness compares two readings of this clock (when a heartbeat was read, now), so a
    wall-clock step cannot turn every node offline; stamps on records stay close to wall time."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def __call__(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)


class Takeover:
    """What a new leader loads before its first reconcile pass (the controller's ``TakeoverView``).

    WHY: the leader's pass is level-triggered, so it is only as right as the view it reads.  A standby's view
    is warm but not complete at the moment it wins: the old leader's last transactions may still be on
    their way to its feeder, and its driver holds no rollouts (a standby drives none).  A pass planned
    without them would remove the surge replica of a rollout in progress, and the next pass place it again
    (the surge worker restarted, its partitions stalled).  So, once per leader epoch:

    1. a read barrier (``StateFeeder.sync``): every control topic read to the high watermark the feeder took
       after the election (the election's ``init_transactions`` fenced the old leader first, so its last
       commit lies below it);
    2. the rollouts topic read to its end (``Rollouts.load``).

    Until both are done the controller skips its passes (the reason is in ``/healthz``) and the rollouts are
    not ticked.  ``loaded_s`` is how long that took (``sie_control_takeover_load_seconds``; docs/control-plane.md,
    "What a new leader loads before it acts").

    ==========================================  ===========================================================
    failure while loading                       what happens
    ==========================================  ===========================================================
    the barrier's end offsets cannot be taken   retried on the feeder's next loop; ``describe()`` says why
    the state feeder dies or stalls             passes skipped as stale anyway; the barrier's ends stay
                                                valid and the restarted run serves it
    the rollouts topic cannot be read           ``Rollouts.load`` returns why; retried on the next pass
    leadership lost and won again meanwhile     a new epoch: a new barrier and a new rollouts read
    ==========================================  ===========================================================
    """

    def __init__(self, feeder: Any, rollouts: Any, clock: Callable[[], float],
                 wake: Callable[[], None] | None = None, metrics: ControlMetrics | None = None) -> None:
        self._feeder = feeder
        self._rollouts = rollouts
        self._clock = clock
        self._wake = wake
        self._metrics = metrics
        self._barrier: Any = None
        self.epoch: int | None = None
        self.started_at: float | None = None
        #: seconds from the first pass of the term to the barrier seen reached, and to everything loaded
        self.barrier_s: float | None = None
        self.loaded_s: float | None = None

    def not_loaded(self, epoch: int) -> str | None:
        if epoch != self.epoch:
            self.epoch, self.started_at, self.barrier_s, self.loaded_s = epoch, self._clock(), None, None
            self._barrier = self._feeder.sync(on_done=self._wake)
        if self.loaded_s is not None:
            return None
        started = self.started_at or 0.0
        if not self._barrier.reached():
            return (f"new leader (epoch {epoch}): reading the control topics to the end they had after the "
                    f"election ({self._barrier.describe()})")
        if self.barrier_s is None:
            self.barrier_s = self._clock() - started
        wait = self._rollouts.load(epoch)
        if wait is not None:
            return f"new leader (epoch {epoch}): loading the rollouts: {wait}"
        self.loaded_s = self._clock() - started
        if self._metrics is not None:
            self._metrics.takeover.set(self.loaded_s)
        log.info("leader epoch %d: loaded what the previous leader published in %.2fs (read barrier %.2fs); "
                 "reconciling", epoch, self.loaded_s, self.barrier_s)
        return None

    def status(self) -> dict[str, Any]:
        """``/healthz``'s ``takeover``: this instance's latest term and how long its loading took (null: not yet)."""
        def rounded(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {"epoch": self.epoch, "barrier_s": rounded(self.barrier_s), "loaded_s": rounded(self.loaded_s)}


def one_pass(controller: Controller, rollouts: Any, now: float) -> ReconcileReport:
    """One turn of the loop: reconcile, then the rollouts.  A leader's rollouts are not ticked after a pass
    that could not act (a stale view, a takeover still loading): the driver would move on a capacity plan the
    controller did not make from the current view."""
    report = controller.reconcile(now)
    if report.skipped is None or not report.leader:
        rollouts.tick()
    return report


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


class ControlService:
    """One control-plane instance (leader or standby)."""

    def __init__(
        self,
        settings: Any,
        config: ControlConfig = ControlConfig(),
        instance_id: str | None = None,
        http_port: int | None = 8470,
        http_host: str = "127.0.0.1",
        clock: Callable[[], float] | None = None,
        session_timeout_ms: int = 6000,
        clients: KafkaClients | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.instance_id = instance_id or default_instance_id()
        self.clock = clock = clock or SteadyWallClock()
        from sie.schemas.spec_policy import SpecPolicy

        #: the node's spec rules: POST /v1/models and the state's view of the specs topic apply the same
        self.spec_policy = SpecPolicy.from_settings(settings)
        from sie.schemas.artifact_store import ArtifactStore, KnownArtifacts

        self.clients = clients or KafkaClients()
        #: artifacts on the cluster, for the API (uploads, and the check that a spec's artifact is there)
        self.artifacts = KnownArtifacts(ArtifactStore(settings, clients=self.clients))
        from sie.schemas.spec_store import AckedWriter

        #: the API's spec writes (apply, delete): one producer for all of them (``AckedWriter``)
        self.spec_writer = AckedWriter(settings, settings.names.control_client_id(self.instance_id, "specs"),
                                       clients=self.clients)
        self.state = ClusterState(spec_policy=self.spec_policy)
        self.metrics = ControlMetrics()
        self._wake = threading.Event()  # set: the reconcile loop runs its next pass now
        self._heap = HeapKeeper()  # the long-lived state frozen out of the full collections
        self.feeder = StateFeeder(settings, self.state, clock=clock, clients=clients,
                                  lag_limit_s=config.node_timeout_s / 2,
                                  on_skip=lambda topic: self.metrics.skipped.labels(topic).inc(),
                                  on_change=lambda _topic: self._wake.set())
        self.elector = LeaderElector(settings, self.instance_id, session_timeout_ms=session_timeout_ms,
                                     on_change=self._on_leadership, clock=clock, clients=clients)
        #: the autoscaler's backlog signal: sampled only while this instance leads (a standby follows the
        #: decisions on the model-status topic), only for models that can scale
        self.sampler = BacklogSampler(settings, self._autoscaled_models, clock=clock,
                                      interval_s=config.backlog_interval_s, clients=clients,
                                      rate_window_s=config.backlog_window_s)
        from sie.control.rollout.service import Rollouts

        #: model rollouts: driven by the leader from this loop, started/steered through the API;
        #: a rollout in progress holds the model's autoscaling (``Rollouts.in_progress``)
        self.rollouts = Rollouts(settings, self.elector, TransactionalPublisher(self.elector), clock=clock,
                                 registry=self.metrics.registry)
        #: what a new leader loads before its first pass (``Takeover``)
        self.takeover = Takeover(self.feeder, self.rollouts, clock, wake=self._wake.set, metrics=self.metrics)
        self.controller = Controller(self.state, TransactionalPublisher(self.elector),
                                     self.elector, config, self.metrics, view=self.feeder, signals=self.sampler,
                                     rollouts=self.rollouts, overheads=HostOverheads.from_settings(settings),
                                     takeover=self.takeover)
        #: the rollout's readiness gate and drain: the replica plan the controller made this pass
        self.rollouts.driver.capacity = lambda model: self.controller.capacity.get(model)
        self._http_port = http_port
        self._http_host = http_host
        self.http: Any = None
        self._stop = threading.Event()
        self._loop = SupervisedThread("sie-control-loop", self._run, self._stop)
        self.started_at = clock()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ControlService:
        self.feeder.start()
        self.elector.start()
        self.sampler.start()
        self._loop.start()
        if self._http_port is not None:
            from sie.control.api.audit import AuditLog
            from sie.control.api.auth import TokenStore, ensure_initial_token
            from sie.control.api.routes import create_app
            from sie.control.api.server import ApiServer

            created = ensure_initial_token(self.settings)
            if created is not None:
                log.warning("no API token was configured: created an operator token in %s (mode 0600); "
                            "`sie token create` makes more", created)
            self.tokens = TokenStore(self.settings)
            self.audit = AuditLog(self.settings)
            app = create_app(self, self.tokens, tuple(self.settings.api_public_paths), self.audit)
            self.http = ApiServer(app, self._http_host, self._http_port,
                                  self.settings.api_tls_cert, self.settings.api_tls_key).start()
        log.info("sie control %s started (http %s)", self.instance_id, self.http_port)
        return self

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.http is not None:
            self.http.stop()
            self.audit.close()
        self._loop.join(10)
        self.spec_writer.close()
        self.sampler.stop()
        self.elector.stop()
        self.feeder.stop()
        log.info("sie control %s stopped", self.instance_id)

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def _autoscaled_models(self) -> dict[str, tuple[str, str]]:
        """Models whose count can change (min != max, P0 never below one): name -> (scorer group, request topic);
        the leader's passes keep the set (``Derived.scalable``), so a sample reads no other model."""
        if not self.elector.is_leader:
            return {}
        specs = self.state.specs
        return {name: (spec.group_id, spec.topics.requests)
                for name in sorted(self.controller.derived.scalable) if (spec := specs.get(name)) is not None}

    # -- loop --------------------------------------------------------------------------------------

    def _on_leadership(self, leader: bool, epoch: int) -> None:
        self.metrics.epoch.set(epoch)
        self._wake.set()  # reconcile right away after an election

    def _run(self) -> None:
        """The reconcile loop.  A pass isolates its steps and skips itself while the state is stale;
        whatever still escapes it ends this run, and the supervisor restarts the loop with backoff.  A wake
        (an election, a takeover loaded, a live spec or connector record) runs the next pass at once; cleared
        before the pass, so a wake that comes during a pass is not lost."""
        while not self._stop.is_set():
            self._wake.clear()
            one_pass(self.controller, self.rollouts, self.clock())
            self._heap.after_pass(self.controller.acted)
            self._observe_threads()
            self._wake.wait(self.next_wait(self.clock()))

    def next_wait(self, now: float) -> float:
        """How long the loop waits for a wake before its next pass: the interval, or less when a silent node
        turns offline sooner (its replicas move up to one interval earlier than a pass at the interval would)."""
        wait = self.config.reconcile_interval_s
        due = self.state.next_offline_at(now, self.config.node_timeout_s)
        if due is not None:
            wait = min(wait, max(0.0, due - now) + 0.01)  # offline once the silence is longer than the timeout
        return wait

    def _observe_threads(self) -> None:
        threads = {"state_feeder": self.feeder.thread_status(), "leader_elector": self.elector.thread_status(),
                   "reconcile_loop": self._loop.status(), "backlog_sampler": self.sampler.thread_status()}
        if self.http is not None:
            threads["http"] = self.http.status()
        for name, status in threads.items():
            self.metrics.restarts.labels(name).set(status.restarts)

    # -- read side for the API ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` answers: ``ok`` (False while any subsystem is not well; the HTTP layer should
        answer 503 then), ``reasons`` (one line per subsystem that is not ok) and ``subsystems``."""
        report = self.controller.last_report
        controller = self.controller.health()
        loop = self._loop.status()
        subsystems: dict[str, dict[str, Any]] = {
            "state_feeder": self.feeder.status(),
            "leader_elector": self.elector.status(),
            "reconcile_loop": {**loop.to_json(), **controller["reconcile"], "incremental": controller["incremental"]}
                              if loop.ok else
                              {**loop.to_json(), "detail": f"loop thread {loop.state}: {loop.last_error}"},
            "liveness_guard": controller["liveness_guard"],
            "backlog_sampler": self.sampler.status(),
        }
        if self.http is not None:
            http = self.http.status()
            subsystems["http"] = {**http.to_json(), "detail": "serving" if http.ok else f"{http.state}: {http.last_error}"}
        reasons = [f"{name}: {sub.get('detail')}" for name, sub in subsystems.items() if not sub.get("ok")]
        restarted = any(int(sub.get("restarts") or 0) for sub in subsystems.values())
        starting = not restarted and not self.controller.acted
        return {
            "ok": not reasons,
            "status": "ok" if not reasons else ("starting" if starting else "degraded"),
            "reasons": reasons,
            "subsystems": subsystems,
            "instance": self.instance_id,
            "role": "leader" if self.elector.is_leader else "standby",
            "epoch": self.elector.epoch if self.elector.is_leader else self.state.leader_epoch,
            "leader_instance": self.state.leader_instance,
            "state_caught_up": self.feeder.caught_up.is_set(),
            "last_reconcile_ms": int(report.at * 1000) if report else None,
            "reconcile_errors": dict(report.errors) if report else {},
            "feeder_errors": self.feeder.errors,
            "feeder_last_error": self.feeder.last_error,
            "election_error": self.elector.last_error,
            "rollouts_error": self.rollouts.last_error,
            "takeover": self.takeover.status(),
        }
