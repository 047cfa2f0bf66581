"""One replica's worker process: load the backend, prove readiness with a real inference, run the scorer.

    python -m sie.workers.worker_main --spec-file SPEC.json --replica-id fraud-scorer-0 --status-fd 5
    python -m sie.workers.worker_main --warm --status-fd 5       (warm pool: imports done, waits on stdin)

The agent starts one of these per replica (``sie.workers.process`` gives it
PR_SET_PDEATHSIG and the status pipe).  It runs the SAME exactly-once scorer as
``sie score`` with instance = replica id, i.e. transactional.id
``sie.scorer.<model>.<replica_id>``: a replica restarted here or moved to another
node fences its zombie predecessor.

An sglang spec (``sie.streams.llm.config.serves_through_window``) is loaded the same way (the backend
launches the replica's SGLang server and proves it with a real generation) and then served through the
LLM window (``sie.streams.llm.stage.run_llm_scorer``, docs/llm.md) with that server as its first endpoint,
at the server's ``--max-running-requests`` (``launched_concurrency``) requests in flight, not through the
batch scorer.

Status protocol (one JSON object per line on ``--status-fd``; stdout/stderr go to
the replica's log file):

    {"event": "loading", "pid": 123}                       backend load started
    {"event": "ready", "latency_ms": 1.2, "outputs": {...}, "metrics_port": P}
                                                            readiness inference passed; /metrics on P
    {"event": "progress", "records": N, "rate": R, "lag": L, "p99_ms": X, "versions": {...},
     "outage": {"since_ms", "detail"} | null, "holding": "holding no partitions: ..." | null}
                                                            every --progress-interval s (liveness), with
                                                            records per second of inference time over the
                                                            last minute (null if none), the scorer's consumer
                                                            lag, its recent per-request p99 and, during a
                                                            rollout, the other version's state
                                                            ({"1.1.0": {"state": "ready", "detail": ""}}) and,
                                                            while a version it routes to is not ready, why
                                                            it holds no partitions
    {"event": "draining"}                                   SIGTERM (or SIGUSR2: a hand-over) received
    {"event": "standby"}                                    --standby: loaded and proven; waits for SIGUSR1
    {"event": "released"}                                   the scorer's consumer and producer are closed:
                                                            a successor may take the replica's place
    {"event": "error", "detail": "..."}                     fatal; the process exits 1 right after
    {"event": "stopped", "records": N}                      clean exit (0) after a drain

Stops and hand-overs (docs/reliability.md, "Planned stops and crashes of scorer replicas"): SIGTERM is a
planned stop: the batch in flight commits and the consumer LEAVES the group, so the other replicas take
its partitions at their next heartbeat (static membership would otherwise hold them for the session
timeout).  The agent's
replace-in-place (a new version or spec for the same replica id) starts the successor with ``--standby``:
it loads and proves the model while this replica still serves, reports ``standby`` and waits; the agent
then sends the serving worker SIGUSR2 (stop for a successor: commit, then keep its static membership while
the group is settled, or leave it during a rebalance, ``sie.streams.eos.stage.leaves_group``) and, once it
released, the successor SIGUSR1: its ``init_transactions`` fences the predecessor's id and its consumer takes
the kept membership (``group.instance.id``) and its partitions without a rebalance (or joins).  A SIGKILLed or crashed worker never leaves: its
restart takes its place the same way.

Settings (Kafka connection, topic prefix) come from SIE_* environment variables,
read once here at the entry point; the agent passes its environment through.

Warm mode (``--warm``, the agent's warm pool, ``sie.workers.warm_pool``): the process imports the
runtime (torch, the backends, the scorer, the Kafka client) and reports ``{"event": "warm"}``, then
blocks on stdin for ONE JSON line ``{"args": [...], "env": {...}, "log_path": "..."}``: the arguments a
cold worker would have been started with, the environment additions (``CUDA_VISIBLE_DEVICES`` among
them: importing torch does not initialise CUDA, so setting it now still takes effect) and the replica's
log file (stdout/stderr move there).  From then on it is an ordinary worker: the spec policy is applied
to the spec before anything of it is imported, exactly as in a cold start.  EOF on stdin (the agent
stopped, or shrank its pool) ends the process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from sie.schemas.worker_status import StatusWriter

__all__ = ["CountingBackend", "StatusWriter", "check_spec", "companion_versions", "load_proven", "main",
           "read_spec_file", "run_worker"]

log = logging.getLogger("sie.worker")


#: the window and the most calls the inference rate reported with progress covers
RATE_WINDOW_S = 60.0
RATE_MAX_SAMPLES = 2048


class CountingBackend:
    """Delegates to the loaded backend, counts scored records (the progress the agent watches) and times its
    inference calls (the records per second of inference time the autoscaler sizes a first scale-up with,
    before it measured a replica's throughput under a backlog)."""

    def __init__(self, inner: Any, clock: Any = time.monotonic) -> None:
        self._inner = inner
        self.device = getattr(inner, "device", "cpu")
        self.records = 0
        #: when the inference call in progress started (None: none is): a multi-model process's watchdog
        #: (sie.workers.multimodel) reads it to tell a hung model from a slow one
        self.busy_since: float | None = None
        self._lock = threading.Lock()
        self._clock = clock
        self._latencies: deque[tuple[float, float, int]] = deque(maxlen=RATE_MAX_SAMPLES)

    def load(self) -> None:
        """Already loaded (and proven by the readiness inference): loading twice would double the memory."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        started = self.busy_since = self._clock()
        try:
            outputs = self._inner.infer(inputs)
        finally:
            self.busy_since = None
        ended = self._clock()
        with self._lock:
            self.records += len(inputs)
            self._latencies.append((ended, (ended - started) * 1000.0, len(inputs)))
        return outputs

    def rate(self) -> float | None:
        """Records per second of inference time over the last ``RATE_WINDOW_S`` (what the replica could do if it
        did nothing but infer; None: no call ended in the window)."""
        since = self._clock() - RATE_WINDOW_S
        with self._lock:
            recent = [(ms, n) for at, ms, n in self._latencies if at >= since]
        spent = sum(ms for ms, _ in recent) / 1000.0
        return round(sum(n for _, n in recent) / spent, 3) if recent and spent > 0 else None

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _progress_loop(
    status: StatusWriter, counter: CountingBackend, interval: float, stop: threading.Event,
    on_fatal: Any, extra: Any = dict,
) -> None:
    """Liveness lines, and the check that the backend can still serve at all.

    A backend with a ``fatal_error()`` method (SGLang: its server process exited) ends
    the worker: an error line, then the scorer is stopped (it aborts/commits cleanly)
    and the worker exits 1, so the agent records the crash and restarts the replica.
    ``extra()`` adds the scorer's numbers (and may replace ``records``/``rate``: the LLM window
    does not infer through ``counter``).
    """
    fatal_error = getattr(counter._inner, "fatal_error", None)
    while not stop.wait(interval):
        detail = fatal_error() if callable(fatal_error) else None
        if detail:
            status.emit("error", detail=detail)
            on_fatal(detail)
            return
        status.emit("progress", **{"records": counter.records, "rate": counter.rate(), **extra()})


def read_spec_file(path: Path) -> Any:
    """The spec file the agent wrote for this process (``--spec-file``): its one decode on this side of the
    process boundary (a replica's worker, a companion version's host)."""
    from sie.schemas.spec import ModelService

    return ModelService.from_document(json.loads(path.read_text(encoding="utf-8")))


def _backend_config(spec: Any, args: argparse.Namespace, policy: Any = None) -> Any:
    """The spec's backend config plus what only the agent knows: the GPUs reserved and the memory budget.

    (A server backend such as SGLang needs the physical GPU index for NVML and the
    absolute budget to compute its memory fraction; CUDA_VISIBLE_DEVICES already
    narrows what torch sees.)
    """
    from sie.workers.backends import backend_config_from_spec

    config = backend_config_from_spec(spec, policy)
    indices = [int(i) for i in args.gpu_indices.split(",") if i.strip()]
    extra = {
        "gpu_indices": indices, "gpu_memory_mb": args.gpu_memory_mb, "replica_id": args.replica_id,
        "log_path": str(args.spec_file.parent / "server.log"),  # a server backend's own log, next to the worker's
    }
    return dataclasses.replace(config, config={**config.config, **extra})


def check_spec(spec: Any, policy: Any, label: str) -> None:
    """The node's spec policy on a spec that came over Kafka, before anything of it is imported or opened
    (the agent checked too; a worker started by hand, or a model added to a multi-model process, gets the
    same check).  ``label`` names the replica in the error."""
    policy.enforce(spec, source=label)
    if spec.backend.modules_path is not None:  # the agent checked the archive too; a worker run by hand did not
        from sie.schemas.module_bundle import check_bundle
        from sie.schemas.spec_rules import InvalidSpec

        problems = check_bundle(spec.backend.modules_path, policy.allowed_modules)
        if problems:
            raise InvalidSpec(label, problems)


def load_proven(spec: Any, config: Any) -> tuple[Any, Any]:
    """The backend of ``config``, loaded and proven by the readiness inference (``ReadinessResult``);
    closed again if either fails (nothing half-loaded stays in memory)."""
    from sie.workers.backends import create_backend
    from sie.workers.readiness import readiness_inference

    backend = create_backend(config)
    try:
        backend.load()
        return backend, readiness_inference(backend, spec)
    except BaseException:
        backend.close()
        raise


def companion_versions(settings: Any, directory: Path, label: str, gpu_indices: Any = (), gpu_memory_mb: int = 0,
                       threads: int | None = None) -> Any:
    """The other version of a rollout, served from a process of its own (``sie.workers.versions``): its
    document prepared by the agent into ``directory`` (``version-<v>.json``), exactly as a dedicated replica
    of that version is prepared, then checked, loaded and proven in its process before it gets traffic."""
    from sie.workers.versions import AgentPrepared, ProcessVersions

    return ProcessVersions(AgentPrepared(directory), label, log_dir=directory,
                           call_timeout_s=settings.companion_call_timeout_s,
                           load_timeout_s=settings.companion_load_timeout_s,
                           gpu_indices=gpu_indices, gpu_memory_mb=gpu_memory_mb, threads=threads)


#: the longest a planned stop (SIGTERM, SIGUSR2) waits for the consumer group to settle before it leaves
SETTLE_LIMIT_S = 3.0


def wait_group_settled(settings: Any, group: str, topic: str, stop: threading.Event,
                       limit_s: float = SETTLE_LIMIT_S, clients: Any = None) -> bool:
    """Wait (serving meanwhile) until ``group`` is stable with every partition of ``topic`` owned, at most
    ``limit_s``.  Why: a member that leaves while the group is still settling a join (cooperative-sticky
    revokes in one rebalance and assigns in the next) starts another rebalance on top of it, and the
    partitions revoked by the first wait for both: 2.1-2.4 s per partition when the surge replica stopped
    0.8-0.9 s after the last successor joined (docs/rollouts.md, "Measured").  Unknown (no broker answer):
    False at the limit, and the stop goes on."""
    from sie.kernel.clients import KafkaClients
    from sie.streams.eos.stage import settled_description

    deadline = time.monotonic() + limit_s
    try:
        admin = (clients or KafkaClients()).admin(settings.kafka_client_config())
    except Exception as exc:  # noqa: BLE001 - no admin client: stop at once
        log.info("group %s: not described (%s); stopping now", group, exc)
        return False
    while time.monotonic() < deadline and not stop.is_set():
        try:
            described = admin.describe_consumer_groups([group], request_timeout=1.0)[group].result(timeout=2.0)
            partitions = list(admin.list_topics(topic, timeout=2.0).topics[topic].partitions)
            if settled_description(described, None, {topic: partitions}):
                return True
        except Exception as exc:  # noqa: BLE001 - unknown now: ask again until the limit
            log.debug("group %s: not described (%s)", group, exc)
        stop.wait(0.1)
    return False


def run_worker(args: argparse.Namespace, status: StatusWriter) -> int:
    """Load, prove readiness, score until SIGTERM. Returns the exit code."""
    from sie.kernel.admin import ensure_model_topics
    from sie.kernel.settings import Settings
    from sie.schemas.spec_policy import SpecPolicy
    from sie.streams.eos import StopRequest
    from sie.streams.llm.config import serves_through_window
    from sie.streams.scorer import ScorerConfig
    from sie.streams.scorer.rollout import build_rollout_scorer, close_rollout_scorer, serve_rollout_scorer

    stop_event = StopRequest()
    serve = threading.Event()  # --standby: set by SIGUSR1 (go), and by any stop (nothing to wait for then)
    #: the scorer's group and topic once it serves (a planned stop then waits for the group to settle first)
    serving_group: list[tuple[str, str]] = []

    def _stop(signum: int) -> None:
        if signum == signal.SIGUSR2:
            stop_event.hand_over()  # a successor takes this replica's place (StopRequest.hand_over)
        else:
            stop_event.set()
        serve.set()

    def _on_term(signum: int, _frame: Any) -> None:
        status.emit("draining", signal=signal.Signals(signum).name)
        if signum == signal.SIGINT or not serving_group:
            _stop(signum)
            return
        group, topic = serving_group[0]

        def settle_then_stop() -> None:
            wait_group_settled(settings, group, topic, stop_event)
            _stop(signum)

        threading.Thread(target=settle_then_stop, name="settle-then-stop", daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(signum, _on_term)
    signal.signal(signal.SIGUSR1, lambda _s, _f: serve.set())

    settings = Settings()
    spec = read_spec_file(args.spec_file)
    # The spec came over Kafka: check it against this node's policy before importing or opening anything
    # (the agent did too; a worker started by hand with a spec file gets the same check).
    policy = SpecPolicy.from_settings(settings)
    label = f"replica {args.replica_id}"
    check_spec(spec, policy, label)
    status.emit("loading", pid=os.getpid(), model=spec.model_id, replica=args.replica_id)
    backend, result = load_proven(spec, _backend_config(spec, args, policy))
    try:
        counter = CountingBackend(backend)
        if stop_event.is_set():  # asked to stop while loading: nothing consumed, nothing to commit
            status.emit("stopped", records=0)
            return 0
        topics = spec.topics
        from sie.streams.llm.config import deferred_topic

        launched_url = getattr(backend, "launched_url", None)
        launched = launched_url is not None
        window = serves_through_window(spec, launched_server=launched)
        ensure_model_topics(settings, [topics.requests, topics.results, topics.dead_letters,
                                       deferred_topic(spec, settings.names, launched_server=launched)],
                            settings.request_partitions)
        progress_stop = threading.Event()
        fatal: list[str] = []

        def on_fatal(detail: str) -> None:
            fatal.append(detail)
            stop_event.set()

        scorers: list[Any] = []

        indices = [int(i) for i in args.gpu_indices.split(",") if i.strip()]
        versions = None if window else companion_versions(settings, args.spec_file.parent, label, indices,
                                                           args.gpu_memory_mb)

        def own_numbers() -> dict[str, Any]:
            """The scorer's lag and recent p99 and the rollout's other version's state, forwarded by the agent
            to the control plane (status page, rollout gates)."""
            metrics = scorers[0].metrics
            p99 = metrics.recent_p99()
            numbers = {"lag": metrics.lag(), "p99_ms": round(p99 * 1000.0, 3) if p99 is not None else None,
                       "outage": metrics.outage()}  # the backend fails on a known-good row: batches retried
            if window:  # records committed by the window; no rate: its generations overlap (no per-call time)
                numbers |= {"records": scorers[0].summary().records_in, "rate": None}
            if versions is not None:
                numbers["versions"] = versions.report()
                # the readiness gate (sie.streams.eos.stage): a version its table routes to is not ready here
                unready = getattr(scorers[0], "unready", "")
                numbers["holding"] = f"holding no partitions: {unready}" if unready else None
            return numbers

        progress = threading.Thread(
            target=_progress_loop, args=(status, counter, args.progress_interval, progress_stop, on_fatal, own_numbers),
            name="progress", daemon=True,
        )

        def on_ready(scorer: Any) -> None:
            # READY = the readiness inference passed AND the scorer is subscribed (Kafka reachable).
            scorers.append(scorer)
            serving_group.append((spec.group_id, spec.topics.requests))
            status.emit("ready", latency_ms=round(result.latency_ms, 3), outputs=result.outputs,
                        metrics_port=scorer.metrics.port)
            progress.start()

        # replica ids are unique and stable (the agent's contract): a restarted or moved replica takes its
        # predecessor's group membership at once (static membership) instead of waiting out its session
        config = ScorerConfig(settings=settings, spec=spec, instance=args.replica_id, metrics_port=args.metrics_port,
                              static_membership=True)
        # built before a standby's wait (the rollouts topic read from then on, the validators compiled, the
        # metrics registered): a successor told to serve only fences the id and joins its group; building it
        # afterwards held a hand-over's partitions 0.2-0.6 s longer (measured in bench_rollout --handover)
        scorer = None if window else build_rollout_scorer(config, lambda _spec: counter, versions=versions)
        if args.standby:  # the predecessor still serves: wait for it to release the replica's id (SIGUSR1)
            if scorer is not None:
                scorer.prepare_clients()  # connected now; fenced and joined once told to serve
            status.emit("standby")
            waited = time.monotonic()
            while not serve.wait(1.0):
                pass
            if stop_event.is_set():
                if scorer is not None:
                    close_rollout_scorer(scorer)
                status.emit("stopped", records=0)
                return 0
            log.info("%s: standby for %.2fs; serving now", label, time.monotonic() - waited)

        try:
            if scorer is None:  # an LLM: the continuous in-flight window over its own server (+ the spec's endpoints)
                from sie.streams.llm.stage import run_llm_scorer

                log.info("%s: serving through the LLM window (own server %s)", label, launched_url or "none")
                summary = run_llm_scorer(config, stop_event, on_ready=on_ready, launched_url=launched_url)
                records = summary.records_in
            else:
                summary = serve_rollout_scorer(scorer, stop_event, on_ready=on_ready)
                records = counter.records
        finally:
            progress_stop.set()
        status.emit("released")  # consumer and producer closed: a successor may take the replica's id now
        log.info("scorer stopped: %s", summary.line() if hasattr(summary, "line") else summary)
    finally:
        backend.close()
    if fatal:
        return 1
    status.emit("stopped", records=records)
    return 0


#: what a warm worker imports before it waits: everything a cold worker imports before it loads a spec
WARM_IMPORTS = (
    "torch", "numpy", "confluent_kafka", "fastavro", "pydantic",
    "sie.kernel.settings", "sie.kernel.admin", "sie.schemas.spec", "sie.schemas.spec_policy",
    "sie.workers.backends", "sie.workers.backends.torch_backend", "sie.workers.backends.python_backend",
    "sie.workers.readiness", "sie.streams.scorer",
)


def warm_up() -> float:
    """Import the runtime (``WARM_IMPORTS``; one that is not installed is skipped); seconds it took."""
    import importlib

    started = time.perf_counter()
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # e.g. an optional backend's library: a cold worker would not need it either
            log.info("warm-up: %s not imported (%s)", name, exc)
    return time.perf_counter() - started


def wait_for_assignment(stream: Any) -> dict[str, Any] | None:
    """One JSON line from the agent (None on EOF: the agent is gone or shrank its pool)."""
    line = stream.readline()
    if not line:
        return None
    payload = json.loads(line)
    if not isinstance(payload, dict) or not isinstance(payload.get("args"), list):
        raise ValueError("warm worker: the assignment must be a JSON object with an 'args' list")
    return payload


def take_assignment(payload: dict[str, Any], status_fd: int | None) -> argparse.Namespace:
    """Become the replica ``payload`` names: its environment, its log file, its arguments."""
    env = payload.get("env") or {}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    if payload.get("cwd"):
        os.chdir(str(payload["cwd"]))  # the replica's folder, where a cold worker would have started
    log_path = payload.get("log_path")
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    args = parse_args([str(a) for a in payload["args"]])
    args.status_fd = status_fd
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sie.workers.worker_main", description=__doc__.splitlines()[0])
    parser.add_argument("--warm", action="store_true",
                        help="warm pool: import the runtime, then wait for the replica's arguments on stdin")
    parser.add_argument("--spec-file", type=Path, help="ModelService document (JSON, to_document form)")
    parser.add_argument("--replica-id", help="stable replica id, e.g. fraud-scorer-0")
    parser.add_argument("--status-fd", type=int, default=None, help="fd of the status pipe to the agent")
    parser.add_argument("--standby", action="store_true",
                        help="load and prove the model, report 'standby', and serve only after SIGUSR1 (a successor "
                             "taking a serving replica's place)")
    parser.add_argument("--progress-interval", type=float, default=1.0, help="seconds between progress lines")
    parser.add_argument("--gpu-indices", default="", help="node-local (NVML) indices of the GPUs reserved, e.g. 0,1")
    parser.add_argument("--gpu-memory-mb", type=int, default=0, help="absolute GPU memory budget of this replica")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="scorer /metrics port, 0 = any free one (reported in the ready line); default: none")
    args = parser.parse_args(argv)
    if not args.warm and (args.spec_file is None or args.replica_id is None):
        parser.error("--spec-file and --replica-id are required (or --warm)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sie.kernel.logs import quiet_http_logs

    quiet_http_logs("info")  # no httpx line per LLM generation
    stream = os.fdopen(args.status_fd, "w", buffering=1, encoding="utf-8") if args.status_fd is not None else None
    status = StatusWriter(stream)
    if args.warm:
        status.emit("warm", pid=os.getpid(), import_s=round(warm_up(), 3))
        try:
            payload = wait_for_assignment(sys.stdin)
            if payload is None:
                return 0
            args = take_assignment(payload, args.status_fd)
        except (ValueError, OSError, SystemExit) as exc:  # SystemExit: argparse refused the arguments
            status.emit("error", detail=f"warm worker: unusable assignment: {exc}")
            return 1
    try:
        return run_worker(args, status)
    except Exception as exc:  # SieError (bad spec/artifact/readiness) or anything unexpected: report, exit 1
        log.exception("worker %s failed", args.replica_id)
        status.emit("error", detail=str(exc) or type(exc).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
