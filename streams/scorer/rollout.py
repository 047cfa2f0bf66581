"""Version weights during a rollout, applied key-sticky at a transaction boundary.

WHY here and like this: the rollout's traffic split has to keep exactly-once and per-key stickiness, so it
is not a router in front of Kafka but a choice made inside the scorer's own batch: every replica of the
model runs both versions in-process and routes each request by ``RoutingTable.route`` (crc32 of the key,
else of the id, into 10,000 buckets).  The weights come from the rollout record on the compacted rollouts
topic (written by the leading control plane, ``sie.streams.control.rollout_driver``) as one value
``(epoch, canary weight)``; a scorer picks up the newest value only at the start of a batch (``prepare``
runs before the batch's transaction opens), so one transaction is scored under one epoch, and it stamps
that epoch on every record the batch produces (header ``sie.routing.epoch``).

Stickiness is monotone because the table's order is fixed, stable version first: a request goes to the
stable version iff its bucket < stable weight.  As the canary weight rises the boundary only moves down,
so a key only ever moves stable -> canary; a rollback puts the canary weight to 0, and every key is back
on stable (``tests/streams/scorer/test_rollout_routing.py`` checks this as a property).

The input validator and output check stay the scorer's own (the stable spec's): the control plane
refuses a new version whose schemas break the old one's before any rollout starts.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from sie.schemas.spec_parse import InvalidSpec
from sie.streams.eos.records import Prepared
from sie.streams.scorer.loop import Scorer
from sie.streams.scorer.routing import BUCKETS, RouteEntry, RoutingTable

log = logging.getLogger("sie.scorer.rollout")

EPOCH_HEADER = "sie.routing.epoch"
#: rollout phases after which the canary version is no longer served in-process
_ROLLED_BACK = frozenset({"RolledBack", "Failed"})
_TERMINAL = frozenset({"Complete", *_ROLLED_BACK})


@dataclass(frozen=True)
class WeightSet:
    """The part of a rollout record a scorer acts on."""

    model: str
    epoch: int
    phase: str
    stable_version: str
    canary_version: str
    canary_bp: int
    stable_spec: dict[str, Any]
    canary_spec: dict[str, Any]

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> WeightSet:
        """From the decoded Avro ``Rollout`` record."""
        weight = int(record["weight_bp"])
        if not 0 <= weight <= BUCKETS:
            raise ValueError(f"rollout {record['model']}: weight_bp must be in [0, {BUCKETS}] (got {weight})")
        return cls(str(record["model"]), int(record["epoch"]), str(record["phase"]), str(record["stable_version"]),
                   str(record["canary_version"]), weight, json.loads(record["stable_spec_json"]),
                   json.loads(record["canary_spec_json"]))

    @property
    def serves_canary(self) -> bool:
        """Whether the canary version must be loaded (not once the rollout ended by rolling back)."""
        return self.phase not in _ROLLED_BACK


def weighted_table(stable: tuple[str, Any], canary: tuple[str, Any], canary_bp: int) -> RoutingTable:
    """Stable first, always: the fixed order is what makes a rising canary weight move keys one way only."""
    if canary_bp <= 0:
        return RoutingTable.single(*stable)
    if canary_bp >= BUCKETS:
        return RoutingTable.single(*canary)
    return RoutingTable((RouteEntry(stable[0], BUCKETS - canary_bp, stable[1]),
                         RouteEntry(canary[0], canary_bp, canary[1])))


class WeightSource(Protocol):
    """Where a scorer gets its model's newest rollout record without blocking (None: no rollout known)."""

    def latest(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


class RolloutScorer(Scorer):
    """A ``Scorer`` that follows its model's rollout: both versions loaded, weights applied per batch.

    ``backend_factory(spec)`` loads a backend for a spec (the same factory ``run_scorer`` takes); the
    scorer's own backend (``routing``'s single entry) serves its own version.  A version's backend that
    cannot be loaded raises out of ``prepare`` before anything is produced, so the layer retries the batch
    later (an outage, never dead letters); the leader's surge timeout and gates decide the rollout.
    """

    def __init__(self, config: Any, routing: RoutingTable, *, weights: WeightSource,
                 backend_factory: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(config, routing, **kwargs)
        self._weights = weights
        self._factory = backend_factory
        self._backends: dict[str, Any] = {e.version: e.backend for e in routing.entries}
        self._applied: tuple[int, str, str, str, int] | None = None
        self._refused: Any = None
        self.epoch = 0

    def prepare(self, batch: list) -> Prepared[dict[str, Any]]:
        self.apply_latest()  # the batch boundary: nothing of this batch is produced yet
        prepared = super().prepare(batch)
        if self._applied is not None:
            stamp = (EPOCH_HEADER, str(self.epoch).encode())
            for out in prepared.outputs:
                out.headers = [*(out.headers or ()), stamp]
        return prepared

    def apply_latest(self) -> None:
        """Swap in the newest weight set (if it changed): load what it needs first, then one table swap."""
        record = self._weights.latest()
        if record is None or record.get("model") != self.config.spec.name:
            return
        try:
            ws = WeightSet.from_record(record)
        except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            self._refuse(("unreadable", str(record.get("epoch"))), f"unreadable rollout record: {exc}")
            return
        own = self.config.spec.version
        if ws.phase in _TERMINAL and own not in (ws.stable_version, ws.canary_version):
            # a finished rollout between two other versions (this replica runs a version applied since): its
            # own version answers everything, and nothing of the old record is stamped on its answers
            if self._applied is not None:
                self._backends = {own: self._backends[own]}
                self.set_routing(RoutingTable.single(own, self._backends[own]))
                self._applied, self.epoch = None, 0
            return
        key = (ws.epoch, ws.phase, ws.stable_version, ws.canary_version, ws.canary_bp)
        if key == self._applied:
            return
        # load before the swap: the canary as soon as the rollout exists (Surging preloads it at weight 0),
        # the stable version while it still has a share or the rollout ended by rolling back
        stable = canary = None
        try:
            if ws.serves_canary:
                canary = (ws.canary_version, self._backend(ws.canary_version, ws.canary_spec))
            if not ws.serves_canary or ws.canary_bp < BUCKETS:
                stable = (ws.stable_version, self._backend(ws.stable_version, ws.stable_spec))
        except (InvalidSpec, ValidationError) as exc:  # permanent: the record's spec breaks this node's policy
            self._refuse(key, f"rollout {ws.stable_version} -> {ws.canary_version} (epoch {ws.epoch}) refused: {exc}")
            return
        if canary is None:
            assert stable is not None
            table = RoutingTable.single(*stable)
            dropped = self._backends.pop(ws.canary_version, None)
            if dropped is not None and hasattr(dropped, "close"):
                dropped.close()
        elif stable is None:
            table = RoutingTable.single(*canary)
        else:
            table = weighted_table(stable, canary, ws.canary_bp)
        self.set_routing(table)
        log.info("model %s: rollout %s -> %s at %.2f%% (epoch %d, %s)", ws.model, ws.stable_version,
                 ws.canary_version, ws.canary_bp / 100, ws.epoch, ws.phase)
        self._applied, self.epoch = key, ws.epoch

    def _refuse(self, key: Any, reason: str) -> None:
        """A rollout record this replica will not follow (its spec refused by the node's policy, or unreadable):
        it keeps serving what it serves, and says why once per record (never a retry loop on a record that can
        only be refused again; the leader's surge timeout and gates end such a rollout)."""
        if key != self._refused:
            self._refused = key
            log.error("model %s: %s; keeps serving %s", self.config.spec.name, " ".join(reason.split())[:2000],
                      ", ".join(sorted(self._backends)))

    def _backend(self, version: str, spec_doc: dict[str, Any]) -> Any:
        backend = self._backends.get(version)
        if backend is None:
            from sie.schemas.spec import ModelService

            backend = self._backends[version] = self._factory(ModelService.from_document(spec_doc))
        return backend


class KafkaWeightSource:
    """The rollouts topic, read_committed, from the beginning: the newest record of one model (or of every
    model, ``model=None``: a multi-model process shares one reader among its models through ``view``).

    No thread: ``latest()`` drains what has arrived (non-blocking) each time a scorer starts a batch; a
    lock makes the drain safe from several scorer threads (the consumer itself is not thread-safe).
    """

    def __init__(self, settings: Any, model: str | None, consumer_factory: Callable[[dict], Any] | None = None,
                 reader: str | None = None) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from sie.schemas.avro_codec import Codec

        names = settings.names
        self._topic = names.system_topic("rollouts")
        config = settings.kafka_client_config(**{
            "group.id": names.reader_group("rollout-weights", reader or model or "all"), "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        self._consumer = (consumer_factory or Consumer)(config)
        md = self._consumer.list_topics(self._topic, timeout=10)
        parts = sorted(md.topics[self._topic].partitions) if self._topic in md.topics else [0]
        self._consumer.assign([TopicPartition(self._topic, p, -2) for p in parts])
        self._model = model
        self._codec = Codec()
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}

    def latest(self) -> dict[str, Any] | None:
        if self._model is None:
            raise ValueError("KafkaWeightSource(model=None) serves several models: use view(model).latest()")
        return self.latest_for(self._model)

    def latest_for(self, model: str) -> dict[str, Any] | None:
        with self._lock:
            self._drain()
            return self._records.get(model)

    def view(self, model: str) -> _ModelView:
        """One model's ``WeightSource`` over this shared reader (closing the view leaves the reader open)."""
        return _ModelView(self, model)

    def _drain(self) -> None:
        while True:
            msgs = self._consumer.consume(500, 0)
            for m in msgs:
                if m.error() or m.key() is None:
                    continue
                try:
                    model = m.key().decode()
                except UnicodeDecodeError:
                    continue
                if self._model is not None and model != self._model:
                    continue
                if m.value() is None:  # tombstone: the model's rollout record was deleted
                    self._records.pop(model, None)
                    continue
                try:
                    self._records[model] = self._codec.decode(m.value(), expected="Rollout")
                except Exception as exc:  # a record we cannot read must not stop scoring
                    log.error("rollouts topic: unreadable record for %s skipped (%s)", model, exc)
            if len(msgs) < 500:
                return

    def close(self) -> None:
        with self._lock:
            self._consumer.close()


class _ModelView:
    """One model's ``WeightSource`` on a shared ``KafkaWeightSource``."""

    def __init__(self, source: KafkaWeightSource, model: str) -> None:
        self._source, self._model = source, model

    def latest(self) -> dict[str, Any] | None:
        return self._source.latest_for(self._model)

    def close(self) -> None:
        """The shared reader stays open: its owner (the process) closes it."""


def run_rollout_scorer(config: Any, backend_factory: Callable[[Any], Any], stop_event: Any,
                       on_ready: Callable[[RolloutScorer], None] | None = None, weights: WeightSource | None = None,
                       **scorer_kwargs: Any) -> Any:
    """``run_scorer`` that follows the model's rollout (weights from the rollouts topic unless given)."""
    backend = backend_factory(config.spec)
    source = weights or KafkaWeightSource(config.settings, config.spec.name)
    scorer = RolloutScorer(config, RoutingTable.single(config.spec.version, backend), weights=source,
                           backend_factory=backend_factory, **scorer_kwargs)
    try:
        return scorer.run(stop_event, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
    finally:
        source.close()
