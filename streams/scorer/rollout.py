"""Version weights during a rollout, applied key-sticky at a transaction boundary.

WHY here and like this: the rollout's traffic split has to keep exactly-once and per-key stickiness, so it
is not a router in front of Kafka but a choice made inside the scorer's own batch: every replica of the
model runs both versions in-process and routes each request by ``RoutingTable.route`` (crc32 of the key,
else of the id, into 10,000 buckets).  The weights come from the rollout record on the compacted rollouts
topic (written by the leading control plane, ``sie.streams.control.rollout.driver``) as one value
``(epoch, canary weight)``; a scorer picks up the newest value only at the start of a batch (``prepare``
runs before the batch's transaction opens), so one transaction is scored under one epoch, and it stamps
that epoch on every record the batch produces (header ``sie.routing.epoch``).

Stickiness is monotone because the table's order is fixed, stable version first: a request goes to the
stable version iff its bucket < stable weight.  As the canary weight rises the boundary only moves down,
so a key only ever moves stable -> canary; a rollback puts the canary weight to 0, and every key is back
on stable (``tests/streams/scorer/test_rollout_routing.py`` checks this as a property).

The input validator and output check stay the scorer's own (the stable spec's): the control plane
refuses a new version whose schemas break the old one's before any rollout starts.

Where the other version runs (``VersionProvider``): not in this interpreter.  A worker serves its own version
in-process and the other one from a process of its own (``sie.workers.versions``), so two versions never
share imported code (a python model's package imported twice would otherwise be one module: results labelled
with the wrong version), and a version that cannot load, crashes or hangs is contained: its share is answered
by the replica's own version, each such answer saying so (``sie.routing.fallback``), until it is ready again.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sie.streams.eos.records import Prepared
from sie.streams.scorer.errors import VersionLost
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


class VersionProvider(Protocol):
    """The versions a replica serves next to its own during a rollout (its *companions*).

    ``backend`` never blocks: it returns the version's backend when it is loaded and proven now, else None and
    (first time asked) starts preparing it; the scorer asks at every batch boundary.  In a worker this is
    ``sie.workers.versions.ProcessVersions``: each companion in a process of its own (prepared as a dedicated
    replica of that version would be: artifacts fetched and verified by the agent, policy checked, loaded and
    proven by a real inference), so two versions never share imported code and a failing one cannot take the
    replica down.  ``InProcessVersions`` (below) loads them in this process: for embedding and tests."""

    def backend(self, version: str, spec_doc: dict[str, Any]) -> Any | None: ...

    def lost(self, version: str, detail: str) -> None:
        """``version``'s backend failed mid-call (``VersionLost``): it is not used again until it is ready anew."""

    def retain(self, versions: set[str]) -> None:
        """Stop and forget every companion not in ``versions``."""

    def report(self) -> dict[str, dict[str, Any]]:
        """version -> ``{"state": waiting|loading|ready|failed, "detail": ...}`` (what the agent forwards)."""
        ...

    def close(self) -> None: ...


class InProcessVersions:
    """Companion versions loaded in the scorer's own process by ``factory(spec)`` (synchronously, on first ask).

    No isolation: two versions of a python model import the same package names into one interpreter.  For
    embedding the scorer and for tests of the routing itself; workers use ``sie.workers.versions``."""

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        self._factory = factory
        self._backends: dict[str, Any] = {}
        self._failed: dict[str, str] = {}

    def backend(self, version: str, spec_doc: dict[str, Any]) -> Any | None:
        backend = self._backends.get(version)
        if backend is None and version not in self._failed:
            from sie.schemas.spec import ModelService

            try:
                backend = self._backends[version] = self._factory(ModelService.from_document(spec_doc))
            except Exception as exc:  # a version that cannot load never takes the scorer down
                self._failed[version] = f"{type(exc).__name__}: {exc}"
                log.error("version %s cannot be loaded: %s", version, self._failed[version])
        return backend

    def lost(self, version: str, detail: str) -> None:
        self._failed[version] = detail
        self._close(self._backends.pop(version, None))

    def retain(self, versions: set[str]) -> None:
        for version in [v for v in self._backends if v not in versions]:
            self._close(self._backends.pop(version))
        self._failed = {v: d for v, d in self._failed.items() if v in versions}

    def report(self) -> dict[str, dict[str, Any]]:
        return {**{v: {"state": "ready", "detail": ""} for v in self._backends},
                **{v: {"state": "failed", "detail": d} for v, d in self._failed.items()}}

    def close(self) -> None:
        self.retain(set())

    @staticmethod
    def _close(backend: Any) -> None:
        if backend is not None and hasattr(backend, "close"):
            backend.close()


