"""Micro-batching of consumed records, outside any transaction.

``collect()`` is the only place a stage calls ``consume()``, and no
transaction is ever open while it runs.  librdkafka calls rebalance callbacks
from inside ``consume()``, so at callback time there is nothing to commit;
the only state to fix is the records already collected for the next batch
from a revoked partition, which ``drop()`` throws away (their new owner, or
we ourselves after a re-assignment, re-read them from the committed offset).

Latency: ``consume(n, timeout)`` returns when ``n`` records are there or the
timeout ends; a batch closes ``max_wait`` after its first record was seen, or
when full.  Memory: at most
``max_batch`` records here plus librdkafka's bounded prefetch queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from sie.kernel.authz import from_kafka_error
from sie.streams.eos.errors import ConsumerFatal

log = logging.getLogger("sie.eos")


class Batcher:
    """Collects up to ``max_batch`` records, waiting at most ``max_wait_s`` once one has arrived."""

    def __init__(self, consumer: Any, max_batch: int, max_wait_s: float, idle_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, client_config: dict[str, Any] | None = None) -> None:
        self._consumer = consumer
        #: the consumer's librdkafka config: names the principal and group of an authorization failure
        self._client_config = client_config or {}
        self._max_batch = max_batch
        self._max_wait = max_wait_s
        self._idle_timeout = idle_timeout_s
        self._clock = clock
        self._buffer: list[Any] = []
        self.consumer_errors = 0

    def collect(self) -> list[Any]:
        """The next batch; empty if nothing arrived within ``idle_timeout_s``.

        Two phases, so a batch is held open at most ``max_wait`` after its FIRST record (not after the
        first ``consume`` call returned): wait for one record, then fill until full or the deadline.
        Timeouts are rounded up to 1 ms: librdkafka truncates shorter ones to 0 and the loop would spin.
        """
        buf = self._buffer = []
        clock = self._clock
        idle_deadline = clock() + self._idle_timeout
        while not buf:
            left = idle_deadline - clock()
            if left <= 0:
                return []
            # consume(1, ...) returns as soon as one record is there (consume(n) would wait for n).
            self._accept(self._consumer.consume(1, max(0.001, min(left, 0.1))))
        deadline = clock() + self._max_wait
        while len(buf) < self._max_batch:
            left = deadline - clock()
            # At least one call even when max_wait is 0: it takes what librdkafka has already fetched.
            self._accept(self._consumer.consume(self._max_batch - len(buf), max(0.001, left)))
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
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if not gone or not self._buffer:
            return 0
        kept = [m for m in self._buffer if (m.topic(), m.partition()) not in gone]
        dropped = len(self._buffer) - len(kept)
        self._buffer[:] = kept
        return dropped
