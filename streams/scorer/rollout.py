"""Version weights during a rollout, applied key-sticky at a transaction boundary.

WHY here and like this: the rollout's traffic split has to keep exactly-once and per-key stickiness, so it
is not a router in front of Kafka but a choice made inside the scorer's own batch: every replica of the
model runs both versions in-process and routes each request by ``RoutingTable.route`` (crc32 of the key,
else of the id, into 10,000 buckets).  The weights come from the rollout record on the compacted rollouts
topic (written by the leading control plane, ``sie.control.rollout.driver``) as one value
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
with the wrong version), and a version that cannot load, crashes or hangs is contained.

A replica holds partitions only while it can serve every version its table names (``serving``)::

    at start:              read the rollouts topic to its end (``WeightSource.caught_up``), then build the table
    every batch boundary:  table = weights of the newest record; versions with a share > 0 must all have a
                           ready backend here (the own version always has; a companion once loaded and proven)
      all ready            serve the batch under that table (one epoch per transaction)
      one is not           refuse the batch (``VersionsNotReady``, a RetryLater: nothing produced) and leave
                           the consumer group (``sie.streams.eos.stage``: ``serving`` False): the replicas that
                           serve every version take its partitions; join again once all are ready
    a companion lost mid-call: the same (``VersionLost`` -> ``VersionsNotReady``)
    partitions assigned:   read the rollouts topic to its end before scoring any of their records (their
                           previous owner's epoch, or a newer one: never an older, lower weight)

Failures and what happens next:

| what happens                                         | this replica                     | its partitions           |
|------------------------------------------------------|----------------------------------|--------------------------|
| a companion its table names is still loading/waiting | does not join (or leaves)        | the others serve them    |
| a companion is lost mid-call (died, no answer)       | refuses the batch, leaves        | the others; back when ready |
| a companion FAILED (cannot load, lost 3 times)       | stays out while the table names it | the others; the leader rolls back |
| no replica can serve every version                   | all out                          | wait; rollback after a step |
| the rollouts topic cannot be read to its end         | decides after CATCH_UP_LIMIT_S   | as it decides            |

No version ever answers another's share: a surge replica (own version = the canary) whose stable companion is
loading answers nothing at weight 0, and a restarted stable replica whose canary companion is loading never
answers the canary's bucket with the stable version, so a key the canary answered stays on it until a rollback.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sie.kernel.replay import ReadProgress, watermarks
from sie.streams.eos.records import Prepared
from sie.streams.scorer.errors import VersionLost, VersionsNotReady
from sie.streams.scorer.loop import Scorer
from sie.streams.scorer.routing import BUCKETS, RouteEntry, RoutingTable

log = logging.getLogger("sie.scorer.rollout")

EPOCH_HEADER = "sie.routing.epoch"
#: rollout phases after which the canary version is no longer served in-process
_ROLLED_BACK = frozenset({"RolledBack", "Failed"})
_TERMINAL = frozenset({"Complete", *_ROLLED_BACK})
#: how long a starting replica waits to read the rollouts topic to its end before it decides with what it read
CATCH_UP_LIMIT_S = 15.0
#: how long ``refresh`` retries a refused end offset (``sie.kernel.replay.watermarks``)
_ENDS_S = 10.0
#: the end of a partition whose end offset could not be asked: never reached, ``CATCH_UP_LIMIT_S`` decides
_UNKNOWN_END = 2**63 - 1


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
    """Where a scorer gets its model's newest rollout record without blocking (None: no rollout known).  A new
    record is a new dict (never one changed in place): the scorer decodes each record once (``_decode``)."""

    def latest(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...

    # Optional: ``caught_up() -> bool``: whether the source has read what its topic held when it started (a
    # replica decides whether it can serve only on a view that is not known to be stale); absent: True.
    # ``refresh()`` + ``wait_caught_up(limit_s) -> bool``: take the topic's end now and read to it (a replica
    # assigned partitions); absent: nothing is awaited.


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
    the batch's transaction opens) the scorer builds the table the newest weight set names.  When a version with
    a share cannot answer here now (still loading, failed, lost), the replica serves nothing: ``serving`` is
    False, the batch is refused and the stage leaves its group until the version is ready (module docstring).
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
        #: the last record read and its weight set (None: unreadable): a record is decoded once, not every batch
        self._read: tuple[dict[str, Any], WeightSet | None] | None = None
        self._unreadable: dict[str, Any] | None = None
        self.epoch = 0
        #: the weights source has read its topic to the end it had at start (``WeightSource.caught_up``)
        self._caught_up = False
        #: every version the current table names can answer here now; else why not (``serving``)
        self._unready = ""

    @property
    def weights(self) -> WeightSource:
        """Where the rollout's weights come from (the rollouts topic for a worker)."""
        return self._weights

    def serving(self) -> bool:
        """Whether this replica may hold partitions now: it read the rollouts topic to the end, and every
        version its table names is ready here (``sie.streams.eos.stage`` asks between batches)."""
        if not self._caught_up:
            check = getattr(self._weights, "caught_up", None)
            if check is not None and not check():
                return False
            self._caught_up = True
            self._applied = None
        if self._unready or self._applied is None:
            self.apply_latest()  # out of the group, nothing else refreshes it: look again now
        return not self._unready

    @property
    def unready(self) -> str:
        """Why this replica cannot serve now ("" when it can)."""
        return self._unready

    def prepare(self, batch: list) -> Prepared[dict[str, Any]]:
        self.apply_latest()  # the batch boundary: nothing of this batch is produced yet
        if self._unready:
            raise VersionsNotReady(f"model {self.config.spec.name}: {self._unready}; this replica hands its "
                                   f"partitions to the replicas that serve every version")
        prepared = super().prepare(batch)
        if self._ws is not None:
            stamp = (EPOCH_HEADER, str(self.epoch).encode())
            for out in prepared.outputs:
                out.headers = [*(out.headers or ()), stamp]
        return prepared

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Before any record of newly assigned partitions is scored: read the rollouts topic to its end now.
        Their previous owner committed its last batch before they moved, under an epoch it had read; reading
        to the end takes that epoch or a newer one, so a key the canary answered there is never answered
        under an older, lower weight here (weights only rise within a rollout)."""
        super().partitions_assigned(consumer, partitions)
        refresh = getattr(self._weights, "refresh", None)
        wait = getattr(self._weights, "wait_caught_up", None)
        if refresh is None or wait is None:
            return
        refresh()
        if not wait(CATCH_UP_LIMIT_S):
            log.warning("model %s: rollouts topic not read to its end within %.0fs after an assignment",
                        self.config.spec.name, CATCH_UP_LIMIT_S)
        self._applied = None  # rebuilt at the next batch boundary from what was read

    def tick(self, consumer: Any) -> None:
        """Between batches, also when no request arrives: a companion the rollout asks for is loaded (and a
        ready one routed to) without waiting for traffic."""
        super().tick(consumer)
        self.apply_latest()

    def _decode(self, record: dict[str, Any]) -> WeightSet | None:
        """The weight set of a record read, or None for one no replica can follow (whoever may write the rollouts
        topic wrote it): refused once, with the reason; the replica keeps its table instead of failing every
        batch on the same record."""
        try:
            return WeightSet.from_record(record)
        except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            if self._unreadable != record:
                self._unreadable = record
                log.error("model %s: unreadable rollout record refused (%s: %s); keeps serving as before",
                          self.config.spec.name, type(exc).__name__, " ".join(str(exc).split())[:300])
            return None

    def apply_latest(self) -> None:
        """Swap in the table the newest weight set names, if every version it names can answer here now
        (else ``unready`` says which cannot, and the table is left as it was: no batch is served meanwhile)."""
        record = self._weights.latest()
        if record is None or record.get("model") != self.config.spec.name:
            return
        if self._read is None or self._read[0] is not record:
            self._read = (record, self._decode(record))
        ws = self._read[1]
        if ws is None:
            return
        own = self._own.version
        if ws.phase in _TERMINAL and own not in (ws.stable_version, ws.canary_version):
            # a finished rollout between two other versions (this replica runs a version applied since): its
            # own version answers everything, and nothing of the old record is stamped on its answers
            if self._ws is not None:
                self.versions.retain(set())
                self.set_routing(RoutingTable.single(own, self._own.backend))
                self._applied, self._ws, self.epoch = None, None, 0
            self._unready = ""
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
        self._applied = key
        missing = [v for v, (share, _spec) in wanted.items() if share > 0 and backends.get(v) is None]
        if missing:
            report = self.versions.report()
            why = "; ".join(f"{v} not ready here ({report.get(v, {}).get('detail') or report.get(v, {}).get('state') or 'not loaded'})"
                            for v in missing)
            if why != self._unready:
                log.warning("model %s: rollout %s -> %s at %.2f%% (epoch %d, %s): %s; holds no partitions until "
                            "it is", ws.model, ws.stable_version, ws.canary_version, ws.canary_bp / 100, ws.epoch,
                            ws.phase, why)
            self._unready = why
            return
        self._unready = ""
        self.set_routing(weighted_table((ws.stable_version, backends.get(ws.stable_version)),
                                        (ws.canary_version, backends.get(ws.canary_version)),
                                        ws.canary_bp if ws.serves_canary else 0))
        log.info("model %s: rollout %s -> %s at %.2f%% (epoch %d, %s)", ws.model, ws.stable_version,
                 ws.canary_version, ws.canary_bp / 100, ws.epoch, ws.phase)
        self._ws, self.epoch = ws, ws.epoch

    def version_lost(self, lost: VersionLost) -> None:
        """A companion died or hung mid-call: the provider marks it lost; this batch is refused (``Scorer``), and
        the next boundary finds it not ready: the replica leaves its group until it is ready again."""
        log.error("model %s: %s; the batch is refused and the replica hands its partitions over",
                  self.config.spec.name, lost)
        self.versions.lost(lost.version, lost.detail)
        self._applied = None  # rebuild the table at the next batch boundary
        self._unready = f"{lost.version} lost here ({lost.detail})"


class KafkaWeightSource:
    """The rollouts topic, read_committed, from the beginning: the newest record of one model (or of every
    model, ``model=None``: a multi-model process shares one reader among its models through ``view``).

    No thread: ``latest()`` drains what has arrived (non-blocking) each time a scorer starts a batch; a
    lock makes the drain safe from several scorer threads (the consumer itself is not thread-safe).
    """

    def __init__(self, settings: Any, model: str | None, consumer_factory: Callable[[dict], Any] | None = None,
                 reader: str | None = None) -> None:
        from confluent_kafka import TopicPartition

        from sie.kernel.clients import BARRIER_FETCH_WAIT_MS, KafkaClients, state_reader_config
        from sie.schemas.avro_codec import Codec

        names = settings.names
        self._topic = names.system_topic("rollouts")
        config = state_reader_config(settings, names.reader_group("rollout-weights", reader or model or "all"),
                                     names.reader_client_id("rollout-weights"), partition_eof=False,
                                     fetch_wait_ms=BARRIER_FETCH_WAIT_MS)
        self._consumer = (consumer_factory or KafkaClients().consumer)(config)
        md = self._consumer.list_topics(self._topic, timeout=10)
        parts = sorted(md.topics[self._topic].partitions) if self._topic in md.topics else [0]
        self._consumer.assign([TopicPartition(self._topic, p, -2) for p in parts])
        self._parts = parts
        self._lock = threading.Lock()
        #: how far each partition was read against the ends it had when this reader last looked (``refresh``):
        #: ``caught_up`` once every position reached its end (``sie.kernel.replay``'s rule: a trailing commit
        #: marker is passed by the position, never by a record)
        self._progress = ReadProgress({})
        self._started = 0.0
        self.refresh()
        self._model = model
        self._codec = Codec()
        self._records: dict[str, dict[str, Any]] = {}

    def latest(self) -> dict[str, Any] | None:
        if self._model is None:
            raise ValueError("KafkaWeightSource(model=None) serves several models: use view(model).latest()")
        return self.latest_for(self._model)

    def latest_for(self, model: str) -> dict[str, Any] | None:
        with self._lock:
            self._drain()
            return self._records.get(model)

    def refresh(self) -> None:
        """Take the topic's end offsets now: ``caught_up`` is False until they are read (at start, and when
        the scorer is assigned partitions: their previous owner may have answered under a newer epoch)."""
        keys = [(self._topic, p) for p in self._parts]
        with self._lock:  # one consumer, shared by the lanes of a multi-model process: one call at a time
            started = time.monotonic()  # CATCH_UP_LIMIT_S counts the asking too
            try:
                # transient refusals retried (sie.kernel.replay.watermarks); read from each low watermark on
                progress = ReadProgress.from_beginning(watermarks(self._consumer, keys, timeout_s=_ENDS_S))
            except Exception as exc:  # noqa: BLE001 - unknown ends: the deadline in caught_up decides
                log.warning("rollouts topic: end offsets unknown (%s); reading until the %.0fs catch-up limit",
                            exc, CATCH_UP_LIMIT_S)
                progress = ReadProgress({key: _UNKNOWN_END for key in keys})
            self._progress, self._started = progress, started

    def wait_caught_up(self, limit_s: float) -> bool:
        """``caught_up``, waiting up to ``limit_s`` for the records to arrive."""
        deadline = time.monotonic() + limit_s
        while not self.caught_up():
            if time.monotonic() >= deadline:
                return False
            with self._lock:
                self._drain(wait_s=0.05)
        return True

    def caught_up(self) -> bool:
        """Whether what the topic held at start has been read (a transaction still open then is read once it
        commits).  A reader that cannot get there within ``CATCH_UP_LIMIT_S`` says so and goes on with what
        it has (a scorer that never served would be worse: the rollout record it misses is its model's own)."""
        with self._lock:
            if self._progress.done:
                return True
            self._drain()
            try:
                self._progress.check_positions(self._consumer)
            except Exception:  # noqa: BLE001 - unknown: not yet
                pass
            if not self._progress.done and time.monotonic() - self._started > CATCH_UP_LIMIT_S:
                log.warning("rollouts topic: not read to its end within %.0fs (partitions %s): going on with what "
                            "was read", CATCH_UP_LIMIT_S, sorted(p for _t, p in self._progress.short()))
                self._progress = ReadProgress({})
            return self._progress.done

    def view(self, model: str) -> _ModelView:
        """One model's ``WeightSource`` over this shared reader (closing the view leaves the reader open)."""
        return _ModelView(self, model)

    def _drain(self, wait_s: float = 0.0) -> None:
        while True:
            msgs = self._consumer.consume(500, wait_s)
            wait_s = 0.0
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

    def caught_up(self) -> bool:
        return self._source.caught_up()

    def refresh(self) -> None:
        self._source.refresh()

    def wait_caught_up(self, limit_s: float) -> bool:
        return self._source.wait_caught_up(limit_s)

    def close(self) -> None:
        """The shared reader stays open: its owner (the process) closes it."""


def build_rollout_scorer(config: Any, backend_factory: Callable[[Any], Any], weights: WeightSource | None = None,
                         versions: VersionProvider | None = None, **scorer_kwargs: Any) -> RolloutScorer:
    """A ``RolloutScorer`` ready to run: its own version loaded by ``backend_factory(spec)``, weights from the
    rollouts topic unless given (read from now on), ``versions`` serving a rollout's other version (default:
    ``InProcessVersions(backend_factory)``, no isolation: workers pass their process-based provider)."""
    backend = backend_factory(config.spec)
    source = weights or KafkaWeightSource(config.settings, config.spec.name)
    provider = versions if versions is not None else InProcessVersions(backend_factory)
    return RolloutScorer(config, RoutingTable.single(config.spec.version, backend), weights=source,
                         versions=provider, **scorer_kwargs)


def serve_rollout_scorer(scorer: RolloutScorer, stop_event: Any,
                         on_ready: Callable[[RolloutScorer], None] | None = None) -> Any:
    """Run ``scorer`` until ``stop_event``; its weights reader and version provider are closed after."""
    try:
        return scorer.run(stop_event, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
    finally:
        close_rollout_scorer(scorer)


def close_rollout_scorer(scorer: RolloutScorer) -> None:
    """Close what ``build_rollout_scorer`` opened (a scorer that never ran included)."""
    scorer.weights.close()
    scorer.versions.close()
    scorer.close_prepared()


def run_rollout_scorer(config: Any, backend_factory: Callable[[Any], Any], stop_event: Any,
                       on_ready: Callable[[RolloutScorer], None] | None = None, weights: WeightSource | None = None,
                       versions: VersionProvider | None = None, **scorer_kwargs: Any) -> Any:
    """``run_scorer`` that follows the model's rollout: ``build_rollout_scorer``, then ``serve_rollout_scorer``."""
    return serve_rollout_scorer(build_rollout_scorer(config, backend_factory, weights, versions, **scorer_kwargs),
                                stop_event, on_ready)