class RolloutScorer(Scorer):
    """A ``Scorer`` that follows its model's rollout: both versions served, weights applied per batch.

    Its own version (the replica's, loaded and proven before it was READY) answers in-process; the other
    version comes from ``versions`` (a ``VersionProvider``).  At each batch boundary (``apply_latest``, before
    the batch's transaction opens) the scorer builds the table the newest weight set names; a share whose
    version cannot answer here now (still loading, failed, lost) is answered by the replica's own version,
    labelled with the version that answered and the ``sie.routing.fallback`` header: a canary that cannot load,
    crashes or hangs never stops the stable version, and the gates never count its absence as its answers.
    The control plane learns each version's state from ``versions.report()`` (worker -> agent -> heartbeat)
    and judges the rollout by it.
    """

    def __init__(self, config: Any, routing: RoutingTable, *, weights: WeightSource,
                 versions: VersionProvider, **kwargs: Any) -> None:
        super().__init__(config, routing, **kwargs)
        self._weights = weights
        self.versions = versions
        own = config.spec.version
        self._own = RouteEntry(own, BUCKETS, routing.entries[0].backend)
        self._applied: tuple[Any, ...] | None = None
        self._ws: WeightSet | None = None
        self._unreadable: dict[str, Any] | None = None
        self.epoch = 0

    def prepare(self, batch: list) -> Prepared[dict[str, Any]]:
        self.apply_latest()  # the batch boundary: nothing of this batch is produced yet
        prepared = super().prepare(batch)
        if self._ws is not None:
            stamp = (EPOCH_HEADER, str(self.epoch).encode())
            for out in prepared.outputs:
                out.headers = [*(out.headers or ()), stamp]
        return prepared

    def tick(self, consumer: Any) -> None:
        """Between batches, also when no request arrives: a companion the rollout asks for is loaded (and a
        ready one routed to) without waiting for traffic."""
        super().tick(consumer)
        self.apply_latest()

    def apply_latest(self) -> None:
        """Swap in the table the newest weight set names, with what can answer here now (one swap)."""
        record = self._weights.latest()
        if record is None or record.get("model") != self.config.spec.name:
            return
        try:
            ws = WeightSet.from_record(record)
        except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            # a record no replica can follow (whoever may write the rollouts topic wrote it): refused once, with
            # the reason; the replica keeps its table instead of failing every batch on the same record
            if self._unreadable != record:
                self._unreadable = record
                log.error("model %s: unreadable rollout record refused (%s: %s); keeps serving as before",
                          self.config.spec.name, type(exc).__name__, " ".join(str(exc).split())[:300])
            return
        own = self._own.version
        if ws.phase in _TERMINAL and own not in (ws.stable_version, ws.canary_version):
            # a finished rollout between two other versions (this replica runs a version applied since): its
            # own version answers everything, and nothing of the old record is stamped on its answers
            if self._ws is not None:
                self.versions.retain(set())
                self.set_routing(RoutingTable.single(own, self._own.backend))
                self._applied, self._ws, self.epoch = None, None, 0
            return
        stable_share = BUCKETS if not ws.serves_canary else BUCKETS - ws.canary_bp
        wanted = {ws.stable_version: (stable_share, ws.stable_spec)}
        if ws.serves_canary:
            wanted[ws.canary_version] = (ws.canary_bp, ws.canary_spec)
        # companions are asked for as soon as the rollout exists (Surging preloads the canary at weight 0), and
        # released once no share of traffic can reach them again (rolled back; a finished rollout's old version)
        companions = {v for v in wanted if v != own and (ws.phase not in _TERMINAL or wanted[v][0] > 0)}
        self.versions.retain(companions)
        backends = {v: self._own.backend if v == own else self.versions.backend(v, spec)
                    for v, (_share, spec) in wanted.items() if v == own or v in companions}
        key = (ws.epoch, ws.phase, ws.stable_version, ws.canary_version, ws.canary_bp,
               tuple(sorted((v, b is not None) for v, b in backends.items())))
        if key == self._applied:
            return
        self.set_routing(self._table(ws, wanted, backends))
        log.info("model %s: rollout %s -> %s at %.2f%% (epoch %d, %s)%s", ws.model, ws.stable_version,
                 ws.canary_version, ws.canary_bp / 100, ws.epoch, ws.phase,
                 "".join(f"; {e.fallback}" for e in self.routing.entries if e.fallback))
        self._applied, self._ws, self.epoch = key, ws, ws.epoch

    def _table(self, ws: WeightSet, wanted: dict[str, tuple[int, Any]], backends: dict[str, Any]) -> RoutingTable:
        """Stable first, always (monotone stickiness); a share whose version has no backend here goes to this
        replica's own version, marked as a fallback."""
        entries = []
        for version in (ws.stable_version, ws.canary_version):
            share = wanted.get(version, (0, None))[0]
            if share <= 0:
                continue
            backend = backends.get(version)
            if backend is not None:
                entries.append(RouteEntry(version, share, backend))
            else:
                why = self.versions.report().get(version, {})
                detail = why.get("detail") or why.get("state") or "not loaded here"
                entries.append(RouteEntry(self._own.version, share, self._own.backend,
                                          fallback=f"{version} unavailable on this replica ({detail})"))
        merged: dict[tuple[str, str], RouteEntry] = {}
        for e in entries:  # two shares answered by the same version for the same reason: one entry
            prev = merged.get((e.version, e.fallback))
            merged[(e.version, e.fallback)] = e if prev is None else RouteEntry(e.version, prev.weight + e.weight,
                                                                                e.backend, e.fallback)
        return RoutingTable(tuple(merged.values()))

    def version_lost(self, lost: VersionLost) -> RouteEntry | None:
        """A companion died or hung mid-call: the provider marks it lost, the next tables route its share to the
        own version until it is ready again, and this batch's rows of it are answered by the own version."""
        log.error("model %s: %s; its share is answered by %s", self.config.spec.name, lost, self._own.version)
        self.versions.lost(lost.version, lost.detail)
        self._applied = None  # rebuild the table at the next batch boundary
        if lost.version == self._own.version:
            return None
        return RouteEntry(self._own.version, BUCKETS, self._own.backend,
                          fallback=f"{lost.version} lost on this replica ({lost.detail})")


