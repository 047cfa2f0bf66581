"""The LLM scorer: a model's request topic -> a continuous in-flight window of generations -> results,
exactly once.  ``docs/llm.md`` is the user-facing description.

The loop is the shared one: a windowed ``StreamLoop`` (``sie.streams.eos.windowed``) with this scorer as its
stage, on one thread; the generations run on the dispatcher's C workers::

    while not stop:
        room(): up to (max_pending - window.size) records     # full: the partitions are paused instead
        the loop collects them (Batcher: consume(); consumer errors as in every stage)
        accept(): each record -> window.add; poison/expired -> finished at once (dead letter / expired result);
                       else -> a Job queued to the workers (they take the next one as each finishes)
                  finished jobs -> window.finish (result, or dead letter inference_error/output_violation)
        ready(): every commit_interval: window.take_ready() -> the loop commits it as ONE short transaction
                       (ExactlyOnce): its results + dead letters + offsets (last of each partition's prefix + 1)

The commit rule: only each partition's *contiguous finished prefix* is produced and committed
(``sie.streams.llm.window``), so no output exists for an offset beyond the committed one and a replay
from the committed offset can never answer a record twice.  The transaction opens after inference (the
outputs are built before ``begin``), so it lasts milliseconds whatever the generation time.

Failure -> what happens:

* a transaction aborts or the producer is re-created (not COMMITTED): ``failed`` drops the whole window and
  the loop rewinds every partition it held to the committed offsets read back from Kafka (only Kafka knows
  whether an unknown-outcome commit made it); those records are generated again;
* nothing committed for a session's length while transactions fail or a commit hangs: the loop's stall rule
  (``sie.streams.eos.stage``: leave the group, join again after a backoff), as for every stage;
* revoke: the finished prefix is committed first (still our generation), then the partitions' records
  are dropped; lost: dropped; their generations finishing later are ignored (window epochs);
* crash (SIGKILL): nothing uncommitted was ever visible; the next owner reads from the committed offset
  and generates the unfinished records again: the generation repeats, the visible result is one;
* an endpoint outage: the dispatcher re-dispatches to another endpoint (never a dead letter);
* stop (SIGTERM): what is finished is committed; requests in flight are abandoned (redone by the next owner);
  the consumer then leaves the group, so the others take its partitions at once (``eos.transaction.leave_group``).

Quota policy ``delay`` with ``defer`` (the default): a caller over its quota that holds too much of the
window has its held requests moved to the model's deferred topic, in the transaction that commits them
(``sie.streams.llm.defer``); the stage reads that topic back with the same consumer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException

from sie.kernel.clients import KafkaClients
from sie.schemas.spec_models import PRIORITY_LEVELS
from sie.streams.eos import ExactlyOnce, StageSettings, StreamLoop
from sie.streams.eos.deadletter import dead_letter
from sie.streams.eos.errors import RetryLater
from sie.streams.eos.records import Output, Prepared, safe_headers
from sie.streams.llm.config import LLMConfig, with_launched_server
from sie.streams.llm.defer import AtOrigin, DeferPolicy, Origin
from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.fair import FairQueue
from sie.streams.llm.metrics import LLMMetrics
from sie.streams.llm.pool import EndpointPool
from sie.streams.llm.protocols import BadOutput, LLMMapping, Protocol
from sie.streams.llm.quota import Quotas
from sie.streams.llm.window import TP, Window
from sie.streams.scorer.codec import Codec, Poison, Request
from sie.streams.scorer.config import ScorerConfig
from sie.streams.scorer.errors import DeadLetterReason
from sie.streams.scorer.loop import ScorerSummary
from sie.streams.scorer.metrics import ScorerMetrics

log = logging.getLogger("sie.llm")

_MAX_CONSUME = 500


class _Observer:
    def __init__(self, metrics: ScorerMetrics) -> None:
        self._m = metrics

    def aborted(self) -> None:
        self._m.txn_aborts.inc()

    def producer_restarted(self) -> None:
        self._m.producer_restarts.inc()

    def retry_later(self, exc: RetryLater) -> None:  # never raised here: generation happens before the cycle
        self._m.backend_outages.inc()


def output_fields(spec: Any) -> list[tuple[str, str]]:
    fields = getattr(getattr(spec, "output_schema", None), "fields", None) or ()
    return [(str(f.name), str(getattr(f, "type", "string"))) for f in fields]


class LLMScorer:
    """Scores one LLM model's request topic through the in-flight window (module docstring)."""

    def __init__(self, config: ScorerConfig, llm: LLMConfig, *, validator: Callable[[dict], dict] | None = None,
                 clients: KafkaClients | None = None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, metrics: ScorerMetrics | None = None,
                 http_client: Any = None, backend_config: dict[str, Any] | None = None) -> None:
        spec = config.spec
        self.config = config
        self.llm = llm
        if validator is None:
            from sie.schemas.validation import compile_validator

            validator = compile_validator(spec.input_schema)
        from sie.schemas.validation import compile_output_check

        self._codec = Codec(spec.name, validator, config.request_limit, config.max_json_depth)
        self._check_outputs = compile_output_check(spec.output_schema)
        # the spec's backend config, or what run_llm_scorer made of it for a launched server (its served name)
        backend_cfg = dict(backend_config if backend_config is not None else getattr(spec.backend, "config", None) or {})
        self.mapping = LLMMapping(output_fields(spec), backend_cfg)
        self.protocol = Protocol(llm.protocol, self.mapping, backend_cfg)
        self._version = str(spec.version)
        self._clients = clients or KafkaClients()
        self._clock = clock
        self._wall = wall_clock
        self.metrics = metrics or ScorerMetrics.for_spec(spec)
        self.llm_metrics = LLMMetrics(self.metrics.model_id, self.metrics.registry)
        self._http_client = http_client
        self._results_topic = spec.topics.results
        self._dlq_topic = spec.topics.dead_letters
        self._max_queue_ms = spec.sla.max_queue_time_ms
        self._max_record_bytes = config.settings.max_record_bytes
        quotas = backend_cfg.get("quotas")
        self.quotas = Quotas(quotas, clock, first_estimate=self.protocol.max_tokens) if quotas else None
        self.fair = None  # policy delay: requests held for their caller's quota (fair.py)
        if self.quotas is not None and self.quotas.policy == "delay":
            self.fair = FairQueue(self.quotas, self.quotas.max_delay_s,
                                  self.quotas.max_delayed or max(1, llm.pending_limit // 2), clock)
        #: the deferred topic (quota policy delay with defer; None: off, or the topic is missing at start)
        self._deferred_topic: str | None = None
        self.defer_policy: DeferPolicy | None = None
        if self.fair is not None and self.quotas is not None and self.quotas.defer:
            limit = llm.pending_limit
            self._deferred_topic = config.settings.names.llm_deferred_topic(spec.name)
            self.defer_policy = DeferPolicy(self.quotas.defer_over or max(1, limit // 8), self.quotas.defer_after_s,
                                            self.quotas.deferred_window or max(1, limit // 4))
        self._deferred_paused = False
        self.deferred = 0  # requests moved to the deferred topic (committed)
        self._share_stale = True  # recompute this replica's quota share (a rebalance happened)
        self._share_retry_at = 0.0  # after a failed metadata read: not before then (the loop must not stall)
        self.pool = EndpointPool(llm.pool_endpoints(), backoff_s=llm.backoff_s, backoff_max_s=llm.backoff_max_s,
                                 clock=clock)
        for endpoint in self.pool.endpoints:  # every endpoint's weight from the start, not only once it is shifted
            self.llm_metrics.weight.labels(self.metrics.model_id, endpoint.url).set(endpoint.weight)
        self.window = Window()
        #: the traffic director (``sie.control.reconcile.director``): its memory per endpoint and its decisions
        self._tracks: dict[str, Any] = {}
        self.director_decisions: deque[Any] = deque(maxlen=200)
        self._done: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._paused: set[TP] = set()
        self._reassigned = False
        self._consumer: Any = None
        self._stop = threading.Event()
        self._loop: StreamLoop[dict[str, Any]] | None = None
        self.dispatcher: Dispatcher | None = None
        #: what the loop subscribes to: without the deferred topic when it is missing at start
        self._topics = [spec.topics.requests] + ([self._deferred_topic] if self._deferred_topic else [])
        #: the entries ``ready`` took for the transaction in progress, and its prepared outputs
        self._entries: list[Any] = []
        self._prepared: Prepared[dict[str, Any]] = Prepared([], {})
        self._txn_started = 0.0
        self._next_commit = self._next_lag = self._next_direct = 0.0
        self._counts = dict(batches=0, records_in=0, results=0, expired=0, dead_letters=0)
        #: (wall seconds it began, why) while no endpoint answers: the model is in an outage (``_watch_endpoints``)
        self._outage: tuple[float, str] | None = None
        #: seconds of each committed transaction (run_batch: produce + offsets + commit), for the bench
        self.txn_times: list[float] = []

    # --- running -------------------------------------------------------------------------------------
    @property
    def eos(self) -> ExactlyOnce | None:
        return self._loop.eos if self._loop is not None else None

    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> ScorerSummary:
        """A windowed ``StreamLoop`` (``sie.streams.eos.windowed``) with this scorer as its stage, until ``stop``."""
        cfg = self.config
        self._stop = stop
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port, cfg.settings.metrics_bind)
        settings = StageSettings(
            name=f"llm scorer {cfg.spec.name}", topics=self._topics, producer_config=cfg.producer_config(),
            consumer_config=cfg.consumer_config(), max_batch=_MAX_CONSUME, max_wait_s=0.0, idle_s=0.1,
            tick_interval_s=min(cfg.lag_interval_s, self.llm.director_interval_s), limits=cfg.eos_limits(),
            pipelined=False,
            fenced_hint=f"another live scorer probably uses --instance {cfg.instance}: give every replica a distinct "
                        f"--instance")
        self._loop = StreamLoop(settings, self, window=self, clients=self._clients, observer=_Observer(self.metrics),
                                clock=self._clock, wall_clock=self._wall)
        try:
            self._loop.run(stop, on_ready=on_ready)
        finally:
            if self.dispatcher is not None:
                self.dispatcher.close()
            self.metrics.close()
        return self.summary()

    # --- the windowed stage (sie.streams.eos.windowed): StreamLoop calls these ----------------------------
    def started(self, consumer: Any) -> None:
        self._consumer = consumer
        self.dispatcher = Dispatcher(
            self.pool, self.protocol, self.pool.capacity, self._stop, on_done=self._done.put, is_current=self._current,
            timeout_s=self.llm.request_timeout_s, connect_timeout_s=self.llm.connect_timeout_s,
            poison_after=self.llm.poison_after, client=self._http_client, clock=self._clock,
            priority=PRIORITY_LEVELS.index(self.config.spec.priority_level))
        self.dispatcher.start()
        self._check_deferred_topic(consumer)
        now = self._clock()
        self._next_commit = now + self.llm.commit_interval_s
        self._next_lag = now
        self._next_direct = now + self.llm.director_interval_s

    def room(self, consumer: Any) -> tuple[int, float]:
        """Records the window has room for; full: its partitions paused, one poll for rebalances and liveness."""
        assert self.dispatcher is not None
        self.dispatcher.check()
        room = self.llm.pending_limit - self.window.size
        if room > 0:
            if self._paused or self._reassigned:
                self._resume(consumer)
            return min(room, _MAX_CONSUME, self._throttle_deferred(consumer)), (0.02 if self.window.size else 0.1)
        new = [tp for tp in consumer.assignment() if (tp.topic, tp.partition) not in self._paused]
        if new:
            consumer.pause(new)
            self._paused.update((tp.topic, tp.partition) for tp in new)
        return 1, 0.02

    def accept(self, records: list[Any]) -> None:
        for msg in records:
            self._accept(msg)
        if self._share_stale and self.quotas is not None and self._clock() >= self._share_retry_at:
            self._update_share(self._consumer)
        self._defer()
        self._release()
        self._drain()

    def closing(self) -> None:
        self._drain()

    def ready(self, force: bool) -> list[Any]:
        """Every ``commit_interval`` (or a full window with a large finished prefix; or forced): the finished
        prefix of each partition, as one batch (module docstring)."""
        if not force:
            now = self._clock()
            if now < self._next_commit and not self._full_and_ready():
                return []
            self._next_commit = now + self.llm.commit_interval_s
            if self.dispatcher is not None:
                self.llm_metrics.in_flight.set(self.dispatcher.busy)
            self.llm_metrics.endpoints_up.set(self.pool.in_service())
            self._watch_endpoints()
            if self.fair is not None:
                self.llm_metrics.quota_held.set(self.fair.size)
        entries = self._entries = self.window.take_ready()
        if not entries:
            return []
        self._prepared = Prepared([o for e in entries for o in e.outputs or ()], self._stats(entries))
        self._txn_started = self._clock()
        return [e.msg for e in entries]

    def prepare(self, batch: list[Any]) -> Prepared[dict[str, Any]]:
        """The outputs of the entries ``ready`` took: built as each record finished, before the transaction."""
        return self._prepared

    def failed(self) -> dict[TP, int]:
        """Aborted or producer re-created: only Kafka knows what is committed.  Drop the window, rewind all."""
        entries = self._entries
        firsts: dict[TP, int] = dict(self.window.first_offsets())
        for e in entries:
            tp = (e.msg.topic(), e.msg.partition())
            firsts[tp] = min(firsts.get(tp, e.msg.offset()), e.msg.offset())
        dropped = self.window.reset()
        if self.fair is not None:
            self.fair.drop(self._current)
        log.warning("transaction of %d records not committed; %d more records in flight dropped, rewinding %d "
                    "partitions to the committed offsets", len(entries), dropped, len(firsts))
        if self._paused and self._consumer is not None:
            self._resume(self._consumer)
        return firsts

    def _watch_endpoints(self) -> None:
        """Every endpoint failing (its last request got no usable answer): the model is in a backend outage,
        shown where the batch scorer's is (``sie_backend_outage``, the alert ``SieBackendOutage``, the worker's
        progress -> the model Degraded in ``sie describe``), until one answers again."""
        failing = self.pool.failing()
        name = self.config.spec.name
        if len(failing) == len(self.pool.endpoints):
            detail = "no LLM endpoint answers: " + "; ".join(f"{e.url}: {e.last_error}" for e in failing)
            if self._outage is None:
                self._outage = (self._wall(), detail)
                self.metrics.backend_outages.inc()
                wait = (f"expired after sla.max_queue_time_ms {self._max_queue_ms:g}" if self._max_queue_ms is not None
                        else "held until an endpoint answers (no sla.max_queue_time_ms)")
                log.warning("llm scorer %s: backend outage: %s; its requests are %s", name, detail[:500], wait)
            self._outage = (self._outage[0], detail)
            self.metrics.set_outage(*self._outage)
        elif self._outage is not None:
            log.warning("llm scorer %s: backend outage over after %.1fs: %d of %d endpoint(s) answer again", name,
                        self._wall() - self._outage[0], len(self.pool.endpoints) - len(failing),
                        len(self.pool.endpoints))
            self._outage = None
            self.metrics.set_outage(None)

    def _lag(self, consumer: Any) -> dict[int, int]:
        """Per partition of the request topic: records not yet answered = high watermark - position (not yet
        read) + the window's records of it (read, not committed: in flight, held for an endpoint or a quota,
        finished behind an unfinished one).  The batch scorer's lag counts only the first kind, which would
        read 0 while the window holds every request through an outage."""
        topic = self.config.spec.topics.requests
        lags: dict[int, int] = {}
        try:
            assigned = [tp for tp in consumer.assignment() if tp.topic == topic]
            if not assigned:
                return lags
            pending = self.window.pending(topic)
            for tp in consumer.position(assigned):
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    lags[tp.partition] = max(0, high - tp.offset) + pending.get(tp.partition, 0)
        except KafkaException as exc:
            log.debug("lag update skipped: %s", exc)
        return lags

    def tick(self, consumer: Any) -> None:
        now = self._clock()
        if now >= self._next_lag:
            self.metrics.set_lag(self._lag(consumer))
            self._next_lag = now + self.config.lag_interval_s
        if self.llm.director is not None and now >= self._next_direct:
            self.direct(now)
            self._next_direct = now + self.llm.director_interval_s

    def direct(self, now: float) -> None:
        """One look of the traffic director at the endpoints; its weight changes go to the pool at once
        (keys move between endpoints only as far as the weights say), each decision is logged with its numbers."""
        from sie.control.reconcile.director import direct

        self._tracks, decisions = direct(self.pool.signals(), self._tracks, now, self.llm.director)
        for d in decisions:
            endpoint = next(e for e in self.pool.endpoints if e.url == d.name)
            self.pool.set_weight(d.name, endpoint.base_weight * d.weight_after)
            self.director_decisions.append(d)
            self.llm_metrics.director.labels(self.metrics.model_id, d.name, d.action).inc()
            self.llm_metrics.weight.labels(self.metrics.model_id, d.name).set(endpoint.base_weight * d.weight_after)
            log.warning("traffic director %s: %s", d.action, d.reason)  # the reason names the endpoint

    def _full_and_ready(self) -> bool:
        """A full window (consumption paused) whose finished prefix is a quarter of it or more commits at
        once instead of at the next tick (deferring finishes many records at a time); a smaller prefix
        waits for the tick, so a full window of generations finishing one by one is not one
        transaction per record."""
        limit = self.llm.pending_limit
        return self.window.size >= limit and self.window.ready() >= max(1, limit // 4)

    def _check_deferred_topic(self, consumer: Any) -> None:
        """Deferring needs the deferred topic (``sie score`` creates it): without it, producing there would
        abort every transaction, so the stage falls back to holding requests in the window and says so."""
        topic = self._deferred_topic
        if topic is None:
            return
        try:
            meta = consumer.list_topics(topic, timeout=5.0).topics.get(topic)
            ok = meta is not None and meta.error is None and bool(meta.partitions)
        except Exception:  # noqa: BLE001 - a metadata outage at start: do not defer (safe, only less isolation)
            ok = False
        if not ok:
            log.warning("llm scorer %s: the deferred topic %s does not exist; quota policy delay holds requests in "
                        "the window only (create it: sie score creates it at start)", self.config.spec.name, topic)
            self._topics.remove(topic)  # read by the loop's subscribe, right after started()
            self._deferred_topic, self.defer_policy = None, None

    def summary(self) -> ScorerSummary:
        eos = self.eos
        return ScorerSummary(**self._counts, aborts=eos.aborts if eos else 0,
                             producer_restarts=eos.producer_restarts if eos else 0)

    # --- consuming (the loop collects; ``room`` said how much) --------------------------------------------
    def _throttle_deferred(self, consumer: Any) -> int:
        """At most ``deferred_window`` deferred records in the window: at the bound the deferred partitions
        are paused, and while they are not, one consume takes at most what is left below the bound (one
        call may return records of any assigned partition), so deferred records never fill the window for
        the request partitions (defer.py).  Returns how many records the next consume may take."""
        topic, policy = self._deferred_topic, self.defer_policy
        if topic is None or policy is None:
            return _MAX_CONSUME
        left = policy.window - self.window.count(topic)
        over = left <= 0
        if over != self._deferred_paused:
            tps = [tp for tp in consumer.assignment() if tp.topic == topic]
            if tps:
                (consumer.pause if over else consumer.resume)(tps)
            self._deferred_paused = over
        return _MAX_CONSUME if over else left

    def _accept(self, msg: Any) -> None:
        entry = self.window.add(msg)
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        tp = (topic, partition)
        ts_type, ts = msg.timestamp()
        ts_ms = None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts
        origin = None
        if topic == self._deferred_topic:  # a moved request: it answers as at its origin (defer.py)
            origin = Origin.read(safe_headers(msg))
            if origin is None:
                self._finish_dead(tp, offset, entry.epoch, msg, DeadLetterReason.INFERENCE_ERROR,
                                  f"{topic}: a deferred record without valid sie.deferred.* headers")
                return
            msg = AtOrigin(msg, origin)
            entry.info["src"] = msg  # its result's and dead letter's source: the original coordinates
            parsed = self._codec.parse(origin.topic, origin.partition, origin.offset, msg.key(), msg.value(),
                                       origin.timestamp_ms)
            ts_ms = origin.timestamp_ms
        else:
            parsed = self._codec.parse(topic, partition, offset, msg.key(), msg.value(), ts_ms)
        if type(parsed) is Poison:
            self._finish_dead(tp, offset, entry.epoch, msg, parsed.reason, parsed.detail)
            return
        assert isinstance(parsed, Request)
        now_ms = self._wall() * 1000.0
        queue_ms = now_ms - ts_ms if ts_ms is not None and ts_ms < now_ms else 0.0
        max_q = self._max_queue_ms
        if max_q is not None and queue_ms > max_q:
            self._finish_expired(tp, offset, entry.epoch, msg, parsed, queue_ms, max_q)
            return
        caller = "-"
        if self.quotas is not None:
            who = self.quotas.caller(parsed.extra, safe_headers(msg))  # a name alone is not proof (quota.py)
            if who is None:  # unknown_callers: reject
                self._finish_dead(tp, offset, entry.epoch, msg, "quota_exceeded", self.quotas.unknown_why(parsed.extra))
                return
            caller = entry.info["caller"] = who
            if self.fair is None:  # reject: over quota now -> a dead letter in its place in the window
                if self.quotas.wait_s(caller) > 0:
                    self._finish_dead(tp, offset, entry.epoch, msg, "quota_exceeded", self.quotas.why(caller))
                    return
                entry.info["estimate"] = self.quotas.take(caller)
        try:
            prompt = self.mapping.prompt(parsed.inputs)
        except BadOutput as exc:
            self._finish_dead(tp, offset, entry.epoch, msg, DeadLetterReason.INFERENCE_ERROR, str(exc))
            return
        entry.info["req"] = parsed
        rid = f"{topic}:{partition}:{offset}:{uuid.uuid4().hex[:8]}"  # unique among in-flight requests
        job = Job(tp, offset, entry.epoch, msg.key(), self.protocol.request(prompt, rid))
        if max_q is not None:  # not sent (again) once it has queued longer than the SLA (dispatch.py)
            job.deadline = self._clock() + max(0.0, max_q - queue_ms) / 1000.0
        if self.fair is not None:  # delay: held until its caller's quota and its turn allow (fair.py)
            if origin is not None:
                wait = max(0.0, origin.not_before_ms / 1000.0 - self._wall())
                self.fair.hold(job, caller, deferred=True, not_before=self._clock() + wait)
            else:
                self.fair.hold(job, caller)
            return
        assert self.dispatcher is not None
        self.dispatcher.submit(job)

    def _finish_expired(self, tp: TP, offset: int, epoch: int, msg: Any, req: Request, queue_ms: float,
                        max_q: float) -> None:
        """Queued longer than ``sla.max_queue_time_ms``: an ``expired`` result (or dead letter, ``expired_to``)."""
        if self.config.expired_to == "result":
            value = self._codec.expired(req, self._version, queue_ms, max_q)
            self.window.finish(tp, offset, epoch, [Output(self._results_topic, value, req.key, -1, None, msg,
                                                          "expired")], {"kind": "expired"})
        else:
            self._finish_dead(tp, offset, epoch, msg, DeadLetterReason.EXPIRED,
                              f"timestamp: queued {queue_ms:.0f} ms > sla.max_queue_time_ms {max_q:g}")

    def _current(self, job: Job) -> bool:
        return self.window.epoch(job.tp) == job.epoch

    def _defer(self) -> None:
        """Move the held requests of callers over quota that hold too much of the window to the deferred
        topic: each is finished in the window with its copy for that topic, produced in the transaction that
        commits its offset (defer.py)."""
        topic, policy, fair, quotas = self._deferred_topic, self.defer_policy, self.fair, self.quotas
        if topic is None or policy is None or fair is None or quotas is None or not fair.fresh:
            return
        for caller in policy.callers(fair.fresh_held(), quotas.wait_s, self._clock()):
            not_before = int((self._wall() + quotas.wait_s(caller)) * 1000.0)
            for held in fair.take_fresh(caller):
                job = held.job
                entry = self.window.get(job.tp, job.offset, job.epoch)
                if entry is None:  # its partition left the window meanwhile
                    continue
                msg = entry.msg
                ts_type, ts = msg.timestamp()
                origin = Origin(msg.topic(), msg.partition(), msg.offset(),
                                None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts, caller, not_before)
                out = Output(topic, msg.value(), msg.key(), -1, origin.headers(safe_headers(msg)), msg, "deferred")
                self.window.finish(job.tp, job.offset, job.epoch, [out], {"kind": "deferred", "caller": caller})

    def _release(self) -> None:
        """Policy delay: send what the fair queue releases, keeping about C requests submitted and not yet
        taken by a worker (enough that no worker idles until the next turn of the loop)."""
        if self.fair is None or not self.fair.size or self.dispatcher is None:
            return
        room = max(0, self.dispatcher.concurrency - self.dispatcher.queued())
        # a full window pauses consumption for every caller: held records must not be what keeps it full
        for r in self.fair.release(room, full=self.window.size >= self.llm.pending_limit):
            entry = self.window.get(r.job.tp, r.job.offset, r.job.epoch)
            if entry is None:  # its partition left the window meanwhile
                continue
            entry.info["estimate"] = r.estimate
            if r.overrun:
                self.llm_metrics.quota_overruns.inc()
            self.dispatcher.submit(r.job)

    def _update_share(self, consumer: Any) -> None:
        """This replica's share of every quota: its partitions of the request topic / the topic's (quota.py)."""
        topic = self.config.spec.topics.requests
        try:
            meta = consumer.list_topics(topic, timeout=1.0).topics.get(topic)
        except Exception as exc:  # noqa: BLE001 - a metadata outage: keep the old share, try again in 5 s
            meta, why = None, str(exc)[:200]
        else:
            why = "no partitions in its metadata"
        total = len(meta.partitions) if meta is not None and meta.partitions else 0
        if not total:
            self._share_retry_at = self._clock() + 5.0
            log.warning("llm scorer %s: cannot read %s's partitions (%s); quota share stays %.3f, retry in 5 s",
                        self.config.spec.name, topic, why, self.quotas.share if self.quotas else 1.0)
            return
        mine = sum(1 for tp in consumer.assignment() if tp.topic == topic)
        assert self.quotas is not None
        self.quotas.set_share(mine / total)
        self.llm_metrics.quota_share.set(self.quotas.share)
        self._share_stale = False

    # --- finished generations ----------------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            entry = self.window.get(job.tp, job.offset, job.epoch)
            if entry is None:  # its partition was dropped meanwhile
                continue
            self.llm_metrics.generation.observe(max(0.0, job.finished - job.started))
            if job.first_token is not None and job.generation is not None:
                self.llm_metrics.ttft.observe(max(0.0, job.first_token - job.sent))
            if self.quotas is not None:
                gen = job.generation
                used = None if gen is None else (gen.prompt_tokens or 0) + (gen.completion_tokens or 0)
                self.quotas.charge(str(entry.info.get("caller", "-")), used, float(entry.info.get("estimate", 0.0)))
            msg, req = entry.info.get("src", entry.msg), entry.info.get("req")
            if job.expired and isinstance(req, Request) and self._max_queue_ms is not None:
                # it waited for a slot past the SLA (every endpoint out of service): answered, never sent again
                now_ms = self._wall() * 1000.0
                queue_ms = now_ms - req.timestamp_ms if req.timestamp_ms is not None else 0.0
                self._finish_expired(job.tp, job.offset, job.epoch, msg, req, max(queue_ms, 0.0), self._max_queue_ms)
                continue
            detail, reason = job.error, DeadLetterReason.INFERENCE_ERROR
            if detail is None and job.generation is not None and isinstance(req, Request):
                gen = job.generation
                try:
                    outputs = self.mapping.outputs(gen)
                    if self._check_outputs is not None:
                        try:
                            outputs = self._check_outputs(outputs)
                        except ValueError as exc:
                            raise _Violation(str(exc)) from None
                    inference_ms = (job.finished - job.started) * 1000.0
                    first_ms = (job.first_token - job.sent) * 1000.0 if job.first_token is not None else None
                    value = self._result(req, outputs, inference_ms, gen.prompt_tokens, gen.completion_tokens,
                                         first_ms, job.batch)
                except BadOutput as exc:
                    detail = str(exc)
                except _Violation as exc:
                    reason, detail = DeadLetterReason.OUTPUT_VIOLATION, f"model {self._codec.model}: {exc}"
                except TypeError as exc:
                    detail = f"outputs: not JSON-serialisable ({exc})"
                else:
                    self.window.finish(job.tp, job.offset, job.epoch,
                                       [Output(self._results_topic, value, req.key, -1, None, msg, "result")],
                                       {"kind": "ok", "req": req, "prompt_tokens": gen.prompt_tokens or 0,
                                        "completion_tokens": gen.completion_tokens or 0})
                    continue
            self._finish_dead(job.tp, job.offset, job.epoch, msg, reason, detail or "no answer")

    def _result(self, req: Request, outputs: dict[str, Any], inference_ms: float, prompt_tokens: int | None,
                completion_tokens: int | None, first_token_ms: float | None = None, batch: int = 1) -> bytes:
        """The result record.  ``timings``: ``inference_ms`` from the first send to the answer (retries
        included), ``first_token_ms`` (streamed: from the answering attempt's send to its first text),
        ``batch_size`` the requests in flight at the endpoint when it was sent, itself included (the
        continuous batch it joined: the window has no batches of its own)."""
        now_ms = self._wall() * 1000.0
        queue_ms = max(0.0, now_ms - req.timestamp_ms - inference_ms) if req.timestamp_ms is not None else 0.0
        doc = orjson.loads(self._codec.result(req, self._version, outputs, queue_ms, inference_ms, batch))
        if first_token_ms is not None:
            doc["timings"]["first_token_ms"] = round(max(first_token_ms, 0.0), 3)
        doc["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        return orjson.dumps(doc)

    def _finish_dead(self, tp: TP, offset: int, epoch: int, msg: Any, reason: DeadLetterReason | str,
                     detail: str) -> None:
        why = reason.value if isinstance(reason, DeadLetterReason) else reason
        out = dead_letter(self._dlq_topic, msg, why, detail, self._codec.dead_letter_tags(self._version),
                          self._max_record_bytes)
        self.window.finish(tp, offset, epoch, [out], {"kind": "dead", "reason": why})

    # --- committing (the loop runs the transaction; ``ready`` said what is in it) --------------------------------
    def _resume(self, consumer: Any) -> None:
        """Resume EVERY assigned partition, not only those we paused: a partition revoked while paused and
        assigned again may still be paused in librdkafka (resuming one that is not paused is a no-op)."""
        assigned = consumer.assignment()
        if assigned:
            consumer.resume(assigned)
        self._paused.clear()
        self._reassigned = False
        self._deferred_paused = False  # resumed too: the next poll pauses them again if still over the bound

    def _stats(self, entries: list[Any]) -> dict[str, Any]:
        now_ms = self._wall() * 1000.0
        ok = expired = deferred = 0
        dead: dict[str, int] = {}
        latencies: list[float] = []
        oldest = 0.0
        for e in entries:
            kind = e.info.get("kind")
            if kind == "ok":
                ok += 1
            elif kind == "expired":
                expired += 1
            elif kind == "deferred":
                deferred += 1
                continue
            else:
                reason = e.info.get("reason", "inference_error")
                dead[reason] = dead.get(reason, 0) + 1
                continue
            ts_type, ts = e.msg.timestamp()
            if ts_type != TIMESTAMP_NOT_AVAILABLE and ts < now_ms:
                latencies.append(now_ms - ts)
                oldest = max(oldest, now_ms - ts)
        return {"ok": ok, "expired": expired, "deferred": deferred, "dead": dead, "oldest_ms": oldest,
                "queued": {self._version: latencies} if latencies else {}, "at_ms": now_ms,
                "prompt_tokens": sum(int(e.info.get("prompt_tokens", 0)) for e in entries),
                "completion_tokens": sum(int(e.info.get("completion_tokens", 0)) for e in entries)}

    def rejected(self, output: Output, detail: str, stats: Any) -> Output:
        """A result the producer refused (too large): its request is dead-lettered instead."""
        stats[output.kind if output.kind in ("expired", "deferred") else "ok"] -= 1
        stats["dead"]["result_too_large"] = stats["dead"].get("result_too_large", 0) + 1
        return dead_letter(self._dlq_topic, output.source, DeadLetterReason.RESULT_TOO_LARGE.value, detail,
                           self._codec.dead_letter_tags(self._version), self._max_record_bytes)

    def committed(self, value: Any, batch_size: int) -> None:
        stats: dict[str, Any] = value
        took = self._clock() - self._txn_started
        self.txn_times.append(took)
        self.llm_metrics.txn.observe(took)
        c = self._counts
        c["batches"] += 1
        c["records_in"] += batch_size
        c["results"] += stats["ok"]
        c["expired"] += stats["expired"]
        c["dead_letters"] += sum(stats["dead"].values())
        self.deferred += stats["deferred"]
        if stats["deferred"]:
            self.llm_metrics.quota_deferred.inc(stats["deferred"])
        self.metrics.batch_committed(stats, batch_size, self.eos.last_commit_s if self.eos else None,
                                     self._wall() * 1000.0)
        if self._outage is not None:  # results finished before the outage do not end it: an endpoint answering does
            self.metrics.set_outage(*self._outage)
        self.llm_metrics.add_tokens(stats["prompt_tokens"], stats["completion_tokens"])

    # --- rebalances (StreamLoop: on the loop's thread; a revoke committed the finished prefix first) ----------------
    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self._reassigned = True
        self._share_stale = True  # the next poll with room resumes everything assigned (see _resume)

    _on_assign = partitions_assigned

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        dropped = self.window.drop(tps)
        if self.fair is not None:
            self.fair.drop(self._current)
        self._share_stale = True
        self._paused.difference_update(tps)
        self.metrics.clear_lag()
        log.log(logging.WARNING if lost else logging.INFO, "llm scorer %s: %s %s (dropped %d uncommitted records)",
                self.config.spec.name, "lost" if lost else "revoked", [p.partition for p in partitions], dropped)


class _Violation(Exception):
    pass


def run_llm_scorer(config: ScorerConfig, stop: threading.Event, on_ready: Callable[[LLMScorer], None] | None = None,
                   launched_url: str | None = None, **kwargs: Any) -> ScorerSummary:
    """Serve ``config.spec`` through the window until ``stop`` is set (``sie score`` for endpoint specs; the
    agent's worker with ``launched_url``, the SGLang server it started, first among the endpoints:
    ``sie.streams.llm.config.with_launched_server``)."""
    cfg = dict(getattr(config.spec.backend, "config", None) or {})
    if launched_url:  # the launcher serves the model as served_model_name, else as the spec's name
        cfg = with_launched_server(cfg, launched_url, config.spec.name)
    llm = LLMConfig.from_backend_config(cfg)
    scorer = LLMScorer(config, llm, backend_config=cfg, **kwargs)
    return scorer.run(stop, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
