"""Micro-batching of consumed records, outside any transaction.

``collect()`` is the only place a stage calls ``consume()``.  librdkafka calls
rebalance callbacks from inside ``consume()``; with pipelined commits a commit
may be in flight then, and the callbacks (``StreamLoop``) settle it before the
partitions go.  The other state to fix is the records already collected for
the next batch from a revoked partition, which ``drop()`` throws away (their
new owner, or we ourselves after a re-assignment, re-read them from the
committed offset); after a failed commit's rewind, ``drop_keys()`` does the
same for the partitions sought back.

Batch size adapts to the load (``max_wait`` 0, the default of the scorer): once one record is
there, ``collect`` takes every record librdkafka has already fetched, up to ``max_batch``, without
waiting for more.  Under a backlog the prefetch queue is full and batches are ``max_batch`` (fewer,
larger transactions drain fastest); when the queue is short a batch is what arrived during the
previous cycle, so at light load a record waits for no timer at all.  With pipelined commits the batch
stays open while the previous commit runs (``hold``): it closes when that commit returns, or when full.  A ``max_wait`` > 0 lingers instead: a batch closes ``max_wait`` after its first
record was seen, or when full (fewer transactions at light load, at the price of that much latency).
Memory: at most ``max_batch`` records here plus librdkafka's bounded prefetch queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from sie.kernel.authz import from_kafka_error
from sie.kernel.consumer import KafkaConsumer
from sie.streams.eos.errors import ConsumerFatal

log = logging.getLogger("sie.eos")

#: while a batch is held open for a running commit: the longest one wait on the commit lasts before what
#: was fetched meanwhile is taken (the commit's end itself wakes the wait at once).  Only a batch that could
#: fill up during the commit cares (its preparation starts at most this much later); the 1 ms ``consume``
#: poll this replaced held ~37 % of the scorer's CPU samples at 200 req/s (py-spy, issue 15)
HOLD_WAIT_S = 0.005


class Batcher:
    """Collects up to ``max_batch`` records, waiting at most ``max_wait_s`` once one has arrived."""

    def __init__(self, consumer: KafkaConsumer, max_batch: int, max_wait_s: float, idle_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, client_config: dict[str, Any] | None = None,
                 between_polls: Callable[[], None] | None = None) -> None:
        self._consumer = consumer
        #: called after each empty wait for the first record (the stage's rebalance nudge)
        self._between_polls = between_polls
        #: the consumer's librdkafka config: names the principal and group of an authorization failure
        self._client_config = client_config or {}
        self._max_batch = max_batch
        self._max_wait = max_wait_s
        self._idle_timeout = idle_timeout_s
        self._clock = clock
        self._buffer: list[Any] = []
        self.consumer_errors = 0

    def collect(self, hold: Callable[[float], bool] | None = None, limit: int | None = None,
                idle_s: float | None = None) -> list[Any]:
        """The next batch of at most ``limit`` records (default ``max_batch``; a bounded run's throttle or a
        windowed stage's room grants fewer); empty if nothing arrived within ``idle_s`` (default
        ``idle_timeout_s``).

        Two phases: wait for one record, then take what is already fetched (``max_wait`` 0), or fill until
        full or ``max_wait`` after that FIRST record (not after the first ``consume`` call returned).
        Timeouts are rounded up to 1 ms: librdkafka truncates shorter ones to 0 and the loop would spin.

        ``hold(timeout)`` (adaptive batches, pipelined commits): waits up to ``timeout`` for the previous
        commit to return and says whether it is still running.  The batch stays open while it is and the
        batch is not full, taking what librdkafka fetched meanwhile (non-blocking ``consume``: the records
        are already in its prefetch queue), and once more when the commit returned.  A record arriving
        during a commit then joins the batch that commits next, instead of waiting for a whole extra cycle
        behind a batch closed at the commit's start; under a backlog the batch is full at once and its
        preparation overlaps the commit.  Waiting on the commit (not polling the consumer) keeps an idle
        loop thread asleep.
        """
        buf = self._buffer = []
        clock = self._clock
        most = self._max_batch if limit is None else min(limit, self._max_batch)
        idle_deadline = clock() + (self._idle_timeout if idle_s is None else idle_s)
        while not buf:
            left = idle_deadline - clock()
            if left <= 0:
                return []
            # consume(1, ...) returns as soon as one record is there (consume(n) would wait for n).
            self._accept(self._consumer.consume(1, max(0.001, min(left, 0.1))))
            if not buf and self._between_polls is not None:
                self._between_polls()
        if self._max_wait <= 0:  # adaptive: what is already fetched, no waiting (consume(n, 0) never blocks)
            if len(buf) < most:
                self._accept(self._consumer.consume(most - len(buf), 0))
            if hold is not None:
                while len(buf) < most and hold(HOLD_WAIT_S):
                    self._accept(self._consumer.consume(most - len(buf), 0))
                if len(buf) < most:  # the commit returned: what arrived since the last look
                    self._accept(self._consumer.consume(most - len(buf), 0))
            batch, self._buffer = self._buffer, []
            return batch
        deadline = clock() + self._max_wait
        while len(buf) < most:
            left = deadline - clock()
            self._accept(self._consumer.consume(most - len(buf), max(0.001, left)))
            if left <= 0:
                break
        batch, self._buffer = self._buffer, []
        return batch

    def _accept(self, messages: Iterable[Any]) -> None:
        buf = self._buffer
        for msg in messages:
            err = msg.error()
            if err is None:
                buf.append(msg)
                continue
            denied = from_kafka_error(err, self._client_config, "READ", msg.topic() or None)
            if denied is not None:  # a missing ACL: final, no retry adds it
                raise denied
            if err.fatal():
                raise ConsumerFatal(f"consumer: fatal error {err.str()}; restart the stage")
            self.consumer_errors += 1
            log.warning("consumer: %s", err.str())

    def drop(self, partitions: Iterable[Any]) -> int:
        """Forget collected records of revoked/lost partitions; returns how many were dropped."""
        return self.drop_keys({(tp.topic, tp.partition) for tp in partitions})

    def drop_keys(self, gone: set[tuple[str, int]]) -> int:
        """Forget collected records of these ``(topic, partition)``s (revoked, or sought back: they come
        again); returns how many were dropped."""
        if not gone or not self._buffer:
            return 0
        kept = [m for m in self._buffer if (m.topic(), m.partition()) not in gone]
        dropped = len(self._buffer) - len(kept)
        self._buffer[:] = kept
        return dropped