class KafkaWeightSource:
    """The rollouts topic, read_committed, from the beginning: the newest record of one model (or of every
    model, ``model=None``: a multi-model process shares one reader among its models through ``view``).

    No thread: ``latest()`` drains what has arrived (non-blocking) each time a scorer starts a batch; a
    lock makes the drain safe from several scorer threads (the consumer itself is not thread-safe).
    """

    def __init__(self, settings: Any, model: str | None, consumer_factory: Callable[[dict], Any] | None = None,
                 reader: str | None = None) -> None:
        from confluent_kafka import TopicPartition

        from sie.kernel.clients import KafkaClients, state_reader_config
        from sie.schemas.avro_codec import Codec

        names = settings.names
        self._topic = names.system_topic("rollouts")
        config = state_reader_config(settings, names.reader_group("rollout-weights", reader or model or "all"),
                                     names.reader_client_id("rollout-weights"), partition_eof=False)
        self._consumer = (consumer_factory or KafkaClients().consumer)(config)
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
                key, value = m.key(), m.value()
                if m.error() or key is None:
                    continue
                try:
                    model = key.decode()
                except UnicodeDecodeError:
                    continue
                if self._model is not None and model != self._model:
                    continue
                if value is None:  # tombstone: the model's rollout record was deleted
                    self._records.pop(model, None)
                    continue
                try:
                    self._records[model] = self._codec.decode(value, expected="Rollout")
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
                       versions: VersionProvider | None = None, **scorer_kwargs: Any) -> Any:
    """``run_scorer`` that follows the model's rollout (weights from the rollouts topic unless given).

    ``backend_factory(spec)`` loads the replica's own version; ``versions`` serves the other version of a
    rollout (default: ``InProcessVersions(backend_factory)``, no isolation: workers pass their process-based
    provider)."""
    backend = backend_factory(config.spec)
    source = weights or KafkaWeightSource(config.settings, config.spec.name)
    provider = versions if versions is not None else InProcessVersions(backend_factory)
    scorer = RolloutScorer(config, RoutingTable.single(config.spec.version, backend), weights=source,
                           versions=provider, **scorer_kwargs)
    try:
        return scorer.run(stop_event, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
    finally:
        source.close()
        provider.close()
