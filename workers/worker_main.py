"""One replica's worker process: load the backend, prove readiness with a real inference, run the scorer.

    python -m sie.workers.worker_main --spec-file SPEC.json --replica-id fraud-scorer-0 --status-fd 5

The agent starts one of these per replica (``sie.workers.process`` gives it
PR_SET_PDEATHSIG and the status pipe).  It runs the SAME exactly-once scorer as
``sie score`` with instance = replica id, i.e. transactional.id
``sie.scorer.<model>.<replica_id>``: a replica restarted here or moved to another
node fences its zombie predecessor.

Status protocol (one JSON object per line on ``--status-fd``; stdout/stderr go to
the replica's log file):

    {"event": "loading", "pid": 123}                       backend load started
    {"event": "ready", "latency_ms": 1.2, "outputs": {...}, "metrics_port": P}
                                                            readiness inference passed; /metrics on P
    {"event": "progress", "records": N, "lag": L, "p99_ms": X}
                                                            every --progress-interval s (liveness), with
                                                            the scorer's consumer lag and recent p99
    {"event": "draining"}                                   SIGTERM received
    {"event": "error", "detail": "..."}                     fatal; the process exits 1 right after
    {"event": "stopped", "records": N}                      clean exit (0) after a drain

Settings (Kafka connection, topic prefix) come from SIE_* environment variables,
read once here at the entry point; the agent passes its environment through.
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
from pathlib import Path
from typing import Any

from sie.schemas.worker_status import StatusWriter

__all__ = ["CountingBackend", "StatusWriter", "main", "run_worker"]

log = logging.getLogger("sie.worker")


class CountingBackend:
    """Delegates to the loaded backend and counts scored records (the progress the agent watches)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.device = getattr(inner, "device", "cpu")
        self.records = 0
        self._lock = threading.Lock()

    def load(self) -> None:
        """Already loaded (and proven by the readiness inference): loading twice would double the memory."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs = self._inner.infer(inputs)
        with self._lock:
            self.records += len(inputs)
        return outputs

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
    """
    fatal_error = getattr(counter._inner, "fatal_error", None)
    while not stop.wait(interval):
        detail = fatal_error() if callable(fatal_error) else None
        if detail:
            status.emit("error", detail=detail)
            on_fatal(detail)
            return
        status.emit("progress", records=counter.records, **extra())


def _load_spec(path: Path) -> Any:
    from sie.schemas.spec import ModelService

    with open(path, encoding="utf-8") as f:
        return ModelService.from_document(json.load(f))


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


