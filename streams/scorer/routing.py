"""Version routing: which model version scores a request.

A ``RoutingTable`` is an immutable value; the scorer holds one and swaps it
atomically between batches (``Scorer.set_routing``), so a change never meets a
half-updated table.  Outside a rollout every scorer runs ``RoutingTable.single``;
during one, ``sie.streams.scorer.rollout`` builds the two-version table.  The choice is a stable hash of the Kafka key (or of the
request id when there is no key) into 10,000 buckets, compared against
cumulative weights: the same entity always lands on the same version while the
weights are unchanged, and moving weight from A to B only moves the buckets
between the two boundaries.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass, field
from typing import Any

from sie.kernel.errors import ConfigError

BUCKETS = 10_000


@dataclass(frozen=True)
class RouteEntry:
    """One version, its share of traffic in basis points (1/10,000) and the backend that scores it.  Only that
    version answers its share: a replica whose table names a version it cannot serve now holds no partitions
    (``sie.streams.scorer.rollout``)."""

    version: str
    weight: int
    backend: Any = field(compare=False)


@dataclass(frozen=True)
class RoutingTable:
    """Versions and weights; weights are basis points that sum to 10,000."""

    entries: tuple[RouteEntry, ...]
    _bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.entries:
            raise ConfigError("routing.entries: need at least one version")
        versions = [e.version for e in self.entries]
        if len(set(versions)) != len(versions):
            raise ConfigError(f"routing.entries: versions must be unique (got {versions})")
        if any(e.weight < 0 for e in self.entries):
            raise ConfigError(f"routing.entries: weights must be >= 0 (got {[e.weight for e in self.entries]})")
        total = sum(e.weight for e in self.entries)
        if total != BUCKETS:
            raise ConfigError(f"routing.entries: weights must sum to {BUCKETS} basis points (got {total})")
        bounds, acc = [], 0
        for entry in self.entries:
            acc += entry.weight
            bounds.append(acc)
        object.__setattr__(self, "_bounds", tuple(bounds))

    @classmethod
    def single(cls, version: str, backend: Any) -> RoutingTable:
        """All traffic to one version (the normal, no-rollout case)."""
        return cls((RouteEntry(version, BUCKETS, backend),))

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(e.version for e in self.entries)

    def route(self, key: bytes | None, request_id: str) -> RouteEntry:
        """The entry that scores this request; deterministic for a given key (or id)."""
        if len(self.entries) == 1:
            return self.entries[0]
        data = key if key else request_id.encode()
        bucket = zlib.crc32(data) % BUCKETS
        return self.entries[bisect.bisect_right(self._bounds, bucket)]
