"""A multi-model worker process: many small models, one runtime (docs/density.md).

WHY: one ``sie score`` process for a 6-input linear TorchScript model holds ~580 MB resident, nearly all
of it the runtime (Python, torch, librdkafka); the model is kilobytes.  A ``Host`` pays for the runtime
once and runs each model as a ``Lane`` (``sie.workers.multimodel.lane``): its own consumer group, its own
transactional producer, its own exactly-once scorer thread, metrics and dead letters.

The host's loop (every ``interval_s``, on the main thread)::

    reconcile: read the desired-models file (sie.workers.multimodel.desired); start lanes for new replica ids,
               drain lanes no longer wanted, replace a lane whose spec changed (drained first, then started:
               the same transactional.id must not be used by two live lanes on purpose)
    watch:     a lane whose inference call ran past its deadline (or that never finished starting) is
               reported (health, log, sie_shared_lane_hangs_total) and restarted as a new generation,
               which fences the hung one (Lane docstring)
    health:    <state dir>/health.json, rewritten atomically: every lane's state and supervised thread

Models are loaded lazily, when they are added; torch is imported by the first torch model, and its
intra-op threads are capped once for the whole process (``SIE_SHARED_PROCESS_THREADS``).  SGLang models
are refused: a server backend owns a GPU process of its own and gains nothing from sharing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sie.kernel.errors import ConfigError
from sie.kernel.probe_http import start_metrics_server as start_http_server  # bounded (idle timeout, cap)
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState
from sie.schemas.spec_models import SHARED_PROCESS_BACKENDS
from sie.workers.multimodel.desired import HEALTH_FILE, DesiredModel, read_desired, write_atomic
from sie.workers.multimodel.lane import Lane

log = logging.getLogger("sie.shared")

#: backends a shared process hosts (sglang runs its own server process per replica): the schema's one list
SHARED_BACKENDS = SHARED_PROCESS_BACKENDS


class LaneMetrics(Collector):
    """One /metrics for every lane: each lane keeps its own ``ScorerMetrics`` registry (as a dedicated
    scorer does; its series carry ``model_id``/``version``), and this merges them family by family, so the
    exposition names every metric once (Prometheus rejects a family repeated across the text)."""

    def __init__(self, registries: Callable[[], Iterable[CollectorRegistry]]) -> None:
        self._registries = registries

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries():
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        return list(merged.values())


class Host:
    """Hosts the models of one desired-models file (module docstring)."""

    def __init__(self, settings: Settings, state_dir: Path, *, hang_s: float | None = None,
                 start_s: float = 120.0, threads: int | None = None, policy: Any = None,
                 weights: Any = None, clock: Callable[[], float] = time.monotonic,
                 scorer_overrides: dict[str, Any] | None = None) -> None:
        from sie.schemas.spec_policy import SpecPolicy

        self.settings = settings
        self.state_dir = state_dir
        self.hang_s = hang_s if hang_s is not None else settings.shared_lane_hang_s
        self.start_s = start_s
        self.threads = threads if threads is not None else settings.shared_process_threads
        self.policy = policy if policy is not None else SpecPolicy.from_settings(settings)
        self._weights = weights
        self._clock = clock
        self._overrides = scorer_overrides
        self.lanes: dict[str, Lane] = {}
        self._fingerprints: dict[str, str] = {}
        self.draining: dict[str, Lane] = {}
        #: replica id -> (spec fingerprint, why it was refused): not retried until the spec changes
        self.refused: dict[str, tuple[str, str]] = {}
        self.desired_error: str | None = None
        self.topics_error: str | None = None
        self.loop_errors = 0
        self._torch_capped = False
        self.registry = CollectorRegistry(auto_describe=True)
        self.hangs = Counter("sie_shared_lane_hangs", "Lanes of a multi-model process restarted after a hang.",
                             ["model_id", "version"], registry=self.registry)
        self._lane_states = Gauge("sie_shared_lanes", "Lanes of this multi-model process, by state.", ["state"],
                                  registry=self.registry)
        self.registry.register(LaneMetrics(self._lane_registries))
        self.metrics_port: int | None = None

    # --- metrics -----------------------------------------------------------------------------------------
    def _lane_registries(self) -> list[CollectorRegistry]:
        return [lane.metrics.registry for lane in [*self.lanes.values(), *self.draining.values()]]

    def serve_metrics(self, port: int, addr: str | None = None) -> int:
        """Serve every lane's series on one /metrics; binds ``SIE_METRICS_BIND`` (loopback unless told)."""
        server, _thread = start_http_server(port, addr=addr or self.settings.metrics_bind, registry=self.registry)
        self.metrics_port = int(server.server_port)
        return self.metrics_port

    # --- reconcile ---------------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Make the hosted lanes what the desired-models file says (level-triggered, idempotent)."""
        try:
            wanted = read_desired(self.state_dir)
            self.desired_error = None
        except (ConfigError, OSError) as exc:  # keep hosting what we host; say why nothing changes
            self.desired_error = str(exc)
            return
        for rid, lane in list(self.draining.items()):
            if lane.finished:
                del self.draining[rid]
        for rid, lane in list(self.lanes.items()):
            want = wanted.get(rid)
            if want is None or want.fingerprint != self._fingerprints[rid]:
                log.info("replica %s: %s; draining its lane", rid, "removed" if want is None else "spec changed")
                lane.stop()
                self.draining[rid] = lane
                del self.lanes[rid], self._fingerprints[rid]
        for rid in [r for r in self.refused if r not in wanted]:
            del self.refused[rid]
        new = [want for rid, want in wanted.items()
               # a replaced lane starts once its predecessor ended; a refused spec only once it changed
               if rid not in self.lanes and rid not in self.draining
               and not (rid in self.refused and self.refused[rid][0] == want.fingerprint)]
        accepted = [(want, spec) for want in new if (spec := self._accept(want)) is not None]
        if accepted and self._ensure_topics([spec for _want, spec in accepted]):
            for want, spec in accepted:
                self._add(want, spec)

    def _ensure_topics(self, specs: list[Any]) -> bool:
        """The new models' topics, in ONE admin call for all of them (a lane per model each asking the
        broker, as a dedicated worker does, is 3 requests x N models at once).  False: the broker did not
        answer; those lanes start at a later tick (the error is in health meanwhile)."""
        from sie.kernel.admin import ensure_model_topics

        topics = [t for spec in specs for t in (spec.topics.requests, spec.topics.results, spec.topics.dead_letters)]
        try:
            ensure_model_topics(self.settings, topics, self.settings.request_partitions)
        except Exception as exc:  # KafkaUnavailable, a refused ACL: nothing started, retried next tick
            self.topics_error = f"{type(exc).__name__}: {exc}"
            log.error("topics of %d new models not ensured (%s); retrying", len(specs), exc)
            return False
        self.topics_error = None
        return True

    def _accept(self, want: DesiredModel) -> Any:
        """The parsed spec if this process may host it, else None (refused: reported, not retried)."""
        from sie.schemas.spec import ModelService
        from sie.workers.worker_main import check_spec

        rid = want.replica_id
        try:
            spec = ModelService.from_document(want.spec)
            if spec.backend.type not in SHARED_BACKENDS:
                raise ConfigError(f"replica {rid}: spec.backend.type {spec.backend.type!r} cannot share a process "
                                  f"(only {sorted(SHARED_BACKENDS)}); run it as its own worker")
            check_spec(spec, self.policy, f"replica {rid}")
        except Exception as exc:  # a spec this node refuses: reported in health, never retried as it is
            log.error("replica %s refused: %s", rid, exc)
            self.refused[rid] = (want.fingerprint, str(exc) or type(exc).__name__)
            return None
        return spec

    def _add(self, want: DesiredModel, spec: Any) -> None:
        rid = want.replica_id
        if spec.backend.type == "torch":
            self._cap_torch_threads()
        from sie.streams.scorer.metrics import ScorerMetrics

        lane = Lane(rid, spec, settings=self.settings, policy=self.policy, weights=self._weights_for(spec.name),
                    metrics=ScorerMetrics.for_spec(spec), hang_s=self.hang_s, start_s=self.start_s,
                    clock=self._clock, scorer_overrides=self._overrides,
                    companions_dir=Path(want.dir) if want.dir else None)
        self.lanes[rid] = lane
        self._fingerprints[rid] = want.fingerprint
        lane.start()

    def _weights_for(self, model: str) -> Any:
        """One rollouts reader for the whole process (a view per model), created with the first lane."""
        if self._weights is None:
            from sie.streams.scorer.rollout import KafkaWeightSource

            self._weights = KafkaWeightSource(self.settings, None, reader=f"shared-{os.getpid()}")
        return self._weights.view(model)

    def _cap_torch_threads(self) -> None:
        """Once per process: every lane's torch calls share ``threads`` intra-op threads, so one model's
        large batch cannot take every core from the others (the GIL is released inside torch)."""
        if self._torch_capped:
            return
        import torch

        torch.set_num_threads(self.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already fixed (torch allows it once, before any parallel work)
            pass
        self._torch_capped = True

    # --- watchdog and health -----------------------------------------------------------------------------
    def watch(self) -> None:
        now = self._clock()
        for lane in list(self.lanes.values()):
            why = lane.problem(now)
            if why is not None:
                self.hangs.labels(lane.spec.name, lane.spec.version).inc()
                lane.restart_hung(why)

    def health(self) -> dict[str, Any]:
        lanes = {rid: lane.health() for rid, lane in self.lanes.items()}
        draining = {rid: lane.health() for rid, lane in self.draining.items()}
        counts: dict[str, int] = {}
        for h in lanes.values():
            counts[h["state"]] = counts.get(h["state"], 0) + 1
        for state in ReplicaState:
            self._lane_states.labels(str(state)).set(counts.get(str(state), 0))
        ok = (self.desired_error is None and self.topics_error is None and not self.refused
              and all(h["thread"] is None or h["thread"]["ok"] for h in lanes.values())
              and all(h["state"] in ("READY", "STARTING") for h in lanes.values()))
        return {
            "pid": os.getpid(), "at": time.time(), "ok": ok, "rss_mb": rss_mb(),
            "metrics_port": self.metrics_port, "desired_error": self.desired_error, "topics_error": self.topics_error, "loop_errors": self.loop_errors,
            "lanes": lanes, "draining": draining,
            "refused": {rid: why for rid, (_fp, why) in self.refused.items()},
        }

    def write_health(self) -> None:
        write_atomic(self.state_dir / HEALTH_FILE, self.health())

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, interval_s: float = 0.5, drain_s: float = 30.0) -> None:
        """Reconcile, watch and report until ``stop``; then drain every lane (each commits its batch)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        while not stop.is_set():
            try:
                self.reconcile()
                self.watch()
                self.write_health()
            except Exception:  # one bad tick (a full disk, ...) must not end the process; it is counted
                self.loop_errors += 1
                log.exception("multi-model host: reconcile tick failed")
            stop.wait(interval_s)
        self.shutdown(drain_s)

    def shutdown(self, drain_s: float = 30.0) -> None:
        lanes = [*self.lanes.values(), *self.draining.values()]
        for lane in lanes:
            lane.stop()
        deadline = self._clock() + drain_s
        for lane in lanes:
            lane.join(max(0.0, deadline - self._clock()))
        self.draining.update(self.lanes)
        self.lanes.clear()
        try:
            self.write_health()
        except OSError as exc:
            log.warning("final health not written: %s", exc)
        if self._weights is not None:
            self._weights.close()


def rss_mb() -> float | None:
    """Resident memory of this process (``VmRSS`` from /proc; None where there is no /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        return None
    return None
