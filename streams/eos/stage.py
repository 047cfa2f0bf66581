"""One consume-transform-produce stage driven end to end: the loop the scorer and the CDC stage share.

``StreamLoop.run`` owns the clients and the order of things; a ``BatchProcessor`` owns only what its
records mean::

    producer = start_producer(...)        # init_transactions(): a zombie holder of the id is fenced
    consumer = Consumer(...); processor.started(consumer)
    consumer.subscribe(topics, on_assign/on_revoke/on_lost)   # revoked records are dropped from the batcher
    on_ready()
    while not stop:
        batch = batcher.collect()          # consume(); rebalance callbacks run here, no transaction open
        every tick_interval_s: processor.tick(consumer)        # lag gauges, progress logs
        status, value = eos.run_batch(batch, processor.prepare, processor.rejected)
        if committed: processor.committed(value, len(batch))   # counters move only for visible work
    close_quietly(consumer, producer)      # leaves the group: partitions move to the others at once

A stop request (SIGTERM) is honoured between batches: the current batch is committed first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sie.kernel.clients import KafkaClients
from sie.streams.eos.batcher import Batcher
from sie.streams.eos.cycle import BatchStatus, EosLimits, EosObserver, ExactlyOnce, start_producer
from sie.streams.eos.records import Output, Prepared
from sie.streams.eos.transaction import close_quietly

log = logging.getLogger("sie.eos")

T = TypeVar("T")


class BatchProcessor(Protocol):
    """What a stage does with its records; ``StreamLoop`` does everything else."""

    def started(self, consumer: Any) -> None:
        """Once, after the consumer exists and before it subscribes (e.g. read topic metadata)."""

    def prepare(self, batch: list[Any]) -> Prepared[Any]:
        """Outside any transaction: every output of ``batch`` (parse, validate, infer); ``RetryLater`` when
        a dependency is down (the batch comes back after a backoff)."""

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        """The dead letter replacing ``output`` (which the producer refused) for its ``output.source``;
        update ``value``'s counts so ``committed`` sees it.  The layer fits it to the size limit."""

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions assigned in a rebalance (e.g. re-read topic metadata: partitions may have been added)."""

    def committed(self, value: Any, batch_size: int) -> None:
        """After the batch committed (its outputs are visible): move counters and metrics."""

    def tick(self, consumer: Any) -> None:
        """Every ``tick_interval_s`` between batches (lag gauges, progress logs)."""

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        """Partitions revoked (or lost) in a rebalance; their collected records were already dropped."""


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


class StreamLoop(Generic[T]):
    """Runs one stage (module docstring).  Build, then ``run(stop)``; ``eos`` holds its counters."""

    def __init__(self, settings: StageSettings, processor: BatchProcessor, *,
                 clients: KafkaClients | None = None, observer: EosObserver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._processor = processor
        self._clients = clients or KafkaClients()
        self._observer = observer
        self._clock = clock
        self.batcher: Batcher | None = None
        self.eos: ExactlyOnce | None = None

    # --- rebalance callbacks (run inside consume(), never with a transaction open) ------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        log.info("%s: assigned %s", self.settings.name, [p.partition for p in partitions])
        self._processor.partitions_assigned(consumer, partitions)

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        self._dropped(partitions, lost=False)

    def _on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        self._dropped(partitions, lost=True)

    def _dropped(self, partitions: list[Any], lost: bool) -> None:
        dropped = self.batcher.drop(partitions) if self.batcher else 0
        self._processor.partitions_dropped(partitions, lost)
        log.log(logging.WARNING if lost else logging.INFO, "%s: %s %s (dropped %d uncommitted collected records)",
                self.settings.name, "lost" if lost else "revoked", [p.partition for p in partitions], dropped)

    # --- the loop ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> None:
        cfg = self.settings
        producer = start_producer(cfg.producer_config, stop, self._clients.producer, cfg.limits,
                                  patience_s=cfg.producer_patience_s)
        if stop.is_set():  # stopped before the broker answered: nothing was started
            return
        consumer = self._clients.consumer(cfg.consumer_config)
        try:
            self.batcher = Batcher(consumer, cfg.max_batch, cfg.max_wait_s, cfg.idle_s, self._clock,
                                   client_config=cfg.consumer_config)
            self.eos = eos = ExactlyOnce(producer, consumer, stop, cfg.limits, observer=self._observer,
                                         fenced_hint=cfg.fenced_hint, clock=self._clock)
            self._processor.started(consumer)
            consumer.subscribe(list(cfg.topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_lost)
            if on_ready:
                on_ready()
            next_tick = self._clock()
            while not stop.is_set():
                batch = self.batcher.collect()
                if self._clock() >= next_tick:
                    self._processor.tick(consumer)
                    next_tick = self._clock() + cfg.tick_interval_s
                if not batch:
                    continue
                status, value = eos.run_batch(batch, self._processor.prepare, self._processor.rejected)
                if status is BatchStatus.COMMITTED:
                    self._processor.committed(value, len(batch))
        finally:
            close_quietly(consumer, producer)  # leaves the group: partitions move to the others at once
