"""Micro-batching of consumed records, outside any transaction.

``collect()`` is the only place the scorer calls ``consume()``, and no
transaction is ever open while it runs.  librdkafka calls rebalance callbacks
from inside ``consume()``, so at callback time there is nothing to commit;
the only state to fix is the records already collected for the next batch
from a revoked partition, which ``drop()`` throws away (their new owner, or
we ourselves after a re-assignment, re-read them from the committed offset).

Latency: ``consume(n, timeout)`` returns when ``n`` records are there or the
timeout ends, so each call waits at most ``max_wait``; a batch closes
``max_wait`` after its first record was seen, or when full.  Memory: at most
``max_batch`` records here plus librdkafka's bounded prefetch queue.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from streams.scorer.errors import ScorerError

log = logging.getLogger("sie.scorer")


class Batcher:
    """Collects up to ``max_batch`` records, waiting at most ``max_wait_s`` once one has arrived."""

    def __init__(self, consumer: Any, max_batch: int, max_wait_s: float, idle_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._consumer = consumer
        self._max_batch = max_batch
        self._max_wait = max_wait_s
        self._idle_timeout = idle_timeout_s
        self._clock = clock
        self._buffer: list[Any] = []
        self.consumer_errors = 0

    def collect(self) -> list[Any]:
        """The next batch; empty if nothing arrived within ``idle_timeout_s``."""
        buf = self._buffer = []
        clock = self._clock
        start = clock()
        deadline: float | None = None
        step = max(self._max_wait, 0.005)  # an empty consume with timeout 0 would spin
        while len(buf) < self._max_batch:
            now = clock()
            if deadline is None:
                left = self._idle_timeout - (now - start)
                if left <= 0:
                    break
                timeout = min(step, left)
            else:
                timeout = deadline - now
                if timeout <= 0:
                    break
            messages = self._consumer.consume(self._max_batch - len(buf), timeout)
            if messages:
                self._accept(messages)
                if buf and deadline is None:
                    deadline = clock() + self._max_wait
        batch, self._buffer = self._buffer, []
        return batch

    def _accept(self, messages: Iterable[Any]) -> None:
        buf = self._buffer
        for msg in messages:
            err = msg.error()
            if err is None:
                buf.append(msg)
                continue
            if err.fatal():
                raise ScorerError(f"consumer: fatal error {err.str()}; restart the scorer")
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
