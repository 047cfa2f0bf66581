"""Windowed stages: ``StreamLoop`` for a stage whose transaction is not the batch it just consumed (the LLM stage).

A windowed stage keeps records in flight across many polls (generations that take seconds, on other
threads) and commits, now and then, whatever of them is finished *in offset order*: each partition's
contiguous finished prefix, so no output exists for an offset beyond the committed one.  The loop, the
consumer, the rebalance callbacks, the stall rule and the transaction stay ``StreamLoop``'s; the stage says
how much it can take, what it does with what arrived, and what is ready to commit::

    while not stop:
        n, wait_s = stage.room(consumer)       # full: the stage paused its partitions, n = 1 keeps polling
        records = batcher.collect(limit=n, idle_s=wait_s)   # consume(); rebalance callbacks run here
        stage.accept(records)                  # into the window, to the workers; finished ones collected
        batch = stage.ready(force=False)       # the finished prefixes, when the stage's cadence says so
        batch: eos.run_batch(batch, stage.prepare)          # outputs built by the stage + offsets, one txn
               not committed: firsts = stage.failed()       # everything in flight dropped
                              rewind(consumer, firsts)      # and read again from the committed offsets
        no batch: eos.idle()                   # waiting on generations is not a stall
    stage.closing(); commit stage.ready(force=True)         # stop: what is finished becomes visible

A revoke commits the finished prefix first (``closing`` + ``ready(force=True)``: still this member's
generation, so the next owner does not redo it), then the stage drops the partitions' records.

Failures -> what happens:

==========================================  ===========================================================
the transaction aborts / producer dies      the cycle rewinds the batch's partitions; ``failed`` drops
                                            the whole window and names the first offset of every partition
                                            it held; the loop rewinds them to the committed offsets (only
                                            Kafka knows whether an unknown-outcome commit made it)
revoke                                      finished prefix committed, then the partitions' records dropped
lost                                        dropped (their generations finishing later are ignored)
nothing committed for ``stall_s`` while      the stall rule of ``StreamLoop``: leave the group, rejoin
batches fail or a commit hangs              after the backoff
a fatal or authorization consumer error     raised from ``collect`` (``ConsumerFatal`` / ``NotAuthorized``)
crash                                       nothing uncommitted was visible; the next owner reads from the
                                            committed offsets
==========================================  ===========================================================
"""

from __future__ import annotations

from typing import Any, Protocol

from sie.streams.eos.ranges import TP
from sie.streams.eos.records import Output, Prepared


class WindowedProcessor(Protocol):
    """What a windowed stage does (module docstring); ``StreamLoop(window=...)`` does the rest."""

    def started(self, consumer: Any) -> None:
        """Once, after the consumer exists and before it subscribes."""

    def room(self, consumer: Any) -> tuple[int, float]:
        """Before each collect: how many records to take (>= 1) and how long to wait for the first one."""

    def accept(self, records: list[Any]) -> None:
        """The records just collected (maybe none): into the window; collect what finished meanwhile."""

    def ready(self, force: bool) -> list[Any]:
        """The records to commit now (the window's finished prefixes; ``[]``: none, or not due yet);
        ``force``: whatever is finished, due or not (stop, revoke)."""

    def prepare(self, batch: list[Any]) -> Prepared[Any]:
        """The outputs of the batch ``ready`` just returned (built as the records finished)."""

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        """The dead letter replacing ``output``, refused by the producer."""

    def failed(self) -> dict[TP, int]:
        """The batch did not commit: drop everything in flight; the first offset of each partition it held."""

    def closing(self) -> None:
        """Before a forced ``ready`` (stop, revoke): collect what finished since the last ``accept``."""

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions assigned in a rebalance (on the loop's thread, after the ``consume()`` that assigned them)."""

    def committed(self, value: Any, batch_size: int) -> None:
        """After the batch committed (its outputs are visible)."""

    def tick(self, consumer: Any) -> None:
        """Every ``tick_interval_s`` (lag gauges, ...)."""

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        """Partitions revoked (their finished prefix committed first) or lost."""
