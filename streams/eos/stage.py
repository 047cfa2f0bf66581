"""One consume-transform-produce stage driven end to end: the one consume loop of SIE's exactly-once stages.

Users: the scorer and the CDC stage (subscribed: a consumer group, run until stopped), backfill and dead-letter
redrive (bounded runs: ``ranges=``, ``assign()`` fixed offset ranges and stop at their ends; the steps of a
bounded run and its failures are in ``sie.streams.eos.ranges``), and the LLM stage (windowed: ``window=``, its
transaction is its in-flight window's finished prefix, not the batch it just consumed; ``sie.streams.eos.windowed``).

``StreamLoop.run`` owns the clients and the order of things; a ``BatchProcessor`` owns only what its
records mean::

    producer = start_producer(...)        # init_transactions(): a zombie holder of the id is fenced
    consumer = Consumer(...); processor.started(consumer)
    consumer.subscribe(topics, on_assign/on_revoke/on_lost)   # revoke/lost: settle the in-flight commit,
    on_ready()                                                 # then drop the partitions' collected records
    while not stop:
        batch = batcher.collect(hold)      # consume(); rebalance callbacks run here; pipelined: held open
                                           # while the previous commit runs (or until full)
        every tick_interval_s: processor.tick(consumer)        # lag gauges, progress logs
        outcomes = eos.start_batch(batch, processor.prepare, processor.rejected)
        for each committed outcome: processor.committed(value, size)   # counters move only for visible work
        left the group on a stall: subscribe again once the recovery is through (after a backoff if the
                                   last join ended in a stall too)
    eos.settle()                           # the in-flight commit finishes (stop requests included)
    close_quietly(consumer, producer, leave=stopped_on_request and leaves_group(...), subscribed=...)
                                           # a planned stop LEAVES the group (static member or not): the others
                                           # take its partitions at their next heartbeat; an error exit
                                           # keeps a static member's place for its restart (no rebalance), and
                                           # so does a hand-over (StopRequest.hand_over) while the group is
                                           # settled: its loaded successor takes the place at once

Serial by default (``cycle.PIPELINED_DEFAULT``, the measurement there): each batch is committed before the
next is collected (``run_batch``).  Pipelined (``StageSettings.pipelined``): ``start_batch`` returns as soon as
the batch's commit has started on the committer thread, so the next ``collect`` (and, when that batch fills up
first, its ``prepare``) overlaps the commit's round trips; the rules that keep this exactly once are in
``sie.streams.eos.cycle``.

A stop request (SIGTERM) is honoured between batches: the batch in flight is committed first.

Stalls (``sie.streams.eos.cycle``: a batch fails after nothing was committed for ``EosLimits.stall_s`` while
there was work): the stage cannot commit, typically because it reaches its group coordinator but not its
transaction coordinator or the leaders it writes to (a partial network partition), and it would keep its
partitions, unscored, until ``max.poll.interval.ms``.  It leaves the group instead (``leave_group``, before
the recovery waits for the broker), so the other members take its partitions at their next heartbeat, and
subscribes again once the recovery returned and ``stall_s`` passed since it left, doubling up to
``STALL_BACKOFF_MAX_S`` while each join ends in another stall; a commit resets it (one that lands after the
leave, the commit in flight then, retried: it joins at once).  Why wait: a joining member is given its share of
partitions, its own or the others' (measured: a scorer that joined again at once took a healthy scorer's
partition and stalled it too).  A member that owns every partition does not leave: nobody would take them.
Measured in the partition campaign (docs/reliability.md "Partitions", case 4).

Holding partitions only while able to serve them (``BatchProcessor.serving``, optional; the rollout scorer's:
every version its routing table names is loaded and proven, docs/rollouts.md): a stage that cannot serve does
not subscribe at start, and one that stops being able to (asked between batches; a batch it cannot serve is
refused by ``prepare`` with a ``RetryLater``, so nothing of it is produced) settles its in-flight commit and
leaves the group, so the other members serve its partitions; it subscribes again as soon as it can serve.
Unlike a stall, nothing waits: being unable to serve is the processor's own, known state, not a broker's.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import TopicPartition

from sie.kernel.clients import KafkaClients, connection_config
from sie.kernel.consumer import KafkaConsumer
from sie.kernel.kafka_types import KafkaProducer
from sie.streams.eos.batcher import Batcher
from sie.streams.eos.cycle import (
    PIPELINED_DEFAULT,
    BatchOutcome,
    BatchStatus,
    EosLimits,
    EosObserver,
    ExactlyOnce,
    start_producer,
)
from sie.streams.eos.ranges import RangeRun, Ranges, Throttle
from sie.streams.eos.records import Output, Prepared
from sie.streams.eos.transaction import close_quietly, leave_group, rewind
from sie.streams.eos.windowed import WindowedProcessor

log = logging.getLogger("sie.eos")

#: the longest a stage that left its group on stalls in a row waits before joining again (the first time:
#: ``EosLimits.stall_s``, doubling per stall)
STALL_BACKOFF_MAX_S = 120.0
#: the rebalance nudge (``StreamLoop._nudge``): how long after a rebalance callback, how often, and the
#: metadata request's own timeout (a loopback answer takes milliseconds)
REBALANCE_NUDGE_S = 3.0
NUDGE_EVERY_S = 0.1
NUDGE_TIMEOUT_S = 1.0

T = TypeVar("T")


def freeze_startup_heap() -> None:
    """Move every object alive after start-up (torch, models, clients, modules) out of the cyclic GC's reach.

    A full collection walks every tracked object: in a scorer holding torch that is ~200,000 objects and
    100-150 ms with the GIL held (measured), during which no record is collected, prepared or committed:
    a pause of that size lands in the p99 (issue 15).  Objects built at start-up live for the whole process,
    so scanning them again and again finds nothing; ``gc.freeze()`` (CPython >= 3.7) parks them in a
    permanent generation, and collections then only walk what the loop allocated since.  Per-record
    garbage is acyclic and freed by reference counting either way.

    Once per process (the first stage to start): the objects that matter (imports, torch) exist by then,
    and a second full collection per stage start would cost every restart 150 ms for nothing."""
    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        return
    _HEAP_FROZEN = True
    gc.collect()  # what start-up left as garbage goes now, not frozen forever
    gc.freeze()
    log.debug("gc: %d start-up objects frozen", gc.get_freeze_count())


_HEAP_FROZEN = False


class StopRequest(threading.Event):
    """The stop event of a stage that can also be asked to stop FOR A SUCCESSOR (``hand_over``).

    ``set()``: a planned stop: the batch in flight commits and the consumer leaves the group, so the other
    members take its partitions at their next heartbeat.  ``hand_over()``: a successor with the same
    instance id (``group.instance.id``, and so the same ``transactional.id``) is loaded and waits to start
    once this stage released the id (the agent's replace-in-place, ``sie.workers.supervisor``); whether the
    consumer leaves then is ``leaves_group``'s call.  A plain ``threading.Event`` works too (never handing
    over)."""

    def __init__(self) -> None:
        super().__init__()
        self.handing_over = False

    def hand_over(self) -> None:
        self.handing_over = True
        self.set()


def leaves_group(stop: threading.Event, *, settled: Callable[[], bool]) -> bool:
    """Whether a stage stopped on request by ``stop`` leaves its consumer group.

    A plain stop always leaves: the other members take its partitions at their next heartbeat.  A hand-over
    (a loaded successor with the same ``group.instance.id`` waits to start) keeps the static membership
    whenever the group is settled (``settled``: ``group_settled``, asked of the broker): the successor then
    takes this member's place and its partitions without any rebalance.  Leaving instead costs two: the others
    take the partitions, then the successor's join moves a share back, and a cooperative join (revoke in one
    round, assign in the next, each waiting for the members' heartbeats) held the partitions it moved for
    1.09-1.29 s (bench/results/rollout_handover.txt, before this rule), against the issue's 1 s.
    Not settled (a rebalance in progress, or a partition nobody owns), it leaves: a member mid-way through a
    cooperative rebalance may still list partitions it was told to give a member that just joined, and a
    successor taking its place would inherit only what the broker left it, leaving the rest to nobody until
    the group's next rebalance (seen in tests/test_handover_e2e.py: 3 of 6 partitions silent until the end).
    A member that joins after the broker's answer finds a rebalance waiting for this one, and the successor's
    join (the same ``group.instance.id``) takes its place in that rebalance."""
    if not getattr(stop, "handing_over", False):
        return True
    return not settled()


class PreparedClients:
    """Kafka clients created ahead of a stage's run: ``clients`` hands out the prepared producer and consumer once
    (then creates new ones as ``base`` does).  Why: a standby successor (a hand-over) opens its connections and
    finds its coordinators while its predecessor still serves; told to serve, it only fences the id
    (``init_transactions``) and joins.  A new transactional producer's first coordinator lookup waits 0.5 s
    when no broker connection is up yet (librdkafka's retry timer): half of the hand-overs took 0.6 s from
    "serving now" to their first assignment instead of 0.14 s.  Creating the clients neither fences the
    predecessor (that is ``init_transactions``) nor joins its group (that is ``subscribe``)."""

    def __init__(self, base: KafkaClients, producer_config: dict[str, Any], consumer_config: dict[str, Any]) -> None:
        self._base = base
        self._producer: KafkaProducer | None = base.producer(producer_config)
        self._consumer: KafkaConsumer | None = base.consumer(consumer_config)
        self.clients = KafkaClients(consumer=self._take_consumer, producer=self._take_producer, admin=base.admin)

    def _take_producer(self, config: dict[str, Any]) -> KafkaProducer:
        producer, self._producer = self._producer, None
        return producer if producer is not None else self._base.producer(config)

    def _take_consumer(self, config: dict[str, Any]) -> KafkaConsumer:
        consumer, self._consumer = self._consumer, None
        return consumer if consumer is not None else self._base.consumer(config)

    def close(self) -> None:
        """Close what was prepared and never taken (a standby stopped before it served)."""
        consumer, self._consumer, self._producer = self._consumer, None, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - never subscribed: nothing to leave
                log.debug("prepared consumer: close failed: %s", exc)


def group_settled(consumer: KafkaConsumer, consumer_config: dict[str, Any], clients: KafkaClients,
                  topics: Sequence[str], timeout_s: float = 3.0) -> bool:
    """Whether the broker describes ``consumer``'s group as stable, with this member in it and every partition of
    ``topics`` owned by a member (False when unknown: the caller then leaves, which is safe)."""
    group, me = consumer_config.get("group.id"), consumer.memberid()
    if not group or not me:
        return False
    try:
        admin = clients.admin(connection_config(consumer_config))
        described = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(
            timeout=timeout_s + 1)
        partitions = {t: list(admin.list_topics(t, timeout=timeout_s).topics[t].partitions) for t in topics}
    except Exception as exc:  # unknown: leave (the others, if any, take over; safe either way)
        log.info("group %s not described (%s): leaving it", group, exc)
        return False
    return settled_description(described, me, partitions)


def settled_description(described: Any, member: str | None, partitions: dict[str, list[int]]) -> bool:
    """A group description (``describe_consumer_groups``) as ``group_settled`` judges it: stable, ``member`` (if
    named) in it, every listed partition owned by a member."""
    from confluent_kafka import ConsumerGroupState

    if described.state != ConsumerGroupState.STABLE:
        return False
    if member is not None and member not in [m.member_id for m in described.members]:
        return False
    owned = {(tp.topic, tp.partition) for m in described.members for tp in m.assignment.topic_partitions}
    return all(parts and all((t, p) in owned for p in parts) for t, parts in partitions.items())


def owns_every_partition(consumer: KafkaConsumer, topics: Sequence[str], timeout_s: float = 5.0) -> bool:
    """Whether ``consumer``'s assignment covers every partition of ``topics`` (False when unknown)."""
    try:
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return False
            if any((topic, p) not in assigned for p in meta.partitions):
                return False
        return True
    except Exception as exc:  # metadata unavailable: leave (the others, if any, take over; safe either way)
        log.info("partition ownership unknown (%s): leaving the group", exc)
        return False


class BatchProcessor(Protocol):
    """What a stage does with its records; ``StreamLoop`` does everything else."""

    def started(self, consumer: KafkaConsumer) -> None:
        """Once, after the consumer exists and before it subscribes (e.g. read topic metadata)."""

    def prepare(self, batch: list[Any]) -> Prepared[Any]:
        """Outside any transaction: every output of ``batch`` (parse, validate, infer); ``RetryLater`` when
        a dependency is down (the batch comes back after a backoff)."""

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        """The dead letter replacing ``output`` (which the producer refused) for its ``output.source``;
        update ``value``'s counts so ``committed`` sees it.  The layer fits it to the size limit."""

    def partitions_assigned(self, consumer: KafkaConsumer, partitions: list[Any]) -> None:
        """Partitions assigned in a rebalance (e.g. re-read topic metadata: partitions may have been added).
        Called on the loop's thread after the ``consume()`` that assigned them returned, before any of their
        records is prepared (not inside librdkafka's callback: see ``StreamLoop._on_assign``); never with an
        empty list (a cooperative rebalance that gave this member nothing new)."""

    def committed(self, value: Any, batch_size: int) -> None:
        """After the batch committed (its outputs are visible): move counters and metrics."""

    def tick(self, consumer: KafkaConsumer) -> None:
        """Every ``tick_interval_s`` between batches (lag gauges, progress logs)."""

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        """Partitions revoked (or lost) in a rebalance; their collected records were already dropped."""

    # Optional: ``serving() -> bool``, asked between batches (and at start, before subscribing): whether the
    # processor can serve partitions now.  False: the stage holds none (module docstring); absent: always True.


@dataclass(frozen=True)
class StageSettings:
    """Everything ``StreamLoop`` needs to know about one stage instance."""

    name: str  # for logs, e.g. "scorer fraud-scorer" or "cdc orders"
    topics: Sequence[str]
    producer_config: dict[str, Any]
    consumer_config: dict[str, Any]
    max_batch: int
    max_wait_s: float
    idle_s: float
    tick_interval_s: float
    limits: EosLimits = field(default_factory=EosLimits)
    fenced_hint: str = "give every instance a distinct --instance"
    producer_patience_s: float | None = 60.0
    #: commit batch N on a committer thread while batch N+1 is collected and prepared (cycle docstring); the
    #: default is ``cycle.PIPELINED_DEFAULT`` (serial, by measurement)
    pipelined: bool = PIPELINED_DEFAULT


class StreamLoop(Generic[T]):
    """Runs one stage (module docstring).  Build, then ``run(stop)``; ``eos`` holds its counters."""

    def __init__(self, settings: StageSettings, processor: BatchProcessor, *,
                 clients: KafkaClients | None = None, observer: EosObserver | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 ranges: Ranges | None = None, throttle: Throttle | None = None,
                 window: WindowedProcessor | None = None) -> None:
        self.settings = settings
        #: a windowed stage (``sie.streams.eos.windowed``; ``processor`` is the same object)
        self._window = window
        self._stop_event = threading.Event()
        #: a bounded run (``sie.streams.eos.ranges``): ``assign()`` these ranges, stop at their ends
        self._ranges = ranges
        self._throttle = throttle
        self.range_run: RangeRun | None = None
        self._processor = processor
        self._clients = clients or KafkaClients()
        self._observer = observer
        self._clock = clock
        self._wall = wall_clock
        self.batcher: Batcher | None = None
        #: assignments seen in rebalance callbacks, handed to the processor from the loop (``_on_assign``)
        self._assigned: list[list[Any]] = []
        self.eos: ExactlyOnce | None = None
        self._consumer: KafkaConsumer | None = None
        self._in_rebalance = False
        #: leaving the group on a stall (inside a failed batch's recovery): a revoke then commits nothing
        self._leaving = False
        #: left the group on a stall (module docstring): joins again at ``_rejoin_at`` (None: not yet known)
        self._out_of_group = False
        self._rejoin_at: float | None = None
        self._left_at = 0.0
        #: stalls since the last commit (the backoff before joining again doubles with each)
        self.stalls_in_a_row = 0
        #: how many times this stage left its group on a stall
        self.stall_leaves = 0
        #: out of the group (or never joined) because the processor cannot serve (``serving``; module docstring)
        self._gated_out = False
        #: how many times this stage left its group (or kept out of it at start) because it could not serve
        self.gate_leaves = 0
        #: the rebalance nudge (``_nudge``): until when, and when the next metadata request may go
        self._nudge_until = 0.0
        self._next_nudge = 0.0

    # --- rebalance callbacks (run inside consume(), on the loop's thread) ----------------------------------
    def _nudge(self) -> None:
        """While a rebalance may still be running (``REBALANCE_NUDGE_S`` after a rebalance callback): a metadata
        request at most every ``NUDGE_EVERY_S``.  librdkafka (classic protocol) sends a member's JoinGroup at
        most once a second unless a metadata answer came in since (``rkcg_join_intvl``), so a member that
        joined for the first round of a cooperative rebalance (a new replica; one told to rejoin by a heartbeat)
        held the second round -- the one that hands over the moved partitions -- up to a second; every member
        of the group waits for the last one to join."""
        now = self._clock()
        if now >= self._nudge_until or now < self._next_nudge or self._consumer is None:
            return
        self._next_nudge = now + NUDGE_EVERY_S
        try:
            self._consumer.list_topics(self.settings.topics[0], timeout=NUDGE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - only a hint; the join goes out within a second anyway
            log.debug("%s: metadata request during a rebalance failed: %s", self.settings.name, exc)

    def _rebalanced(self) -> None:
        self._nudge_until = self._clock() + REBALANCE_NUDGE_S
        self._next_nudge = 0.0

    def _on_assign(self, consumer: KafkaConsumer, partitions: list[Any]) -> None:
        """Noted only: the processor hears of it from the loop (``_hand_assigned``).  Why: a consumer call that
        takes confluent-kafka's per-thread call state (``list_topics``, ``consumer_group_metadata``) made
        inside a rebalance callback clears that state when it returns, and the NEXT callback served by the
        same ``poll``/``consume`` then aborts the process (``CallState_get: Assertion `cs != NULL'``, seen
        when a leaving consumer was handed an assignment and its revoke in one poll)."""
        log.info("%s: assigned %s", self.settings.name, [p.partition for p in partitions])
        self._assigned.append(partitions)
        self._rebalanced()

    def _hand_assigned(self, consumer: KafkaConsumer) -> None:
        # an empty incremental assignment (a cooperative round that moved nothing here) is not handed on: a
        # processor's assignment work (the rollouts read barrier: 0.1-0.5 s) would stall every partition held
        while self._assigned:
            partitions = self._assigned.pop(0)
            if partitions:
                self._processor.partitions_assigned(consumer, partitions)

    def _on_revoke(self, _consumer: KafkaConsumer, partitions: list[Any]) -> None:
        self._rebalanced()
        self._dropped(partitions, lost=False)

    def _on_lost(self, _consumer: KafkaConsumer, partitions: list[Any]) -> None:
        self._dropped(partitions, lost=True)

    def _dropped(self, partitions: list[Any], lost: bool) -> None:
        if self.eos is not None:  # the in-flight commit finishes (or fails and recovers) before the partitions go
            self._in_rebalance = True
            try:
                self._report(self.eos.settle(revoked=partitions))
                if self._window is not None and not lost and not self._leaving:
                    # still this member's generation: what is finished is committed, not redone by the next owner
                    self._window.closing()
                    self._commit_window(self.eos, force=True)
            finally:
                self._in_rebalance = False
        dropped = self.batcher.drop(partitions) if self.batcher else 0
        self._processor.partitions_dropped(partitions, lost)
        log.log(logging.WARNING if lost else logging.INFO, "%s: %s %s (dropped %d uncommitted collected records)",
                self.settings.name, "lost" if lost else "revoked", [p.partition for p in partitions], dropped)

    def _rewound(self, partitions: list[tuple[str, int]]) -> None:
        """After a rewind (failed commit, backoff): records collected from those partitions come again."""
        if self.batcher is not None:
            self.batcher.drop_keys(set(partitions))
        if self.range_run is not None:
            self.range_run.rewound(partitions)

    def _report(self, outcomes: list[BatchOutcome[Any]]) -> None:
        for outcome in outcomes:
            if outcome.status is BatchStatus.COMMITTED:
                self.stalls_in_a_row = 0
                self._processor.committed(outcome.value, outcome.size)

    # --- stalls (module docstring) ------------------------------------------------------------------------
    def _stalled(self, reason: str) -> None:
        """``ExactlyOnce``'s ``on_stalled``, before it recovers the failed batch: leave the group.  Not from
        inside a rebalance callback (the partitions are going anyway; a poll there would nest)."""
        if self._out_of_group or self._in_rebalance or self._consumer is None:
            return
        if owns_every_partition(self._consumer, self.settings.topics):
            log.warning("%s: %s; no other member to take its partitions: staying in the group", self.settings.name,
                        reason)
            return
        self.stalls_in_a_row += 1
        self.stall_leaves += 1
        log.warning("%s: %s; leaving the consumer group so that the other members take its partitions, joining "
                    "again once the recovery is through", self.settings.name, reason)
        self._leaving = True  # the revoke leave_group serves runs inside the failed batch's recovery: no commit
        try:
            leave_group(self._consumer)
        finally:
            self._leaving = False
        self._out_of_group, self._rejoin_at, self._left_at = True, None, self._clock()

    def _rejoin(self, consumer: KafkaConsumer) -> None:
        """Out of the group on a stall, the recovery returned: subscribe again once the backoff, counted from the
        leave, passed: the recovery's own wait (an abort retried against a coordinator that answers late) is time
        out of the group too (measured in case 6 of the partition campaign: a 20 s abort + a 10 s backoff after it
        kept a scorer out 31 s, 16 s past the heal).  A commit that landed since the leave (the one in flight
        then, retried) proves the stage commits again: it joins at once."""
        if self._rejoin_at is None:
            base = self.settings.limits.stall_s or 0.0
            backoff = 0.0 if self.stalls_in_a_row == 0 else min(STALL_BACKOFF_MAX_S,
                                                                 base * 2 ** (self.stalls_in_a_row - 1))
            self._rejoin_at = self._left_at + backoff
            log.warning("%s: left the group on %d stall(s) in a row %.0fs ago; joining it again in %.0fs",
                        self.settings.name, self.stalls_in_a_row, self._clock() - self._left_at,
                        max(0.0, self._rejoin_at - self._clock()))
        if self._clock() < self._rejoin_at or self._gated_out:
            return  # gated out: it joins once it can serve (``_gate``), and only after this backoff
        self._subscribe(consumer)
        self._out_of_group, self._rejoin_at = False, None
        if self.eos is not None:
            self.eos.restarted()  # stall_s from now
        log.info("%s: joined the consumer group again after a stall", self.settings.name)

    # --- holding partitions only while able to serve them (module docstring) -------------------------------
    def _serving(self) -> bool:
        check = getattr(self._processor, "serving", None)
        return True if check is None else bool(check())

    def _gate(self, consumer: KafkaConsumer, eos: ExactlyOnce) -> None:
        """Between batches: leave the group when the processor can no longer serve, join when it can again."""
        serving = self._serving()
        if self._gated_out:
            if serving:
                self._gated_out = False
                if not self._out_of_group:  # a stall's backoff still running: ``_rejoin`` joins after it
                    self._subscribe(consumer)
                    eos.restarted()
                log.info("%s: can serve: joining the consumer group", self.settings.name)
            return
        if serving or self._out_of_group:
            return
        self._report(eos.settle())  # the batch in flight commits first: a planned hand-over
        log.warning("%s: cannot serve its partitions now: leaving the consumer group (the other members serve "
                    "them) until it can", self.settings.name)
        leave_group(consumer, subscribed=True)
        self._gated_out = True
        self.gate_leaves += 1

    def _subscribe(self, consumer: KafkaConsumer) -> None:
        self._rebalanced()  # a first join may be throttled as well (a retried JoinGroup)
        consumer.subscribe(list(self.settings.topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_lost)

    # --- the loop ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Run until ``stop`` (a subscribed stage), or until every range is done (a bounded run)."""
        cfg = self.settings
        self._stop_event = stop
        bounded = self._ranges is not None
        # init_transactions() first: a zombie holder of the id is fenced, and its open transaction aborted, before
        # anything is read (a bounded run's start offsets: read_committed waits on a pending offset commit)
        producer = start_producer(cfg.producer_config, stop, self._clients.producer, cfg.limits,
                                  patience_s=cfg.producer_patience_s)
        if stop.is_set():  # stopped before the broker answered: nothing was started
            return
        consumer = self._consumer = self._clients.consumer(cfg.consumer_config)
        eos: ExactlyOnce | None = None
        planned = False  # the loop ended on a stop request (not an error): the member leaves the group
        try:
            self.batcher = batcher = Batcher(consumer, cfg.max_batch, cfg.max_wait_s, cfg.idle_s, self._clock,
                                             client_config=cfg.consumer_config, between_polls=self._nudge)
            self.eos = eos = ExactlyOnce(producer, consumer, stop, cfg.limits, observer=self._observer,
                                         fenced_hint=cfg.fenced_hint, clock=self._clock, wall_clock=self._wall,
                                         on_rewind=self._rewound, on_stalled=self._stalled)
            self._processor.started(consumer)
            if bounded:
                if self._read_ranges(consumer):  # read now that earlier holders of the id are fenced
                    assert self.range_run is not None
                    consumer.assign(self.range_run.assignment())
            elif self._serving():
                self._subscribe(consumer)
            else:
                self._gated_out = True
                self.gate_leaves += 1
                log.warning("%s: cannot serve yet: joins the consumer group once it can", self.settings.name)
            if on_ready:
                on_ready()
            freeze_startup_heap()
            if bounded:
                self._run_bounded(stop, consumer, batcher, eos)
                planned = True
                return
            if self._window is not None:
                self._run_windowed(stop, consumer, batcher, eos, self._window)
                planned = True
                return
            next_tick = self._clock()
            prepare, rejected, pipelined, wall = self._processor.prepare, self._processor.rejected, cfg.pipelined, self._wall
            hold = eos.commit_running if pipelined else None
            while not stop.is_set():
                batch = batcher.collect(hold)
                collected_at = wall()
                if self._assigned:
                    self._hand_assigned(consumer)
                self._nudge()
                if self._clock() >= next_tick:
                    self._processor.tick(consumer)
                    next_tick = self._clock() + cfg.tick_interval_s
                if not batch:
                    self._report(eos.settle())  # idle: report the in-flight batch now, not at the next one
                    eos.idle()
                    if self._out_of_group:
                        self._rejoin(consumer)
                    self._gate(consumer, eos)
                    continue
                self._report(eos.start_batch(batch, prepare, rejected, pipelined=pipelined,
                                             collected_at=collected_at))
                if self._out_of_group:
                    self._rejoin(consumer)
                self._gate(consumer, eos)
            self._report(eos.settle())  # stop requested: the batch in flight is committed first
            planned = True
        finally:
            if eos is not None:
                if eos.in_flight:  # leaving on an error: let the commit in flight finish, never mask the error
                    try:
                        eos.settle()
                    except Exception as exc:  # noqa: BLE001 - logged; the original error propagates
                        log.warning("%s: commit in flight at exit: %s", self.settings.name, exc)
            # a planned stop leaves the group (partitions move to the others at their next heartbeat); an
            # error keeps a static member's place for its restart (transaction.leave_group); a bounded run
            # has no group membership to leave (assign())
            close_quietly(consumer, producer, subscribed=not (self._out_of_group or self._gated_out),
                          leave=planned and not bounded and leaves_group(
                              stop, settled=lambda: group_settled(consumer, cfg.consumer_config, self._clients,
                                                                  cfg.topics)))

    # --- windowed stages (sie.streams.eos.windowed) ---------------------------------------------------------
    def _run_windowed(self, stop: threading.Event, consumer: Any, batcher: Batcher, eos: ExactlyOnce,
                      window: WindowedProcessor) -> None:
        """Collect what the window has room for, hand it over, commit what is ready (``sie.streams.eos.windowed``)."""
        cfg = self.settings
        next_tick = self._clock()
        while not stop.is_set():
            limit, idle_s = window.room(consumer)
            records = batcher.collect(None, limit, idle_s)
            if self._assigned:
                self._hand_assigned(consumer)
            if self._clock() >= next_tick:
                window.tick(consumer)
                next_tick = self._clock() + cfg.tick_interval_s
            window.accept(records)
            if not self._commit_window(eos, force=False):
                eos.idle()  # waiting on work in flight is not a stall
            if self._out_of_group:
                self._rejoin(consumer)
        window.closing()  # stop requested: what is finished becomes visible; the rest is redone by the next owner
        self._commit_window(eos, force=True)

    def _commit_window(self, eos: ExactlyOnce, force: bool) -> bool:
        """One transaction of what the window has ready; whether there was any.  Not committed: the window
        drops what it holds and every partition it held is rewound to its committed offset."""
        window = self._window
        assert window is not None
        batch = window.ready(force)
        if not batch:
            return False
        outcomes = eos.start_batch(batch, window.prepare, window.rejected, pipelined=False)
        self._report(outcomes)
        if outcomes[-1].status is not BatchStatus.COMMITTED:
            firsts = window.failed()
            if firsts:
                rewind(eos.consumer, firsts, self._stop_event)
                self._rewound(list(firsts))
        return True

    # --- bounded runs (sie.streams.eos.ranges) ------------------------------------------------------------
    def _read_ranges(self, consumer: Any) -> bool:
        """Read the run's ranges (``self.range_run``); whether any partition has records left."""
        assert self._ranges is not None
        self.range_run = run = RangeRun(self._ranges(consumer))
        return not run.finished

    def _run_bounded(self, stop: threading.Event, consumer: Any, batcher: Batcher, eos: ExactlyOnce) -> None:
        """Serial batches over the assigned ranges until each reached its end (``sie.streams.eos.ranges``)."""
        cfg, run, throttle = self.settings, self.range_run, self._throttle
        assert run is not None
        prepare, rejected = self._processor.prepare, self._processor.rejected
        next_tick = self._clock()
        throttled = False  # the partitions are paused by the throttle
        while not stop.is_set() and not run.finished:
            if self._clock() >= next_tick:
                self._processor.tick(consumer)
                next_tick = self._clock() + cfg.tick_interval_s
            limit = None
            if throttle is not None:
                if throttle.paused():
                    if not throttled:
                        consumer.pause(run.unfinished())
                        throttled = True
                    stop.wait(min(throttle.wait_s(), 0.5))
                    continue
                if throttled:
                    consumer.resume(run.unfinished())
                    throttled = False
                limit = throttle.take(cfg.max_batch)
                if limit == 0:
                    stop.wait(min(max(throttle.wait_s(), 0.005), 0.5))
                    continue
            fetched = batcher.collect(None, limit)
            collected_at = self._wall()
            if throttle is not None and limit is not None:
                throttle.refund(limit - len(fetched))
            batch, reached = run.take(fetched)
            if reached:
                consumer.pause([TopicPartition(t, p) for (t, p) in reached])
            if not batch:
                eos.idle()
                run.committed(reached)
                run.passed(consumer)
                continue
            outcomes = eos.start_batch(batch, prepare, rejected, pipelined=False, collected_at=collected_at)
            self._report(outcomes)
            if outcomes[-1].status is BatchStatus.COMMITTED:
                run.committed(reached)
            else:  # rewound to the committed offsets: everything not committed is read again, ends included
                consumer.resume(run.unfinished())