def run_worker(args: argparse.Namespace, status: StatusWriter) -> int:
    """Load, prove readiness, score until SIGTERM. Returns the exit code."""
    from sie.kernel.admin import ensure_model_topics
    from sie.kernel.settings import Settings
    from sie.schemas.spec_policy import SpecPolicy
    from sie.streams.scorer import ScorerConfig
    from sie.streams.scorer.rollout import run_rollout_scorer
    from sie.workers.backends import create_backend
    from sie.workers.readiness import readiness_inference

    stop_event = threading.Event()

    def _on_term(signum: int, _frame: Any) -> None:
        status.emit("draining", signal=signal.Signals(signum).name)
        stop_event.set()

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)

    settings = Settings()
    spec = _load_spec(args.spec_file)
    # The spec came over Kafka: check it against this node's policy before importing or opening anything
    # (the agent did too; a worker started by hand with a spec file gets the same check).
    policy = SpecPolicy.from_settings(settings)
    policy.enforce(spec, source=f"replica {args.replica_id}")
    if spec.backend.modules_path is not None:  # the agent checked the archive too; a worker run by hand did not
        from sie.schemas.module_bundle import check_bundle
        from sie.schemas.spec_parse import InvalidSpec

        problems = check_bundle(spec.backend.modules_path, policy.allowed_modules)
        if problems:
            raise InvalidSpec(f"replica {args.replica_id}", problems)
    status.emit("loading", pid=os.getpid(), model=spec.model_id, replica=args.replica_id)
    backend = create_backend(_backend_config(spec, args, policy))
    try:
        backend.load()
        result = readiness_inference(backend, spec)
        counter = CountingBackend(backend)
        if stop_event.is_set():  # asked to stop while loading: nothing consumed, nothing to commit
            status.emit("stopped", records=0)
            return 0
        topics = spec.topics
        ensure_model_topics(settings, [topics.requests, topics.results, topics.dead_letters], settings.request_partitions)

        progress_stop = threading.Event()
        fatal: list[str] = []

        def on_fatal(detail: str) -> None:
            fatal.append(detail)
            stop_event.set()

        scorers: list[Any] = []

        def own_numbers() -> dict[str, Any]:
            """The scorer's lag and recent p99, forwarded by the agent to the control plane (status page)."""
            metrics = scorers[0].metrics
            p99 = metrics.recent_p99()
            return {"lag": metrics.lag(), "p99_ms": round(p99 * 1000.0, 3) if p99 is not None else None}

        progress = threading.Thread(
            target=_progress_loop, args=(status, counter, args.progress_interval, progress_stop, on_fatal, own_numbers),
            name="progress", daemon=True,
        )

        def on_ready(scorer: Any) -> None:
            # READY = the readiness inference passed AND the scorer is subscribed (Kafka reachable).
            scorers.append(scorer)
            status.emit("ready", latency_ms=round(result.latency_ms, 3), outputs=result.outputs,
                        metrics_port=scorer.metrics.port)
            progress.start()

        # replica ids are unique and stable (the agent's contract): a restarted or moved replica takes its
        # predecessor's group membership at once (static membership) instead of waiting out its session
        config = ScorerConfig(settings=settings, spec=spec, instance=args.replica_id, metrics_port=args.metrics_port,
                              static_membership=True)
        try:
            def load_version(model_spec: Any) -> Any:
                """Own version: the loaded backend; the other version of a rollout (issue 11): checked against
                this node's policy, loaded and proven by a real inference before it gets any traffic."""
                if model_spec.version == spec.version:
                    return counter
                policy.enforce(model_spec, source=f"replica {args.replica_id} rollout to {model_spec.version}")
                other = create_backend(_backend_config(model_spec, args, policy))
                other.load()
                readiness_inference(other, model_spec)
                return other

            summary = run_rollout_scorer(config, load_version, stop_event, on_ready=on_ready)
        finally:
            progress_stop.set()
        log.info("scorer stopped: %s", summary.line() if hasattr(summary, "line") else summary)
    finally:
        backend.close()
    if fatal:
        return 1
    status.emit("stopped", records=counter.records)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sie.workers.worker_main", description=__doc__.splitlines()[0])
    parser.add_argument("--spec-file", type=Path, required=True, help="ModelService document (JSON, to_document form)")
    parser.add_argument("--replica-id", required=True, help="stable replica id, e.g. fraud-scorer-0")
    parser.add_argument("--status-fd", type=int, default=None, help="fd of the status pipe to the agent")
    parser.add_argument("--progress-interval", type=float, default=1.0, help="seconds between progress lines")
    parser.add_argument("--gpu-indices", default="", help="node-local (NVML) indices of the GPUs reserved, e.g. 0,1")
    parser.add_argument("--gpu-memory-mb", type=int, default=0, help="absolute GPU memory budget of this replica")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="scorer /metrics port, 0 = any free one (reported in the ready line); default: none")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stream = os.fdopen(args.status_fd, "w", buffering=1, encoding="utf-8") if args.status_fd is not None else None
    status = StatusWriter(stream)
    try:
        return run_worker(args, status)
    except Exception as exc:  # SieError (bad spec/artifact/readiness) or anything unexpected: report, exit 1
        log.exception("worker %s failed", args.replica_id)
        status.emit("error", detail=str(exc) or type(exc).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
