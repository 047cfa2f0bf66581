"""Bounded runs: ``StreamLoop`` over fixed offset ranges that stops at their ends (backfill, redrive).

A bounded run reads ``[start, end)`` of each of its partitions with ``assign()`` (no group membership: no
rebalance, no stall), through the same batcher and the same exactly-once cycle as a subscribed stage, and
ends once every partition reached its end.  The ends are fixed when the run starts (backfill: stored in its
plan; redrive: the dead-letter topic's ends then), so a topic that keeps growing never keeps a run alive.

One batch of a bounded run (``StreamLoop.run`` with ``ranges``; always serial, see below)::

    producer = start_producer(...)            # init_transactions(): a zombie run of the same id is fenced,
                                              # its open transaction aborted
    bounds = ranges(consumer)                 # start offsets: the committed ones, final now
    consumer.assign(each unfinished partition at its start)
    while not stop and a partition is unfinished:
        throttle: paused -> pause the partitions, wait, again; take(n) -> 0: wait, again
        batch = batcher.collect(limit=n)      # consume(); non-fatal consumer errors logged and counted
        batch, reached = run.take(batch)      # a record at or past its end: the partition is "reached",
                                              # paused (nothing past the end is fetched); the record dropped
        committed = eos.run_batch(batch)      # outputs + offsets in one transaction (KIP-447)
        committed: reached partitions are done (everything below their ends is committed)
        not committed: rewound (cycle); every unfinished partition resumed, reached ones read again
        no batch: a partition whose fetch position passed its end (only markers, aborted or compacted
                  records were left) is done, unless it was rewound and nothing was read since

Why serial: "reached" means "everything of the partition below its end is in this batch or committed";
with a commit in flight while the next batch is read that would need the in-flight batch's outcome too,
and a bounded run is a catch-up job whose throughput the commit round trip barely touches (batches are
full).  Why fence first: a live zombie could commit past start offsets read before it is fenced (the range
would be answered twice), and a killed one's pending offset commit makes a ``read_committed`` consumer's
``committed()`` wait until its transaction times out; ``init_transactions`` aborts it at once.  The price: a run with nothing left starts a producer too.

Failures -> what happens:

=============================================  ==========================================================
a batch's transaction aborts / producer dies   the cycle rewinds the batch's partitions; every unfinished
                                               partition is resumed; the rewound ones are not judged by
                                               ``position()`` (it still reports the pre-seek offset) until
                                               a record of theirs is read again
a fatal or authorization consumer error        raised (``ConsumerFatal`` / ``NotAuthorized``): the run stops,
                                               resumable from its committed offsets
a non-fatal consumer error                     logged and counted (``Batcher.consumer_errors``), skipped
``position()`` fails                           logged; looked at again at the next idle batch
two runs of one job at once                    the second one's ``init_transactions`` fences the first
                                               (``Fenced`` after ``fatal_limit`` fatal errors in a row)
stop requested                                 between batches, after the batch in flight committed
=============================================  ==========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

log = logging.getLogger("sie.eos")

#: ``(topic, partition)``
TP = tuple[str, int]
#: ``ranges(consumer)``: ``(start, end)`` per partition, read with the run's consumer (committed offsets,
#: watermarks); a partition with ``start >= end`` is done from the start
Ranges = Callable[[Any], Mapping[TP, tuple[int, int]]]


class Throttle(Protocol):
    """How fast a bounded run may read (backfill: ``--rate`` and the live-lag gate); None: as fast as it can."""

    def paused(self) -> bool:
        """True: read nothing now (the run's partitions are paused meanwhile, so nothing is prefetched)."""

    def take(self, wanted: int) -> int:
        """How many of ``wanted`` records may be read now (0: none, wait ``wait_s``)."""

    def refund(self, unused: int) -> None:
        """Records granted by ``take`` but not read (the topic had fewer)."""

    def wait_s(self) -> float:
        """How long to wait before asking again, when paused or when ``take`` granted nothing."""


class RangeRun:
    """Which partitions of a bounded run are done, and what a batch of it contains (module docstring)."""

    def __init__(self, bounds: Mapping[TP, tuple[int, int]]) -> None:
        self.starts = {tp: start for tp, (start, _end) in bounds.items()}
        self.ends = {tp: end for tp, (_start, end) in bounds.items()}
        self.done: set[TP] = {tp for tp, (start, end) in bounds.items() if start >= end}
        #: sought back after a failed batch: ``position()`` is stale for them until a record is read again
        self._rewound: set[TP] = set()

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.ends)

    def unfinished(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for (t, p) in self.ends if (t, p) not in self.done]

    def assignment(self) -> list[TopicPartition]:
        """Every unfinished partition at its start offset (for ``assign``)."""
        return [TopicPartition(t, p, self.starts[(t, p)]) for (t, p) in self.ends if (t, p) not in self.done]

    def take(self, batch: list[Any]) -> tuple[list[Any], set[TP]]:
        """The records of ``batch`` inside their ranges, and the partitions whose end the batch reached."""
        kept: list[Any] = []
        reached: set[TP] = set()
        ends, done, rewound = self.ends, self.done, self._rewound
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            rewound.discard(tp)
            if tp in reached or tp in done or tp not in ends:
                continue
            if msg.offset() >= ends[tp]:
                reached.add(tp)  # everything of tp below its end is in this batch or committed before
                continue
            kept.append(msg)
        return kept, reached

    def committed(self, reached: Iterable[TP]) -> None:
        """The batch that reached these ends committed (or had no record): they are done."""
        self.done.update(reached)

    def rewound(self, partitions: Iterable[TP]) -> None:
        self._rewound.update(partitions)

    def passed(self, consumer: Any) -> list[TP]:
        """Idle: partitions whose fetch position passed their end (markers, aborted data) are done; returns them."""
        pending = [TopicPartition(t, p) for (t, p) in self.ends if (t, p) not in self.done
                   and (t, p) not in self._rewound]
        if not pending:
            return []
        try:
            positions = consumer.position(pending)
        except KafkaException as exc:
            log.debug("position(): %s", exc)
            return []
        ended = [(tp.topic, tp.partition) for tp in positions
                 if tp.offset >= 0 and tp.offset >= self.ends[(tp.topic, tp.partition)]]
        self.done.update(ended)
        return ended
