"""Keeping a backfill from starving live traffic: a rate limit and a live-lag gate.

Kafka has no topic priorities (KIP-349 never landed), so the backfill job yields on its own:

* ``RateLimiter`` (``--rate N``): a token bucket of N records/s; a batch takes at most the tokens
  available (burst = 1/5 s of rate), so the job never exceeds N records/s averaged over a second.
* ``LiveLagGate`` (``--max-live-lag N``): every ``interval`` seconds it reads the *live* scorer group's
  committed offsets on the request topic (read-only: an admin query, it never joins or commits for that
  group) and the topic's high watermarks.  Lag = sum over partitions of ``high - committed``.  Above N
  the job pauses between batches (no transaction open); it resumes once the lag is back under N/2
  (hysteresis, so it does not flap).  A live group with no committed offsets counts as lag 0 (nothing
  live to protect).

Both take an injected clock so they are unit-testable without sleeping.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sie.backfill")


class RateLimiter:
    """Token bucket: ``take(n)`` returns how many records (<= n) may be processed now, 0 if none."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate if rate and rate > 0 else None
        self._clock = clock
        self._burst = max(1.0, (self.rate or 0) / 5.0)
        self._tokens = self._burst
        self._last = clock()

    def take(self, wanted: int) -> int:
        if self.rate is None:
            return wanted
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted

    def refund(self, unused: int) -> None:
        """Give back tokens taken for records that did not arrive (a short fetch)."""
        if self.rate is not None and unused > 0:
            self._tokens = min(self._burst, self._tokens + unused)

    def wait_s(self) -> float:
        """Seconds until one token is available (0 when unlimited)."""
        if self.rate is None or self._tokens >= 1:
            return 0.0
        return (1 - self._tokens) / self.rate


class LiveLagGate:
    """Says whether live traffic is behind (``blocked()``); queries at most every ``interval_s``."""

    def __init__(self, lag_fn: Callable[[], int | None], max_lag: int | None, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lag_fn = lag_fn
        self.max_lag = max_lag if max_lag is not None and max_lag > 0 else None
        self._interval = interval_s
        self._clock = clock
        self._next = 0.0
        self.blocked_now = False
        self.last_lag: int | None = None
        self.pauses = 0

    def blocked(self) -> bool:
        if self.max_lag is None:
            return False
        now = self._clock()
        if now < self._next:
            return self.blocked_now
        self._next = now + self._interval
        lag = self._lag_fn()
        self.last_lag = lag
        if lag is None:
            return self.blocked_now  # unknown (broker hiccup): keep the previous decision
        if not self.blocked_now and lag > self.max_lag:
            self.blocked_now = True
            self.pauses += 1
            log.info("live lag %d > %d: backfill paused", lag, self.max_lag)
        elif self.blocked_now and lag <= self.max_lag // 2:
            self.blocked_now = False
            log.info("live lag %d <= %d: backfill resumed", lag, self.max_lag // 2)
        return self.blocked_now


def live_group_lag(admin: Any, consumer: Any, group_id: str, topic: str, partitions: list[int],
                   timeout: float = 5.0) -> int | None:
    """Total lag of ``group_id`` on ``topic`` (read-only admin query); None if it cannot be read now."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    try:
        request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p) for p in partitions])
        future = admin.list_consumer_group_offsets([request], request_timeout=timeout)[group_id]
        committed = {tp.partition: tp.offset for tp in future.result(timeout=timeout).topic_partitions}
        lag = 0
        for p in partitions:
            offset = committed.get(p, -1)
            if offset < 0:
                continue  # never committed by the live group: nothing live to protect on it
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
            lag += max(0, high - offset)
        return lag
    except (KafkaException, Exception) as exc:  # noqa: BLE001 - an unreadable lag must not kill the job
        log.debug("live lag of %s unreadable: %s", group_id, exc)
        return None


class BackfillThrottle:
    """Both of the above as the bounded run's ``Throttle`` (``sie.streams.eos.ranges``): the live-lag gate pauses
    the run's partitions (looked at again within half a second, or ``interval_s``), the rate limiter grants
    records per batch."""

    def __init__(self, gate: LiveLagGate, limiter: RateLimiter, interval_s: float) -> None:
        self.gate = gate
        self.limiter = limiter
        self._interval_s = interval_s

    def paused(self) -> bool:
        return self.gate.blocked()

    def take(self, wanted: int) -> int:
        return self.limiter.take(wanted)

    def refund(self, unused: int) -> None:
        self.limiter.refund(unused)

    def wait_s(self) -> float:
        return min(self._interval_s, 0.5) if self.gate.blocked_now else self.limiter.wait_s()
