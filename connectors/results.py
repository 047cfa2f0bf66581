"""Reading a model's results the way an application does: ``read_committed``, keyed by request id.

Used by ``sie demo`` (there is no ``sie results`` command).  End-to-end latency of a result is the time it
became visible here minus the time its request was sent (when the caller knows it), so it includes
queueing, batching, inference and the transaction commit.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from sie.kernel.settings import Settings

if TYPE_CHECKING:
    from sie.kernel.clients import KafkaClients


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


@dataclass
class ResultStats:
    """What a collector saw: results by id, statuses, duplicates, dead letters by reason."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    duplicates: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    first_seen: float | None = None
    last_seen: float | None = None

    def latency_summary(self) -> dict[str, float]:
        values = sorted(self.latencies_ms)
        return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {"max": values[-1] if values else float("nan")}


class ResultCollector:
    """Consumes a result topic from the beginning with a private group (commits nothing).

    ``since_ms`` skips results produced before that time (earlier runs of the same requests).
    """

    def __init__(self, settings: Settings, topic: str, *, sent_at: dict[str, float] | None = None,
                 since_ms: int = 0, clock: Callable[[], float] = time.time, clients: KafkaClients | None = None) -> None:
        from sie.kernel.clients import KafkaClients, state_reader_config

        self.topic = topic
        self._sent_at = sent_at
        self._since_ms = since_ms
        self.stats = ResultStats()
        self._clock = clock
        names = settings.names
        # a throwaway group of its own (subscribed, never committed): every run reads the topic from the beginning
        self._consumer = (clients or KafkaClients()).consumer(state_reader_config(
            settings, names.reader_group("results", uuid.uuid4().hex[:8]), names.reader_client_id("results"),
            partition_eof=False))
        self._consumer.subscribe([topic])

    def poll(self, timeout: float = 0.5, max_records: int = 5000) -> int:
        """Read what is available; returns how many records were read."""
        messages = self._consumer.consume(num_messages=max_records, timeout=timeout)
        now = self._clock()
        stats = self.stats
        read = 0
        for msg in messages:
            value = msg.value()
            if msg.error() or value is None or msg.timestamp()[1] < self._since_ms:
                continue
            read += 1
            result = orjson.loads(value)
            rid = str(result.get("id"))
            if rid in stats.results:
                stats.duplicates += 1
                continue
            stats.results[rid] = result
            stats.statuses[result.get("status", "?")] += 1
            if self._sent_at is not None and rid in self._sent_at:
                stats.latencies_ms.append((now - self._sent_at[rid]) * 1000.0)
            stats.first_seen = stats.first_seen or now
            stats.last_seen = now
        return read

    def wait_for(self, count: int, timeout: float,
                 progress: Callable[[ResultStats], None] | None = None) -> ResultStats:
        """Poll until ``count`` distinct results arrived or the deadline passed."""
        deadline = time.monotonic() + timeout
        last_report = time.monotonic()
        while len(self.stats.results) < count and time.monotonic() < deadline:
            self.poll()
            if progress is not None and time.monotonic() - last_report >= 1.0:
                progress(self.stats)
                last_report = time.monotonic()
        return self.stats

    def close(self) -> None:
        self._consumer.close()
