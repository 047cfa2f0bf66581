"""The leader's side of rollouts: start them, drive them through the state machine, publish their records.

WHY a driver apart from the state machine (``sie.control.rollout.machine``): the machine decides, the
driver only supplies time, the canary/stable numbers of the current window and the new version's
readiness, and turns each new state into records for one transaction through the leader's fenced
producer: the ``Rollout`` record on the compacted rollouts topic (key = model: the state a new leader
resumes from, and the weights scorers apply) plus one ``ControlEvent`` per transition, and, when the
rollout promotes, the new version's ``ModelSpecRecord`` on the specs topic (from then on it is the
model's spec, and the controller places its replicas).

State lives only on Kafka: ``load`` takes what the rollouts topic holds (``read_rollouts`` reads it,
read_committed, to its end), so a leader that dies mid-rollout is replaced by one that continues from
the last committed step; a step's interval restarts from the stored ``phase_since_ms``, not from zero.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from sie.control.reconcile.ports import OutRecord
from sie.control.rollout.gates import REFERENCE_S
from sie.control.rollout.machine import (
    Answer,
    Event,
    Policy,
    Rollout,
    RolloutError,
    VersionWindow,
    new_rollout,
)

if TYPE_CHECKING:
    from sie.kernel.clients import KafkaClients
    from sie.schemas.spec import ModelService

log = logging.getLogger(__name__)


class RolloutRefused(RolloutError):
    """A rollout that must not start; ``kind`` is machine-readable (``schema_incompatible``, ``in_progress``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Windows(Protocol):
    """Canary and stable numbers of one model over ``[since_ms, now]`` (the same window for both)."""

    def window(self, model: str, version: str, since_ms: int) -> VersionWindow: ...


@dataclass(frozen=True)
class Entry:
    """A rollout with the two spec documents it moves between (scorers load either from here) and the two
    ModelServices they describe: decoded once, when the entry is read or begun (``decoded``), and carried on
    through every step (``replace``); the documents stay as stored, for the records."""

    rollout: Rollout
    stable_spec: Mapping[str, Any]
    canary_spec: Mapping[str, Any]
    #: (stable, canary) as ModelServices; None: decoded from the documents at construction
    decoded: tuple[ModelService, ModelService] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.decoded is None:
            from sie.schemas.spec import ModelService

            object.__setattr__(self, "decoded", (ModelService.from_document(dict(self.stable_spec)),
                                                 ModelService.from_document(dict(self.canary_spec))))

    @property
    def stable(self) -> ModelService:
        assert self.decoded is not None  # set by __post_init__
        return self.decoded[0]

    @property
    def canary(self) -> ModelService:
        assert self.decoded is not None
        return self.decoded[1]

    def to_record(self, now_ms: int) -> dict[str, Any]:
        r = self.rollout
        return {"model": r.model, "stable_version": r.stable_version, "canary_version": r.canary_version,
                "phase": str(r.phase), "step": r.step, "weight_bp": r.weight_bp, "epoch": r.epoch,
                "started_ms": r.started_ms, "phase_since_ms": r.phase_since_ms,
                "paused_from": str(r.paused_from) if r.paused_from else None, "reason": r.reason,
                "policy_json": json.dumps(r.policy.to_document()),
                "events": [{"at_ms": e.at_ms, "from_phase": str(e.source), "to_phase": str(e.target), "step": e.step,
                            "weight_bp": e.weight_bp, "reason": e.reason} for e in r.events],
                "stable_spec_json": json.dumps(dict(self.stable_spec)),
                "canary_spec_json": json.dumps(dict(self.canary_spec)), "updated_at_ms": now_ms}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Entry:
        doc = {**rec, "policy": json.loads(rec["policy_json"]),
               "events": [{"at_ms": e["at_ms"], "from": e["from_phase"], "to": e["to_phase"], "step": e["step"],
                           "weight_bp": e["weight_bp"], "reason": e["reason"]} for e in rec["events"]]}
        return cls(Rollout.from_document(doc), json.loads(rec["stable_spec_json"]), json.loads(rec["canary_spec_json"]))


def policy_for(spec_doc: Mapping[str, Any]) -> Policy:
    """The new version's ``rollout`` block (defaults where absent); the absolute p99 gate defaults to the
    spec's ``sla.p99_latency_ms``."""
    sla = spec_doc.get("sla") or {}
    return Policy.from_document(spec_doc.get("rollout"), sla_p99_ms=sla.get("p99_latency_ms"))


class RolloutDriver:
    """Every model's rollout as the leader sees it; ``tick`` advances them, each method returns the records
    to publish (the caller publishes them in one transaction and only then calls ``commit``)."""

    def __init__(self, windows: Windows, ready: Callable[[Rollout], str | None] = lambda r: "scorers load it in-process",
                 clock: Callable[[], float] = time.time, capacity: Callable[[str], Any] | None = None) -> None:
        self._windows = windows
        self._ready = ready
        self._clock = clock
        #: model -> the controller's replica plan this pass (``rollout_capacity.CapacityPlan``; None: not planned
        #: yet).  Without it (a driver alone, as in tests), ``ready`` decides Surging and Draining ends at once.
        self.capacity = capacity
        self.entries: dict[str, Entry] = {}

    # --- state from Kafka ------------------------------------------------------------------------
    def load(self, records: Iterable[Mapping[str, Any]]) -> None:
        """What the rollouts topic holds (decoded Rollout records, oldest first): a new leader resumes here."""
        self.entries = {}
        for rec in records:
            entry = Entry.from_record(rec)
            self.entries[entry.rollout.model] = entry

    def get(self, model: str) -> Entry | None:
        return self.entries.get(model)

    # --- the leader's ---------------------------------------------------------------------------
    def begin(self, stable_spec: Any, canary_spec: Any) -> tuple[Entry, list[OutRecord]]:
        """A new version of a running model: refused (``schema_incompatible``) if its schemas break the
        running version's, or (``in_progress``) while another rollout of the model is not finished."""
        from sie.schemas.compat import check_spec_compatibility

        breaks = check_spec_compatibility(stable_spec, canary_spec)
        if breaks:
            raise RolloutRefused("schema_incompatible",
                                 f"{canary_spec.name} {canary_spec.version}: schema_incompatible with "
                                 f"{stable_spec.version}: " + "; ".join(str(b) for b in breaks))
        current = self.entries.get(stable_spec.name)
        if current is not None and not current.rollout.terminal:
            raise RolloutRefused("in_progress", f"{stable_spec.name}: rollout {current.rollout.stable_version} -> "
                                                f"{current.rollout.canary_version} is {current.rollout.label}; "
                                                f"promote or abort it first (sie rollout abort {stable_spec.name})")
        now = self._now()
        stable_doc, canary_doc = stable_spec.to_document(), canary_spec.to_document()
        rollout = new_rollout(stable_spec.name, stable_spec.version, canary_spec.version, policy_for(canary_doc), now)
        entry = Entry(rollout, stable_doc, canary_doc, (stable_spec, canary_spec))
        return entry, self._records(entry, None, now)

    def tick(self) -> list[tuple[Entry, list[OutRecord]]]:
        """Advance every unfinished rollout one tick; (new entry, records) for each that changed."""
        now = self._now()
        changed = []
        for entry in list(self.entries.values()):
            new = self._advance(entry.rollout, now)
            if new is not entry.rollout:
                updated = replace(entry, rollout=new)
                changed.append((updated, self._records(updated, entry.rollout, now)))
        return changed

    def act(self, model: str, action: str, who: str) -> tuple[Entry, list[OutRecord]]:
        """An operator's ``pause|resume|promote|abort`` (RolloutError names what the phase allows)."""
        entry = self.entries.get(model)
        if entry is None:
            raise RolloutError(f"{model}: no rollout (sie get rollouts lists them)")
        if action not in ("pause", "resume", "promote", "abort"):
            raise RolloutError(f"rollout action: must be pause, resume, promote or abort (got {action!r})")
        now = self._now()
        new = getattr(entry.rollout, action)(now, who=who)
        updated = replace(entry, rollout=new)
        return updated, self._records(updated, entry.rollout, now)

    def run_once(self, publisher: Any) -> int:
        """One leader tick: each changed rollout's records in one transaction (``publisher.publish``), and
        only after it committed does the driver's view move on (a failed publish is tried again next tick)."""
        changed = 0
        for entry, records in self.tick():
            publisher.publish(records)
            self.commit(entry)
            changed += 1
        return changed

    def commit(self, entry: Entry) -> None:
        """After its records were published: the driver's view moves on only with what Kafka holds."""
        self.entries[entry.rollout.model] = entry

    # --- helpers -------------------------------------------------------------------------------
    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _advance(self, r: Rollout, now: int) -> Rollout:
        from sie.control.rollout.machine import Phase

        if r.phase is Phase.PENDING:
            return r.start(now)
        if r.phase is Phase.SURGING:
            if self.capacity is None:
                ready = self._ready(r)
                return r.surge_ready(now, f"new version ready ({ready})") if ready else r.tick(now)
            plan = self.capacity(r.model)
            if plan is None:
                return r.tick(now, waiting="the controller has not planned the replicas yet")
            if plan.mode == "unmanaged":
                return r.surge_ready(now, f"new version ready ({plan.reason})")
            if plan.companion_failed:
                return r.surge_failed(now, plan.companion_failed)
            if plan.serving_both:
                return r.surge_ready(now, f"{plan.new_ready} {r.canary_version} replica(s) READY after their "
                                          f"readiness inference, and every replica serves both versions "
                                          f"({plan.mode}: {plan.reason})")
            waiting = plan.waiting if plan.new_ready < 1 else f"both versions on every replica: {plan.companions_waiting}"
            return r.tick(now, waiting=waiting)
        if r.phase is Phase.CANARY:
            since = r.phase_since_ms
            plan = self.capacity(r.model) if self.capacity is not None else None
            stable = self._windows.window(r.model, r.stable_version, since)
            # the stable's p99 from at least the last REFERENCE_S (gates.py: a step alone is too short for a p99)
            reference = self._windows.window(r.model, r.stable_version, min(since, now - int(REFERENCE_S * 1000)))
            unserved = ""
            if plan is not None and plan.mode != "unmanaged" and plan.serving_both_replicas == 0:
                unserved = f"no READY replica serves both versions ({plan.companions_waiting or plan.waiting})"
            return r.tick(now, self._windows.window(r.model, r.canary_version, since),
                          replace(stable, reference=reference.answers),
                          failure=plan.companion_failed if plan is not None else "", unserved=unserved)
        if r.phase is Phase.PROMOTING:
            return r.promoted(now)  # this tick's records carry the new version's spec onto the specs topic
        if r.phase is Phase.DRAINING:
            # in-process scorers serve the new version alone from weight 100 %; the controller replaces the
            # replicas with new-version ones one at a time (``rollout_capacity``; their in-flight batches commit
            # before they stop), and the rollout completes once every replica runs it READY
            if self.capacity is None:
                return r.drained(now)
            plan = self.capacity(r.model)
            return r.drained(now, plan.reason) if plan is not None and plan.drained else r
        if r.phase is Phase.ROLLING_BACK:
            return r.rolled_back(now)
        return r

    def _records(self, entry: Entry, before: Rollout | None, now: int) -> list[OutRecord]:
        r = entry.rollout
        records = [OutRecord("rollouts", r.model, "Rollout", entry.to_record(now))]
        new_events: Sequence[Event] = r.events[len(before.events):] if before is not None else r.events
        for e in new_events:
            records.append(OutRecord("events", r.model, "ControlEvent", {
                "ts_ms": e.at_ms, "kind": "rollout", "model": r.model, "replica_id": None, "node": None,
                "detail": f"{r.stable_version} -> {r.canary_version}: {e.source} -> {e.target} "
                          f"(canary {e.weight_bp / 100:g}%): {e.reason}"}))
            if str(e.target) == "Draining":
                records.append(OutRecord("specs", r.model, "ModelSpecRecord", {
                    "name": r.model, "version": r.canary_version, "spec_json": json.dumps(dict(entry.canary_spec)),
                    "applied_at_ms": now, "deleted": False}))
        return records


def read_rollouts(settings: Any, timeout_s: float = 15.0, clients: KafkaClients | None = None) -> list[dict[str, Any]]:
    """The rollouts topic, read_committed, to its end (latest record per model): what a new leader resumes."""
    import uuid

    from sie.kernel.clients import KafkaClients, state_reader_config
    from sie.kernel.replay import read_to_end
    from sie.schemas.avro_codec import Codec

    names = settings.names
    topic = names.system_topic("rollouts")
    consumer = (clients or KafkaClients()).consumer(state_reader_config(
        settings, names.reader_group("rollouts", uuid.uuid4().hex[:8]), names.reader_client_id("rollouts")))
    codec = Codec()
    latest: dict[bytes, dict[str, Any] | None] = {}

    def see(m: Any) -> None:
        latest[m.key() or b""] = None if m.value() is None else codec.decode(m.value(), expected="Rollout")

    try:
        read_to_end(consumer, topic, see, timeout_s=timeout_s, missing_ok=True)
    finally:
        consumer.close()
    return [rec for rec in latest.values() if rec is not None]


#: dead-letter reasons that are the version's fault (a malformed request is nobody's canary problem)
_VERSION_FAULTS = frozenset({b"inference_error", b"output_violation", b"result_too_large"})


class KafkaVersionWindows:
    """Canary and stable numbers read from what the scorers committed: the model's results (status, version,
    queue + inference ms, rows in the model call) and dead letters (``sie.version``, ``sie.reason``),
    read_committed.  A window carries every ok answer's (queue + inference, inference, call rows): the gates'
    sequential tests count observations, so a summary such as one p99 is not enough (``gates``).

    WHY from the output topics rather than metrics: they are exactly what was answered, by which version,
    and when (the record timestamp), the same for every replica; no scrape interval or lost heartbeat can
    make the gates judge a window they did not see.  ``window`` drains what has arrived (non-blocking).
    Memory: 5 numbers per answer for ``keep_s`` (at 300 answers/s and the default 600 s, ~180,000 rows).
    """

    def __init__(self, settings: Any, spec: Any, keep_s: float = 600.0,
                 consumer_factory: Callable[[dict], Any] | None = None) -> None:
        import uuid

        from confluent_kafka import TopicPartition

        from sie.kernel.clients import KafkaClients, state_reader_config

        self._model = spec.name
        self._results, self._dlq = spec.topics.results, spec.topics.dead_letters
        names = settings.names
        self._consumer = (consumer_factory or KafkaClients().consumer)(state_reader_config(
            settings, names.reader_group("rollout-gates", uuid.uuid4().hex[:8]), names.reader_client_id("rollout-gates"),
            partition_eof=False))
        assign = []
        for topic in (self._results, self._dlq):
            md = self._consumer.list_topics(topic, timeout=10)
            assign += [TopicPartition(topic, p, -2) for p in sorted(md.topics[topic].partitions)]
        self._consumer.assign(assign)
        self._keep_ms = int(keep_s * 1000)
        #: version -> [(ts_ms, kind, queue + inference ms, inference ms, rows in the call)]; kind: ok | expired |
        #: error (the timings only for ok)
        self._seen: dict[str, list[tuple[int, str, float, float, int]]] = {}

    def _drain(self) -> None:
        import orjson

        from sie.streams.eos.records import safe_headers

        while True:
            msgs = self._consumer.consume(1000, 0)
            for m in msgs:
                value = m.value()
                if m.error() or value is None:
                    continue
                ts = m.timestamp()[1]
                if m.topic() == self._results:
                    try:
                        doc = orjson.loads(value)
                        timings = doc.get("timings") or {}
                        inference = float(timings.get("inference_ms", 0.0))
                        latency = float(timings.get("queue_ms", 0.0)) + inference
                        rows = max(1, int(timings.get("batch_size") or 1))
                        version, status = str(doc["version"]), doc.get("status")
                    except Exception:  # a result we cannot read does not count for either version
                        continue
                    if status == "ok":
                        self._seen.setdefault(version, []).append((ts, "ok", latency, inference, rows))
                    else:
                        self._seen.setdefault(version, []).append((ts, "expired", 0.0, 0.0, 0))
                else:
                    headers = dict(safe_headers(m) or [])
                    version_b, reason = headers.get("sie.version"), headers.get("sie.reason")
                    if version_b is None:
                        continue
                    kind = "error" if reason in _VERSION_FAULTS else "expired" if reason == b"expired" else ""
                    if kind:
                        self._seen.setdefault(version_b.decode(errors="replace"), []).append((ts, kind, 0.0, 0.0, 0))
            if len(msgs) < 1000:
                return

    def window(self, model: str, version: str, since_ms: int) -> VersionWindow:
        if model != self._model:
            return VersionWindow()
        self._drain()
        rows = self._seen.get(version, [])
        if rows and rows[0][0] < since_ms - self._keep_ms:  # bounded memory: forget what no window needs
            rows[:] = [r for r in rows if r[0] >= since_ms - self._keep_ms]
        inside = [r for r in rows if r[0] >= since_ms]
        return VersionWindow.of([Answer(r[2], r[3], r[4]) for r in inside if r[1] == "ok"],
                                errors=sum(1 for r in inside if r[1] == "error"),
                                expired=sum(1 for r in inside if r[1] == "expired"))

    def close(self) -> None:
        self._consumer.close()
