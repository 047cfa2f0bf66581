"""Backfill by replay: re-score a bounded range of a model's request topic with a chosen model version.

Semantics (``docs/connectors.md``):

* **Bounded.** The range ``[from, to)`` per partition is resolved once, when the job is created, and
  stored in the plans topic (``sie.connectors.backfill_plan``); a resumed job replays the same range even
  if ``--to now`` was given and the topic has grown since.
* **Separate.** Results go to the backfill topic (``spec.topics.backfill`` by default), never the live
  results topic; dead letters to ``<backfill topic>-dlq``.  The job's consumer group is
  ``sie.backfill.<job-id>`` and uses ``assign()`` on the planned partitions: the live scorer group's
  offsets are never read for progress and never written.
* **Idempotent.** A result's key is ``<request id>:<version>``.  Request ids are stable across re-reads
  (the request's own ``id``, else ``<topic>:<partition>:<offset>``), so re-running a job, or running a
  second job over the same range, upserts rather than adds in a compacted topic or an upserting sink.
* **Exactly once, resumable.** A bounded run of the shared stage loop (``sie.streams.eos.StreamLoop`` with
  ``ranges``: ``sie.streams.eos.ranges`` has its steps and failures): one batch = one transaction, results, dead
  letters and the group's offsets commit together, with ``transactional.id`` ``sie.backfill.<job-id>``.
  After SIGKILL, re-running with the same ``--job-id`` fences the dead process, starts from the group's
  committed offsets and yields exactly one result (or dead letter) per record in range for
  ``read_committed`` readers.
* **Yields to live traffic.** ``--rate`` and the live-lag gate (``sie.connectors.backfill_throttle``).

Scoring reuses the scorer's request parsing/validation and result building (``sie.streams.scorer.Codec``)
and its poison-row isolation, so a backfilled result is byte-compatible with a live one (same
``id``/``outputs``/``source`` fields) apart from ``timings.queue_ms``, which is 0 (replayed records are
old by definition and ``sla.max_queue_time_ms`` does not apply).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sie.connectors.backfill_plan import (
    BackfillPlan,
    Bound,
    ensure_plans_topic,
    read_plan,
    resolve_ranges,
    write_plan,
)
from sie.connectors.backfill_throttle import BackfillThrottle, LiveLagGate, RateLimiter, live_group_lag
from sie.kernel.clients import (
    KafkaClients,
    eos_consumer_config,
    state_reader_config,
    transactional_producer_config,
)
from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.streams.eos import EosLimits, StageSettings, StreamLoop
from sie.streams.eos.deadletter import dead_letter
from sie.streams.eos.records import Output, Prepared
from sie.streams.scorer import Codec, DeadLetterReason, Inference, InferenceFailed, Poison, canary_row

if TYPE_CHECKING:
    from sie.schemas.spec import ModelService

log = logging.getLogger("sie.backfill")

_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


def check_job_id(job_id: str) -> str:
    if not _JOB_RE.fullmatch(job_id):
        raise ConfigError(f"--job-id: must match {_JOB_RE.pattern} (got {job_id!r})")
    return job_id


@dataclass(frozen=True)
class BackfillConfig:
    """One job.  ``start``/``end`` may be None when resuming a stored job."""

    settings: Settings
    spec: ModelService
    job_id: str
    start: Bound | None = None
    end: Bound | None = None
    source_topic: str | None = None  # default: spec.topics.requests
    output_topic: str | None = None  # default: spec.topics.backfill
    dead_letter_topic: str | None = None  # default: <output topic>-dlq (Names.backfill_dead_letter_topic)
    rate: float | None = None  # records/s; None = unlimited
    max_live_lag: int | None = 1000  # pause while the live group lags more than this; None/0 = never
    lag_interval_s: float = 2.0
    max_batch: int = 500
    poll_timeout_ms: int = 200
    progress_interval_s: float = 1.0
    transaction_timeout_ms: int = 60_000
    max_request_bytes: int | None = None  # None: settings.max_request_bytes
    max_json_depth: int = 64
    limits: EosLimits = field(default_factory=EosLimits)

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if self.max_batch < 1:
            raise ConfigError(f"backfill.max_batch: must be >= 1 (got {self.max_batch})")
        if self.rate is not None and self.rate < 0:
            raise ConfigError(f"--rate: must be > 0 records/s (got {self.rate})")

    @property
    def group_id(self) -> str:
        return self.settings.names.backfill_group(self.job_id)

    @property
    def transactional_id(self) -> str:
        return self.settings.names.backfill_transactional_id(self.job_id)

    @property
    def version(self) -> str:
        return self.spec.version

    def wanted_topics(self) -> tuple[str, str, str]:
        src = self.source_topic or self.spec.topics.requests
        out = self.output_topic or self.spec.topics.backfill
        return src, out, self.dead_letter_topic or self.settings.names.backfill_dead_letter_topic(out)


class _BatchCounts:
    """What one batch did (moved into the job's totals only once it committed)."""

    __slots__ = ("scored", "dead", "last")

    def __init__(self) -> None:
        self.scored = 0
        self.dead: Counter = Counter()
        self.last: dict[int, int] = {}


@dataclass(frozen=True)
class PartitionProgress:
    partition: int
    done: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else 100.0 * self.done / self.total


@dataclass(frozen=True)
class BackfillReport:
    """The final report (also what ``sie backfill`` prints)."""

    job_id: str
    version: str
    complete: bool
    total: int  # offsets in the planned range (records + transaction markers)
    already_done: int  # offsets committed by an earlier run of this job (skipped now)
    scored: int
    dead_letters: dict[str, int]
    duration_s: float
    live_pauses: int
    aborts: int

    @property
    def processed(self) -> int:
        return self.scored + sum(self.dead_letters.values())

    @property
    def gaps(self) -> int:
        """Offsets of the range that held no record to score (commit markers of transactional writers, ...)."""
        return max(0, self.total - self.already_done - self.processed)

    @property
    def throughput(self) -> float:
        return self.processed / self.duration_s if self.duration_s > 0 else 0.0

    def lines(self) -> list[str]:
        dead = ", ".join(f"{k} {v}" for k, v in sorted(self.dead_letters.items())) or "none"
        state = "complete" if self.complete else f"interrupted (resume: sie backfill --job-id {self.job_id} ...)"
        return [
            f"backfill {self.job_id} ({self.version}): {state}",
            f"  range: {self.total} offsets; already done before this run: {self.already_done}",
            f"  scored: {self.scored}; dead-lettered: {sum(self.dead_letters.values())} ({dead})"
            + (f"; offsets without a record (transaction markers, aborted, compacted or retention-deleted records): {self.gaps}"
               if self.complete and self.gaps else ""),
            f"  duration: {self.duration_s:.1f}s; throughput: {self.throughput:,.0f} records/s; "
            f"live-lag pauses: {self.live_pauses}; aborted transactions: {self.aborts}",
        ]


class BackfillJob:
    """Build, ``plan()`` (optional: resolves/stores the range, fails fast), then ``run(stop, backend)``."""

    def __init__(self, config: BackfillConfig, *,
                 progress: Callable[[str], None] | None = None,
                 clients: KafkaClients | None = None,
                 clock: Callable[[], float] = time.monotonic, tracing: Any = None) -> None:
        from sie.kernel.tracing import tracing_from_settings

        self.config = config
        #: sie.kernel.tracing.Tracing: a backfilled request's trace (if it carries one) goes on to its result
        self._tracing = tracing or tracing_from_settings(config.settings, "sie-backfill")
        self._clients = clients or KafkaClients()
        self._inference: Inference | None = None
        self._progress_out = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        self._clock = clock
        spec = config.spec
        from sie.schemas.validation import compile_validator

        validator = compile_validator(spec.input_schema)
        limit = config.max_request_bytes if config.max_request_bytes is not None else config.settings.max_request_bytes
        self._codec = Codec(spec.name, validator, limit, config.max_json_depth)
        self._canary = canary_row(spec.example_input, validator)
        self._plan: BackfillPlan | None = None
        self.live_gate: LiveLagGate | None = None
        self._pos: dict[int, int] = {}
        self._done: set[int] = set()
        self._already_done = 0
        self._consumer: Any = None
        self._scored = 0
        self._dead: Counter = Counter()
        self._job_header = ("sie.backfill.job", config.job_id.encode())
        self._dead_letter_tags = [*self._codec.dead_letter_tags(config.version), self._job_header]
        self._max_record_bytes = config.settings.max_record_bytes

    # --- the plan ---------------------------------------------------------------------------------
    def plan(self) -> BackfillPlan:
        """The stored plan of this job id, or a new one resolved now and stored before anything is scored."""
        if self._plan is not None:
            return self._plan
        cfg = self.config
        src, out, dlq = cfg.wanted_topics()
        ensure_plans_topic(cfg.settings, self._clients)
        stored = read_plan(cfg.settings, cfg.job_id, clients=self._clients)
        if stored is not None:
            conflicts = stored.conflicts(
                model=cfg.spec.name, version=cfg.version,
                source_topic=cfg.source_topic, output_topic=cfg.output_topic, dead_letter_topic=cfg.dead_letter_topic,
                range_from=cfg.start.text if cfg.start else None, range_to=cfg.end.text if cfg.end else None)
            if conflicts:
                raise ConfigError(f"backfill job {cfg.job_id} already exists with another range or target "
                                  f"({'; '.join(conflicts)}); resume it with the same arguments, or pick a new "
                                  f"--job-id")
            self._plan = stored
            return stored
        if cfg.start is None or cfg.end is None:
            raise ConfigError(f"backfill job {cfg.job_id} does not exist yet: give --from and --to")
        # watermarks and offsets_for_times only: assign()s nothing, commits nothing
        probe_config = state_reader_config(
            cfg.settings, cfg.group_id, cfg.settings.names.backfill_client_id(cfg.job_id, "probe"),
            partition_eof=False)
        probe = self._clients.consumer(probe_config)
        try:
            ranges = resolve_ranges(probe, src, cfg.start, cfg.end, config=probe_config)
        finally:
            probe.close()
        plan = BackfillPlan(cfg.job_id, cfg.spec.name, cfg.version, src, out, dlq, cfg.start.text, cfg.end.text,
                            ranges, int(time.time() * 1000))
        write_plan(cfg.settings, plan, clients=self._clients)
        self._plan = plan
        return plan

    # --- running ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, backend: Any,
            on_started: Callable[[BackfillJob], None] | None = None) -> BackfillReport:
        """Score the plan's remaining records with ``backend`` (loaded) until done or ``stop``: a bounded run of
        ``StreamLoop`` (``sie.streams.eos.ranges``) over the plan's ranges, throttled by ``--rate`` and the
        live-lag gate, with this job as its ``BatchProcessor``."""
        cfg = self.config
        self._inference = Inference(backend, self._canary)
        plan = self.plan()
        started = self._clock()
        from sie.kernel.admin import admin_client, ensure_model_topics

        partitions = self._partition_count(plan.source_topic) or len(plan.ranges) or 1
        ensure_model_topics(cfg.settings, [plan.output_topic, plan.dead_letter_topic], partitions,
                            clients=self._clients)
        admin = admin_client(cfg.settings, self._clients)
        live_parts = [r.partition for r in plan.ranges]
        self.live_gate = LiveLagGate(
            lambda: live_group_lag(admin, self._consumer, cfg.spec.group_id, plan.source_topic, live_parts),
            cfg.max_live_lag, cfg.lag_interval_s, self._clock)
        throttle = BackfillThrottle(self.live_gate, RateLimiter(cfg.rate, self._clock), cfg.lag_interval_s)
        settings = StageSettings(
            name=f"backfill {cfg.job_id}", topics=[plan.source_topic],
            # init_transactions(): a zombie run of this job is fenced before its committed offsets are read
            producer_config=transactional_producer_config(cfg.settings, cfg.transactional_id, max_batch=cfg.max_batch,
                                                          transaction_timeout_ms=cfg.transaction_timeout_ms),
            consumer_config=eos_consumer_config(cfg.settings, cfg.group_id,
                                                cfg.settings.names.backfill_client_id(cfg.job_id, "consumer"),
                                                max_batch=cfg.max_batch),
            max_batch=cfg.max_batch, max_wait_s=0.0, idle_s=cfg.poll_timeout_ms / 1000,
            tick_interval_s=cfg.progress_interval_s, limits=cfg.limits, pipelined=False,
            fenced_hint=f"another run of backfill job {cfg.job_id} is live: stop it first")
        loop: StreamLoop[_BatchCounts] = StreamLoop(settings, self, clients=self._clients, clock=self._clock,
                                                    ranges=self._ranges, throttle=throttle)
        loop.run(stop, on_ready=(lambda: on_started(self)) if on_started else None)
        run = loop.range_run
        if run is not None:
            self._done = {p for (_t, p) in run.done}
        self._emit_progress(final=True)
        return BackfillReport(cfg.job_id, cfg.version, len(self._done) == len(plan.ranges), plan.total,
                              self._already_done, self._scored, dict(self._dead), self._clock() - started,
                              self.live_gate.pauses, loop.eos.aborts if loop.eos else 0)

    def _partition_count(self, topic: str) -> int | None:
        from sie.kernel.admin import wait_for_cluster

        meta = wait_for_cluster(self.config.settings, clients=self._clients).topics.get(topic)
        return len(meta.partitions) if meta is not None and meta.partitions else None

    def _ranges(self, consumer: Any) -> dict[tuple[str, int], tuple[int, int]]:
        """The plan's ranges from this job's committed offsets on (a resumed job skips what an earlier run did)."""
        from confluent_kafka import TopicPartition

        plan = self._plan
        assert plan is not None
        self._consumer = consumer
        committed = consumer.committed([TopicPartition(plan.source_topic, r.partition) for r in plan.ranges],
                                       timeout=30)
        resume = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
        bounds, self._already_done = {}, 0
        for r in plan.ranges:
            pos = min(max(resume.get(r.partition, r.start), r.start), r.end)
            self._pos[r.partition] = pos
            self._already_done += pos - r.start
            bounds[(plan.source_topic, r.partition)] = (pos, r.end)
            if pos >= r.end:
                self._done.add(r.partition)
        return bounds

    # --- BatchProcessor (sie.streams.eos.stage): the loop calls these ---------------------------------------
    def started(self, consumer: Any) -> None:
        self._consumer = consumer

    def prepare(self, batch: list[Any]) -> Prepared[_BatchCounts]:
        return self._prepare(batch)

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        return self._rejected(output, detail, value)

    def committed(self, value: Any, batch_size: int) -> None:
        counts: _BatchCounts = value
        self._scored += counts.scored
        self._dead.update(counts.dead)
        for p, off in counts.last.items():
            self._pos[p] = off + 1

    def tick(self, consumer: Any) -> None:
        self._emit_progress()

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Never called: a bounded run assign()s its partitions."""

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        """Never called: a bounded run assign()s its partitions."""

    # --- one batch (prepared outside the transaction, then produced and committed by the layer) ----------
    def _prepare(self, batch: list) -> Prepared[_BatchCounts]:
        codec = self._codec
        cfg = self.config
        plan = self._plan
        assert plan is not None
        version = cfg.version
        counts = _BatchCounts()
        outputs: list[Output | None] = [None] * len(batch)
        valid = []
        for i, msg in enumerate(batch):
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            counts.last[partition] = offset
            parsed = codec.parse(topic, partition, offset, msg.key(), msg.value(), None)
            if type(parsed) is Poison:
                outputs[i] = self._dead_letter(msg, parsed.reason, parsed.detail)
                counts.dead[parsed.reason.value] += 1
                continue
            valid.append((i, parsed))
        if valid:
            rows = [req.inputs for _i, req in valid]
            t0 = time.perf_counter()
            assert self._inference is not None
            scored = self._inference.run(rows)  # BackendUnavailable: retried later, nothing produced
            inference_ms = (time.perf_counter() - t0) * 1000.0
            n = len(rows)
            headers = [self._job_header]
            for (i, req), out in zip(valid, scored):
                detail = out.detail if type(out) is InferenceFailed else None
                if detail is None:
                    try:
                        value = codec.result(req, version, out, 0.0, inference_ms, n)
                    except TypeError as exc:
                        detail = f"outputs: not JSON-serialisable ({exc})"
                    else:
                        outputs[i] = Output(plan.output_topic, value, f"{req.id}:{version}".encode(), -1, headers,
                                            batch[i], "result")
                        counts.scored += 1
                        continue
                outputs[i] = self._dead_letter(batch[i], DeadLetterReason.INFERENCE_ERROR, detail)
                counts.dead[DeadLetterReason.INFERENCE_ERROR.value] += 1
        prepared = [o for o in outputs if o is not None]
        if self._tracing.enabled:
            from sie.connectors.tracing import carry_traces

            carry_traces(self._tracing, f"sie.backfill {cfg.job_id}", prepared, start_new=False,
                         attributes={"sie.backfill.job": cfg.job_id, "sie.version": version})
        return Prepared(prepared, counts)

    def _rejected(self, output: Output, detail: str, counts: _BatchCounts) -> Output:
        """A result too large to write: its request is dead-lettered instead."""
        counts.scored -= 1
        counts.dead[DeadLetterReason.RESULT_TOO_LARGE.value] += 1
        return self._dead_letter(output.source, DeadLetterReason.RESULT_TOO_LARGE, detail)

    def _dead_letter(self, msg: Any, reason: DeadLetterReason, detail: str) -> Output:
        plan = self._plan
        assert plan is not None
        return dead_letter(plan.dead_letter_topic, msg, reason.value, detail, self._dead_letter_tags,
                           self._max_record_bytes)

    # --- progress -------------------------------------------------------------------------------------
    def progress(self) -> list[PartitionProgress]:
        plan = self._plan
        if plan is None:
            return []
        out = []
        for r in plan.ranges:
            done = r.total if r.partition in self._done else min(r.total, max(0, self._pos.get(r.partition, r.start)
                                                                              - r.start))
            out.append(PartitionProgress(r.partition, done, r.total))
        return out

    def _emit_progress(self, final: bool = False) -> None:
        rows = self.progress()
        total = sum(p.total for p in rows)
        done = sum(p.done for p in rows)
        pct = 100.0 if total == 0 else 100.0 * done / total
        head = "final" if final else "progress"
        lines = [f"backfill {self.config.job_id} {head}: {done}/{total} ({pct:.1f}%)"]
        lines += [f"  partition {p.partition}: {p.done}/{p.total} ({p.percent:.1f}%)" for p in rows]
        self._progress_out("\n".join(lines))
