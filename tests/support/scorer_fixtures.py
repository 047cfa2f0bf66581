"""Test model and spec builders for the scorer tests.

``echo`` is a tiny python-backend model (``y = 2 * x``) so the scorer tests
exercise exactly the production code path (spec -> create_backend -> infer)
without torch's start-up cost.  ``x == -1`` makes it raise: a poison *row*
(valid by schema, fatal for the model), for inference_error isolation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

POISON_X = -1.0


def echo(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """y = 2x for a batch; raises on the poison value."""
    out = []
    for row in rows:
        if row["x"] == POISON_X:
            raise ValueError(f"model cannot score x={POISON_X}")
        out.append({"y": row["x"] * 2.0})
    return out


def unsquashed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A broken model version (redrive tests): logits, not probabilities (out of the declared range [0, 1])."""
    return [{"p": row["x"] - 0.5} for row in rows]


def squashed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Its fix: the missing squash."""
    return [{"p": min(1.0, max(0.0, row["x"]))} for row in rows]


def echo_canary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new version of ``echo`` that cannot score 1 row in 20 (x % 20 == 3): the rollout tests' bad canary."""
    for row in rows:
        if int(row["x"]) % 20 == 3:
            raise ValueError("canary cannot score this row")
    return echo(rows)


def echo_slow(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new version of ``echo`` that takes 60 ms more per batch: the rollout tests' slow canary."""
    time.sleep(0.06)  # the model's own compute time, not synchronisation
    return echo(rows)


#: the rollout-gates bench's model: a fixed cost per call (like a GPU forward pass), slept so it measures the
#: gates, not the machine's spare CPU
PACED_CALL_S = 0.02


def paced(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``echo`` taking PACED_CALL_S per call (the model's own compute time, not synchronisation)."""
    time.sleep(PACED_CALL_S)
    return echo(rows)


def paced_3x(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new version of ``paced`` that takes 3x as long per call: the gates bench's slow canary."""
    time.sleep(3 * PACED_CALL_S)  # the model's own compute time, not synchronisation
    return echo(rows)


def paced_errors(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new version of ``paced`` that cannot score 1 row in 20 (``echo_canary``): the gates bench's erring canary."""
    time.sleep(PACED_CALL_S)  # the model's own compute time, not synchronisation
    return echo_canary(rows)


def echo_hang(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model that hangs on every request but the spec's example (so it passes readiness): the multi-model
    process's watchdog tests.  It sleeps (the model's own stuck call, not synchronisation) for 10 minutes."""
    if any(row["x"] != 1.0 for row in rows):
        time.sleep(600)
    return echo(rows)


def echo_raise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model that raises on every request but the spec's example: each request is an inference_error."""
    if any(row["x"] != 1.0 for row in rows):
        raise ValueError("this model fails on every request")
    return echo(rows)


def rules_or_outage(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rules model for the fraud-rules schema (risk from the merchant's risk), but every call fails while the
    file named by ``SIE_TEST_OUTAGE_FLAG`` exists: the model's own dependency is down (an outage: the scorer
    retries, never dead-letters)."""
    import os

    flag = os.environ.get("SIE_TEST_OUTAGE_FLAG")
    if flag and os.path.exists(flag):
        raise ConnectionError("feature store 10.0.0.7:6379 refused the connection")
    return [{"risk_score": float(row["merchant_risk"]), "reason": "merchant risk"} for row in rows]


def echo_version_spec(name: str, version: str, callable_name: str = "echo", rollout: dict | None = None):
    """``echo_spec`` at another version / with another callable of this module / a rollout block."""
    from sie.schemas.spec import load

    doc = echo_spec_doc(name)
    doc["spec"]["model"]["version"] = version
    doc["spec"]["backend"]["callable"] = f"tests.support.scorer_fixtures:{callable_name}"
    if rollout is not None:
        doc["spec"]["rollout"] = rollout
    return load(doc)


def echo_spec_doc(name: str | None = None, max_queue_time_ms: float | None = None) -> dict[str, Any]:
    """A Kubernetes-style ModelService for ``echo``; a unique name gives unique topics and group."""
    name = name or f"echo-{uuid.uuid4().hex[:10]}"
    sla: dict[str, Any] = {"p99_latency_ms": 100}
    if max_queue_time_ms is not None:
        sla["max_queue_time_ms"] = max_queue_time_ms
    return {
        "apiVersion": "sie.lmsys.org/v1",
        "kind": "ModelService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},
            "priorityLevel": "P1",
            "serviceType": "scoring",
            "backend": {"type": "python", "callable": "tests.support.scorer_fixtures:echo"},
            "resources": {"gpuMemoryMb": 0, "cpu": 0.5},
            "inputSchema": {"type": "json", "fields": [{"name": "x", "type": "float"}]},
            "outputSchema": {"type": "json", "fields": [{"name": "y", "type": "float"}]},
            "sla": sla,
            "exampleInput": {"x": 1.0},
        },
    }


def echo_spec(name: str | None = None, max_queue_time_ms: float | None = None):
    from sie.schemas.spec import load

    return load(echo_spec_doc(name, max_queue_time_ms))


def write_echo_spec(directory: Path, name: str | None = None, max_queue_time_ms: float | None = None) -> Path:
    doc = echo_spec_doc(name, max_queue_time_ms)
    path = directory / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


#: what a node running the test model must allow (SIE_ALLOWED_MODULES): the demo's package and this module
ALLOWED_MODULES = ("models.fraud", "tests.support.scorer_fixtures")
#: the LLM servers a test node allows (SIE_SGLANG_ENDPOINTS): the fake servers, all on loopback
LLM_ENDPOINTS = ("127.0.0.1",)


def echo_policy():
    from sie.schemas.spec_policy import SpecPolicy

    return SpecPolicy(allowed_modules=ALLOWED_MODULES)


def load_echo_backend(spec):
    """The backend_factory for ``ScorerThread`` (``run_rollout_scorer``): the real python backend, loaded (under a policy allowing it)."""
    from sie.workers.backends import backend_config_from_spec, create_backend

    backend = create_backend(backend_config_from_spec(spec, echo_policy()))
    backend.load()
    return backend


# --- processes and proofs for the Kafka tests ---------------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class LoggedProcess:
    """A child process with its output in a file (the scorer CLI, a multi-model worker process)."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            self.kill()


class ScorerProcess(LoggedProcess):
    """``python -m sie score`` as a child process (the real CLI), with its output in a file."""

    def __init__(self, spec_path: Path, bootstrap: str, instance: str, log_dir: Path, *extra: str,
                 env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> None:
        """``prefix``: what runs the command (e.g. ``ip netns exec <node>``: tests/support/netns.py)."""
        cmd = [*prefix, sys.executable, "-m", "sie", "--bootstrap-servers", bootstrap, "score", "-f", str(spec_path),
               "--instance", instance, "--max-batch", "500", "--max-wait-ms", "10", "--partitions", "4",
               "--session-timeout-ms", "6000", "--log-level", "warning", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ALLOWED_MODULES": ",".join(ALLOWED_MODULES),
               "SIE_SGLANG_ENDPOINTS": ",".join(LLM_ENDPOINTS), **(env or {})}
        super().__init__(cmd, log_dir / f"scorer-{instance}-{time.monotonic_ns()}.log", env)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"scorer exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        return "ready:" in self.output()


class CommittedReader:
    """An assigned read_committed consumer that counts what the scorer has committed so far.

    ``count()`` reads what is there now without waiting (a progress probe for ``wait_until``);
    ``read_to_end()`` reads on to the end every partition has now and fails at its deadline.
    """

    def __init__(self, settings, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer(settings.kafka_client_config(**{
            "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest", "enable.partition.eof": True,
            # the end is known from an empty fetch at it (partition EOF): answered at once, not after 500 ms
            "fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 5}))
        md = self._consumer.list_topics(topic, timeout=10)
        self._topic = topic
        self._partitions = sorted(md.topics[topic].partitions)
        self._consumer.assign([TopicPartition(topic, p, -2) for p in self._partitions])
        self._reached: dict[int, int] = {}
        self.records: list = []

    def count(self) -> int:
        from tests.support.helpers import read_up_to

        while True:
            # consume() waits its whole timeout unless 5000 are there: short, the callers loop (wait_until, read_to_end)
            msgs = self._consumer.consume(5000, 0.05)
            self.records.extend(m for m in msgs if read_up_to(self._reached, m))
            if len(msgs) < 5000:
                return len(self.records)

    def read_to_end(self, timeout: float = 30.0) -> int:
        """Read on to the end each partition has now (the last stable offset) and return the count, so a
        duplicate committed after the awaited count is counted too; AssertionError naming the partitions
        short of their end at the deadline ("nothing for 0.2 s" is not the end)."""
        from tests.support.helpers import behind, end_offsets

        ends = end_offsets(self._consumer, self._topic, self._partitions)
        deadline = time.monotonic() + timeout
        while behind(self._reached, ends):
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self._topic}: not read to its end within {timeout:.0f}s (read up to/end: "
                                     f"{behind(self._reached, ends)}; {len(self.records)} records)")
            self.count()
        return len(self.records)

    def close(self) -> None:
        self._consumer.close()


def request_id_of_dead_letter(value: bytes | None, headers: dict[str, bytes]) -> str:
    """The id a dead-lettered request had (its own "id", else the deterministic default)."""
    try:
        import orjson

        doc = orjson.loads(value) if value else None
        if isinstance(doc, dict) and isinstance(doc.get("id"), (str, int)) and not isinstance(doc.get("id"), bool):
            return str(doc["id"])
    except Exception:
        pass
    return "{}:{}:{}".format(headers["sie.source.topic"].decode(), headers["sie.source.partition"].decode(),
                             headers["sie.source.offset"].decode())


def exactly_once_report(results: list, dead_letters: list, expected_ids: set[str]) -> dict[str, Any]:
    """Counts of missing / duplicated / unexpected ids over results + dead letters."""
    import orjson

    seen = Counter(orjson.loads(m.value())["id"] for m in results)
    seen.update(request_id_of_dead_letter(m.value(), dict(m.headers() or [])) for m in dead_letters)
    return {
        "missing": sorted(expected_ids - set(seen))[:10],
        "missing_count": len(expected_ids - set(seen)),
        "duplicates": sorted(i for i, c in seen.items() if c > 1)[:10],
        "duplicate_count": sum(c - 1 for c in seen.values() if c > 1),
        "unexpected": sorted(set(seen) - expected_ids)[:10],
    }


def produce_requests(settings, topic: str, values: list[tuple[bytes | None, bytes | None]]) -> None:
    """Fast bulk produce of raw (key, value) pairs (acks=all, idempotent: ``tests.support.helpers.produce_to``)."""
    from tests.support.helpers import produce_to

    produce_to(settings, topic, ((key, value, None) for key, value in values))


def group_assignment(settings, group_id: str) -> dict[str, list[int]]:
    """group.instance.id (else member id) -> the partitions it owns now ({} while the group is unreadable)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client_config())
    try:
        desc = admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result(timeout=10)
    except Exception:
        return {}
    return {(m.group_instance_id or m.member_id): sorted(tp.partition for tp in m.assignment.topic_partitions)
            for m in desc.members}


def group_members(settings, group_id: str) -> int:
    """Members of a consumer group now (0 if it can't be described yet)."""
    return len(group_assignment(settings, group_id))


# --- in-process scorer and the exactly-once proof (the scorer Kafka tests) ------------------------------

import threading  # noqa: E402
import traceback  # noqa: E402

import orjson  # noqa: E402

from sie.kernel.admin import ensure_model_topics  # noqa: E402
from sie.streams.scorer import ScorerConfig  # noqa: E402
from sie.streams.scorer.rollout import run_rollout_scorer  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402


def requests(n: int, prefix: str = "r") -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 997}".encode(), orjson.dumps({"id": f"{prefix}{i}", "inputs": {"x": float(i)},
                                                   "metadata": {"n": i}})) for i in range(n)]


class ScorerThread:
    """The scorer ``sie score`` and the node agent's worker run (``run_rollout_scorer``: a ``RolloutScorer``
    reading its model's weights from the rollouts topic), in a thread of the test process for a fast start.

    The one difference from ``sie score``: the other version of a rollout, if any, loads in this process
    (``InProcessVersions``, the default) rather than in a process of its own.
    """

    def __init__(self, settings, spec, instance: str = "t0", backend_factory=None,
                 stop: threading.Event | None = None, scorer_kwargs: dict | None = None, **overrides) -> None:
        """``stop``: the stop event (e.g. a ``StopRequest``, to hand over); ``backend_factory(spec)``: a loaded
        backend (default: the echo backend); ``scorer_kwargs``: the scorer's (``tracing``, ``metrics`` ...);
        ``overrides``: ScorerConfig fields."""
        self.scorer_kwargs = scorer_kwargs or {}
        self.backend_factory = backend_factory or load_echo_backend
        self.stop = stop if stop is not None else threading.Event()
        self.ready = threading.Event()
        self.summary = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.config = ScorerConfig(settings=settings, spec=spec, instance=instance,
                                   **{"max_wait_ms": 10, "session_timeout_ms": 6000, **overrides})
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.summary = run_rollout_scorer(self.config, self.backend_factory, self.stop,
                                              on_ready=lambda _s: self.ready.set(), **self.scorer_kwargs)
        except BaseException as exc:  # surfaced by close()
            self.error = exc

    def stack(self) -> str:
        """Where the scorer thread is now (for failure messages: a stall names its blocking call)."""
        frame = sys._current_frames().get(self.thread.ident or -1)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"

    def close(self, raise_error: bool = True):
        """Stop and join; the scorer's error is raised (``raise_error=False``: kept in ``error``, for tests
        expecting the scorer to fail)."""
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), f"scorer did not stop within 30s; it is in:\n{self.stack()}"
        if self.error and raise_error:
            raise self.error
        return self.summary


def topics_for(settings, spec, partitions: int = 4) -> None:
    from sie.streams.llm.config import deferred_topic

    t = spec.topics
    ensure_model_topics(settings, [t.requests, t.results, t.dead_letters, deferred_topic(spec, settings.names)],
                        partitions)


def prove_exactly_once(settings, spec, ids: set[str], timeout: float = 60.0) -> tuple[list, list]:
    results = CommittedReader(settings, spec.topics.results)
    dlq = CommittedReader(settings, spec.topics.dead_letters)
    try:
        wait_until(lambda: results.count() + dlq.count() >= len(ids), timeout,
                   message=lambda: f"{len(ids)} outputs (have {len(results.records)} + {len(dlq.records)})")
        results.read_to_end(), dlq.read_to_end()  # on to the end: a duplicate past the count is counted too
        report = exactly_once_report(results.records, dlq.records, ids)
        assert report["missing_count"] == 0 and report["duplicate_count"] == 0 and not report["unexpected"], report
        return results.records, dlq.records
    finally:
        results.close()
        dlq.close()
