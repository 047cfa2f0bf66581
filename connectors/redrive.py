"""Dead-letter redrive: a model's dead letters back onto its request topic, exactly once, each at most once.

After a fix (a new model version, a corrected schema), the requests that were dead-lettered can be scored
again.  ``Redrive`` reads the model's dead-letter topic and, for each dead letter of the chosen reason(s),
produces its original request (key and value: a dead letter keeps them byte for byte) to the model's request
topic, on the exactly-once layer: the produced requests and the consumer offsets commit in one transaction
(a bounded run of ``sie.streams.eos.StreamLoop``, like backfill: ``sie.streams.eos.ranges``).

**The mark.**  Each (model, reason) has its own consumer group, ``<p>.redrive.<model>.<reason>``
(``Names.redrive_group``): its committed offsets on the dead-letter topic are what has been redriven.  A run
starts at them and stops at the ends the topic had when it started, so a re-run (or a run after a crash)
sends nothing twice, and a dead letter written later (the fix did not work) is left for the next run.  A group
per reason, not per model: a dead letter has one reason, so it is considered by exactly one cursor, and
``--reason output_violation`` today does not pass over the ``inference_error`` ones someone may redrive
tomorrow.  ``since_ms`` starts a cursor at that time instead of its mark when later: older dead letters of
that reason are passed over (the mark moves past them).

Each redriven request carries ``sie.redrive.of = <dlq topic>:<partition>:<offset>`` and
``sie.redrive.reason``; the dead letter's other ``sie.*`` headers are dropped (they described the failure).
A request that had no ``id`` gets the id it had (``<topic>:<partition>:<offset>`` of the original request),
so its result answers the original.  A dead letter whose value or key was cut down to fit
(``sie.truncated``/``sie.key.truncated``) is not redriven (its original is at its source coordinates): it is
counted and listed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sie.kernel.authz import topic_partitions
from sie.kernel.clients import KafkaClients, eos_consumer_config, transactional_producer_config
from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.schemas.request import DLQ_REASONS
from sie.streams.eos import Output, Prepared, StageSettings, StreamLoop, close_quietly
from sie.streams.eos.deadletter import dead_letter
from sie.streams.eos.records import safe_headers

log = logging.getLogger("sie.redrive")

H_REDRIVE_OF = "sie.redrive.of"
H_REDRIVE_REASON = "sie.redrive.reason"
_TRUNCATED = ("sie.truncated", "sie.key.truncated", "sie.headers.dropped")


@dataclass(frozen=True)
class RedriveConfig:
    settings: Settings
    model: str
    dead_letter_topic: str
    request_topic: str
    reasons: tuple[str, ...] = DLQ_REASONS
    since_ms: int | None = None
    max_batch: int = 500
    poll_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        unknown = [r for r in self.reasons if r not in DLQ_REASONS]
        if unknown:
            raise ConfigError(f"--reason {unknown[0]!r}: not a dead-letter reason (known: {', '.join(DLQ_REASONS)})")

    @classmethod
    def for_spec(cls, settings: Settings, spec: Any, **kwargs: Any) -> RedriveConfig:
        return cls(settings, spec.name, spec.topics.dead_letters, spec.topics.requests, **kwargs)


@dataclass
class RedriveReport:
    """What a run did, per reason."""

    model: str
    redriven: Counter[str] = field(default_factory=Counter)
    not_redriven: list[str] = field(default_factory=list)  # cut-down dead letters: "<coords> (<why>)"
    passed_over: int = 0  # before --since
    complete: bool = True
    seconds: float = 0.0
    aborts: int = 0

    def lines(self) -> list[str]:
        total = sum(self.redriven.values())
        out = [f"redrive {self.model}: {total} dead letter(s) sent back to be scored again in {self.seconds:.1f}s"
               + ("" if self.complete else " (stopped before the end: run it again to go on)")]
        out += [f"  {reason}: {n}" for reason, n in sorted(self.redriven.items()) if n]
        if self.passed_over:
            out.append(f"  passed over (before --since): {self.passed_over}")
        if self.not_redriven:
            out.append(f"  not redriven, cut down to fit (the original is at its source): {len(self.not_redriven)}")
            out += [f"    {item}" for item in self.not_redriven[:10]]
        return out


def _original_id(value: bytes | None, headers: dict[str, bytes]) -> bytes | None:
    """``value`` with the id the original request had, when it had none (else None: keep the bytes)."""
    if not value or value[:1] != b"{":
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or "id" in doc:
        return None
    try:
        coords = [headers[k].decode() for k in ("sie.source.topic", "sie.source.partition", "sie.source.offset")]
    except (KeyError, UnicodeDecodeError):
        return None
    return orjson.dumps({"id": ":".join(coords), **doc})


class _Cursor:
    """One reason's cursor as the ``BatchProcessor`` of its bounded run (``sie.streams.eos.stage``)."""

    def __init__(self, redrive: Redrive, reason: str, report: RedriveReport, consumer_config: dict[str, Any]) -> None:
        self._redrive = redrive
        self._consumer_config = consumer_config
        self._reason = reason
        self._report = report
        #: offsets before ``--since`` the mark moves past (set by ``ranges``, which the loop may call twice)
        self.passed_over = 0

    def ranges(self, consumer: Any) -> dict[tuple[str, int], tuple[int, int]]:
        """From the cursor's mark (or ``since_ms``, when later) to the topic's ends now, per partition."""
        from confluent_kafka import TopicPartition

        cfg = self._redrive.config
        topic = cfg.dead_letter_topic
        self.passed_over = 0
        # NotAuthorized (naming the principal and the ACL) when the topic is not this principal's to read
        partitions = topic_partitions(consumer, topic, self._consumer_config, "READ")
        if partitions is None:
            return {}  # no dead-letter topic: nothing was ever dead-lettered
        tps = [TopicPartition(topic, p) for p in partitions]
        marks = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False) for tp in tps}
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
        since = {}
        if cfg.since_ms is not None:
            found = consumer.offsets_for_times([TopicPartition(topic, tp.partition, cfg.since_ms) for tp in tps],
                                               timeout=10)
            since = {tp.partition: (tp.offset if tp.offset >= 0 else marks[tp.partition][1]) for tp in found}
        bounds = {}
        for p, (low, end) in marks.items():
            start = max(committed[p] if committed[p] >= 0 else low, low)
            if p in since and since[p] > start:
                self.passed_over += since[p] - start  # offsets (a marker or two included)
                start = since[p]
            bounds[(topic, p)] = (start, end)
        return bounds

    def started(self, consumer: Any) -> None:
        pass

    def prepare(self, batch: list[Any]) -> Prepared[dict[str, Any]]:
        return self._redrive._prepare(self._reason, batch)

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        return self._redrive._rejected(output, detail, value)

    def committed(self, value: Any, batch_size: int) -> None:
        if value["redriven"]:
            self._report.redriven[self._reason] += value["redriven"]
        self._report.not_redriven += value["not_redriven"]

    def tick(self, consumer: Any) -> None:
        pass

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Never called: a bounded run assign()s its partitions."""

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        """Never called: a bounded run assign()s its partitions."""


class Redrive:
    """Run once: ``Redrive(config).run(stop)`` -> ``RedriveReport``."""

    def __init__(self, config: RedriveConfig, clients: KafkaClients | None = None) -> None:
        self.config = config
        self._clients = clients or KafkaClients()

    def run(self, stop: threading.Event) -> RedriveReport:
        started = time.monotonic()
        report = RedriveReport(self.config.model)
        if not self._readable():
            return report  # no dead-letter topic: nothing was ever dead-lettered
        for reason in self.config.reasons:
            if stop.is_set():
                report.complete = False
                break
            self._run_reason(reason, stop, report)
        report.seconds = time.monotonic() - started
        return report

    def _readable(self) -> bool:
        """Whether the dead-letter topic exists; ``NotAuthorized`` (naming the principal and the ACL) when it is not
        this principal's to read.  Before any cursor starts its transactional producer: a run with nothing to read
        fences nobody, and a principal lacking both ACLs is told about the topic it asked to read first."""
        cfg = self.config
        group = cfg.settings.names.redrive_group(cfg.model, cfg.reasons[0]) if cfg.reasons else None
        if group is None:
            return False
        config = eos_consumer_config(cfg.settings, group, cfg.settings.names.stage_client_id(group, "consumer"),
                                     max_batch=cfg.max_batch)
        consumer = self._clients.consumer(config)
        try:
            return topic_partitions(consumer, cfg.dead_letter_topic, config, "READ") is not None
        finally:
            close_quietly(consumer, None)

    # --- one reason: one cursor (group), one transactional id -----------------------------------------
    def _run_reason(self, reason: str, stop: threading.Event, report: RedriveReport) -> None:
        """One cursor's bounded run of ``StreamLoop`` (``sie.streams.eos.ranges``): from its mark to the ends
        the dead-letter topic had when it started."""
        cfg = self.config
        names = cfg.settings.names
        group = names.redrive_group(cfg.model, reason)
        consumer_config = eos_consumer_config(cfg.settings, group, names.stage_client_id(group, "consumer"),
                                              max_batch=cfg.max_batch)
        cursor = _Cursor(self, reason, report, consumer_config)
        settings = StageSettings(
            name=f"redrive {cfg.model} {reason}", topics=[cfg.dead_letter_topic],
            # init_transactions(): a zombie run of this cursor is fenced before its mark is read
            producer_config=transactional_producer_config(
                cfg.settings, names.redrive_transactional_id(cfg.model, reason), max_batch=cfg.max_batch),
            consumer_config=consumer_config,
            max_batch=cfg.max_batch, max_wait_s=0.0, idle_s=cfg.poll_timeout_s, tick_interval_s=3600.0,
            pipelined=False,
            fenced_hint=f"another `sie dlq redrive --model {cfg.model}` of reason {reason} is live: let it finish")
        loop: StreamLoop[dict[str, Any]] = StreamLoop(settings, cursor, clients=self._clients, ranges=cursor.ranges)
        loop.run(stop)
        report.passed_over += cursor.passed_over
        if loop.eos is not None:
            report.aborts += loop.eos.aborts
        if loop.range_run is not None and not loop.range_run.finished:
            report.complete = False  # stopped before the end

    def _prepare(self, reason: str, batch: Sequence[Any]) -> Prepared[dict[str, Any]]:
        """Outside the transaction: one request per dead letter of ``reason`` (others: their cursor's)."""
        cfg = self.config
        outputs: list[Output] = []
        counts: dict[str, Any] = {"redriven": 0, "not_redriven": []}
        wanted = reason.encode()
        for msg in batch:
            original = safe_headers(msg)
            headers = dict(original or ())
            if headers.get("sie.reason") != wanted:
                continue  # another reason's dead letter: its own cursor redrives it
            coords = f"{msg.topic()}:{msg.partition()}:{msg.offset()}"
            cut = [h for h in _TRUNCATED if h in headers and h != "sie.headers.dropped"]
            if cut or original is None:
                counts["not_redriven"].append(f"{coords} ({', '.join(cut) or 'headers undecodable'})")
                continue
            kept = [(k, v) for k, v in original if not k.startswith("sie.")]
            kept += [(H_REDRIVE_OF, coords.encode()), (H_REDRIVE_REASON, wanted)]
            value = _original_id(msg.value(), headers) or msg.value()
            outputs.append(Output(cfg.request_topic, value, msg.key(), -1, kept, msg, "request"))
            counts["redriven"] += 1
        return Prepared(outputs, counts)

    def _rejected(self, output: Output, detail: str, counts: dict[str, Any]) -> Output:
        """A request the producer refuses (cannot happen to a dead letter that was a request, short of a
        lowered limit): a new dead letter, after this run's end, instead of a batch aborted forever."""
        counts["redriven"] -= 1
        src = output.source
        counts["not_redriven"].append(f"{src.topic()}:{src.partition()}:{src.offset()} (refused by the producer: "
                                      f"{detail})")
        tags = [(k, v) for k, v in safe_headers(src) or () if k in ("sie.model", "sie.version")]
        return dead_letter(self.config.dead_letter_topic, src, "too_large", detail, tags,
                           max_bytes=self.config.settings.max_record_bytes)
