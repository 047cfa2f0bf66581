"""Read a topic to its end: the one way SIE replays compacted state and waits for what was committed.

Every reader of a compacted or transactional topic asks the same question, "have I read everything that was
there when I started?" (the spec store, a new leader's epoch, the rollouts it resumes, an agent's assignments,
the control plane's state, ``sie tail``, a backfill's plan).  The answer is per partition::

    ends   = the high watermark of each partition now           (end_offsets: read_committed -> the last
                                                                  stable offset; transient refusals retried)
    assign every partition from the beginning                    (catch-up; a read barrier keeps the
                                                                  consumer where it is)
    until every partition's reached >= its end:                  (ReadProgress)
        poll -> a record: hand it on; reached = offset + 1
             -> end-of-partition event: reached = its offset    (lies past a trailing transaction marker)
        reached = max(reached, position())                       (passes markers and aborted records too)
        past the deadline -> NotReadToEnd naming the topic, the partitions short of their end and the fix

WHY "position >= end", never "the last record's offset + 1 == end": offsets also number transaction markers
(one per partition per committed or aborted transaction) and the records of aborted transactions, which a
``read_committed`` reader never sees.  A log that ends on a commit marker has its end one past the last
record; one that ends on an aborted transaction, several past it.  A reader waiting for a record at
``end - 1`` waits forever (or until its deadline, failing a read that was complete).

Two uses:

* **catch up** (``read_to_end``): assign every partition of a topic from the beginning, read to the ends taken
  at start, hand each record to a callback, done.  The reader may go on reading incrementally afterwards (the
  agent, the state feeder keep their consumer and use ``end_offsets`` + ``ReadProgress`` in their own loops).
* **read barrier** (``read_to_end(..., assign=False)``): the consumer is already positioned (a group member
  holding its partition); "everything committed before now" is the ends taken now.  The leader's election
  and the state feeder's ``ReadBarrier`` are this.

Failures:
| what | what the helper does |
|---|---|
| a broker refuses the ends (``NOT_LEADER_FOR_PARTITION``, ``UNKNOWN_TOPIC_OR_PART`` on a topic created a moment ago, a timeout) | retried with backoff until the deadline, then ``NotReadToEnd`` naming the topic and the last refusal |
| the topic does not exist | ``NotReadToEnd`` naming it and ``sie topics ensure``; ``missing_ok`` reads nothing |
| a non-fatal consumer error while reading (a broker restarting) | logged (or the caller's ``on_error``); librdkafka retries the fetch |
| a fatal consumer error, or the topic not ours to read | raised: ``KafkaUnavailable`` naming the topic |
| the ends not reached by the deadline | ``NotReadToEnd``: topic, partitions ``read up to/end``, the fix |
| the caller's ``keep_going()`` turns false (stopped, lost the partition) | ``False``: nothing is raised |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sie.kernel.consumer import ConsumedRecord, KafkaConsumer
from sie.kernel.errors import KafkaUnavailable

log = logging.getLogger("sie.replay")

#: (topic, partition)
Key = tuple[str, int]

#: records handed out per ``consume()`` call
_BATCH = 500
#: one poll's wait: bounds how late a deadline or ``keep_going`` is noticed
_POLL_S = 0.2
#: the longest one ListOffsets request may wait for its answer
_REQUEST_S = 10.0
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0


class NotReadToEnd(KafkaUnavailable):
    """A topic could not be read to the end it had when the read started (or its end could not be asked)."""

    def __init__(self, topic: str, why: str, short: dict[Key, tuple[int, int]] | None = None) -> None:
        self.topic = topic
        self.short = dict(short or {})
        where = ""
        if self.short:
            shown = ", ".join(f"{t}[{p}] at {at} of {end}" for (t, p), (at, end) in sorted(self.short.items())[:5])
            where = f" (read up to/end: {shown}{' ...' if len(self.short) > 5 else ''})"
        super().__init__(f"{topic}: {why}{where}; check that its brokers are up and each partition has a leader "
                         f"(`sie topics list`), then try again")


def _error_text(exc: BaseException) -> str:
    first = exc.args[0] if exc.args else exc
    text = first.str() if hasattr(first, "str") else str(first)
    return str(text)


def _retriable(exc: BaseException) -> bool:
    """A refusal that goes away by itself: a leader moving or not elected yet, a fresh topic's metadata, a
    timeout.  Fatal or authorization errors are not."""
    from confluent_kafka import KafkaError

    first = exc.args[0] if exc.args else None
    if not isinstance(first, KafkaError):
        return False
    if first.fatal() or first.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                         KafkaError.GROUP_AUTHORIZATION_FAILED,
                                         KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
        return False
    return True


def partitions_of(consumer: KafkaConsumer, topic: str, timeout_s: float) -> list[int] | None:
    """The topic's partitions, or None where the cluster does not know it."""
    meta = consumer.list_topics(topic, timeout=max(0.5, timeout_s)).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    return sorted(meta.partitions)


def watermarks(consumer: KafkaConsumer, keys: Iterable[Key], *, timeout_s: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], Any] = time.sleep) -> dict[Key, tuple[int, int]]:
    """``(topic, partition) -> (low, end)`` now as ``consumer`` reads it: the end is the high watermark, or with
    read_committed the last stable offset (the broker answers for the consumer's isolation level, so the records
    of a transaction still open lie beyond it and are not waited for).  Transient refusals are retried until
    ``timeout_s``, then ``NotReadToEnd`` naming the topic.  ``timeout_s=0``: one try (up to 10 s a partition),
    its ``KafkaException`` raised, for a caller that retries itself (``sie.kernel.startup.retry_until_answered``)."""
    from confluent_kafka import KafkaException, TopicPartition

    wanted = sorted(set(keys))
    deadline = clock() + timeout_s
    backoff = _FIRST_BACKOFF_S
    out: dict[Key, tuple[int, int]] = {}
    while True:
        try:
            for key in wanted:
                if key not in out:
                    # each request waits up to 10 s (one try: its whole 10 s), never past the deadline
                    left = _REQUEST_S if timeout_s <= 0 else max(0.5, min(_REQUEST_S, deadline - clock()))
                    low, high = consumer.get_watermark_offsets(TopicPartition(*key), timeout=left, cached=False)
                    out[key] = (int(low), int(high))
            return out
        except KafkaException as exc:
            if timeout_s <= 0:
                raise
            missing = [k for k in wanted if k not in out]
            topic = missing[0][0] if missing else "?"
            if not _retriable(exc):
                raise NotReadToEnd(topic, f"its end offsets were refused ({_error_text(exc)})") from None
            if clock() + backoff > deadline:
                raise NotReadToEnd(topic, f"no end offsets within {timeout_s:g}s (last refusal: "
                                          f"{_error_text(exc)})") from None
            log.info("end offsets of %s refused (%s); trying again in %.1fs", topic, _error_text(exc), backoff)
            sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)


def end_offsets(consumer: KafkaConsumer, keys: Iterable[Key], *, timeout_s: float = 10.0,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], Any] = time.sleep) -> dict[Key, int]:
    """``(topic, partition) -> its end now`` (``watermarks``' second half): what a read barrier waits for."""
    return {key: end for key, (_low, end) in watermarks(consumer, keys, timeout_s=timeout_s, clock=clock,
                                                         sleep=sleep).items()}


class ReadProgress:
    """How far each partition was read, against the ends to reach (see the module docstring for why the
    position, not the last record, decides).  ``reached[key]``: the offset read up to (the next to read)."""

    @classmethod
    def from_beginning(cls, marks: dict[Key, tuple[int, int]]) -> ReadProgress:
        """A read that starts at each partition's low watermark (``watermarks``) and ends at its end."""
        return cls({k: end for k, (_low, end) in marks.items()}, {k: low for k, (low, _end) in marks.items()})

    def __init__(self, ends: dict[Key, int], reached: dict[Key, int] | None = None) -> None:
        self.ends = dict(ends)
        self.reached: dict[Key, int] = dict(reached or {})

    def see(self, msg: ConsumedRecord) -> bool:
        """Advance by one polled message; True if it is a record.  An end-of-partition event carries the
        offset the fetcher reached; other errors are left to the caller (False)."""
        from confluent_kafka import KafkaError

        key = (msg.topic(), msg.partition())
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self.reached[key] = max(self.reached.get(key, 0), msg.offset())
            return False
        self.reached[key] = max(self.reached.get(key, 0), msg.offset() + 1)
        return True

    def check_positions(self, consumer: KafkaConsumer) -> None:
        """Advance the partitions still short by the consumer's position (local, no request): it passes
        transaction markers and aborted records that no record or event shows."""
        from confluent_kafka import TopicPartition

        short = sorted(self.short())
        if not short:
            return
        for tp in consumer.position([TopicPartition(*key) for key in short]):
            if tp.offset >= 0:
                key = (tp.topic, tp.partition)
                self.reached[key] = max(self.reached.get(key, 0), tp.offset)

    def short(self) -> dict[Key, tuple[int, int]]:
        """``key -> (read up to, end)`` for every partition not yet read to its end."""
        return {key: (self.reached.get(key, 0), end) for key, end in self.ends.items()
                if self.reached.get(key, 0) < end}

    @property
    def done(self) -> bool:
        return not self.short()


def read_to_end(consumer: KafkaConsumer, topic: str, on_record: Callable[[ConsumedRecord], None], *, timeout_s: float = 30.0,
                partitions: Sequence[int] | None = None, assign: bool = True,
                start: Callable[[int, int], int] | None = None, missing_ok: bool = False,
                keep_going: Callable[[], bool] = lambda: True,
                on_error: Callable[[ConsumedRecord], None] | None = None,
                clock: Callable[[], float] = time.monotonic) -> bool:
    """Read ``topic`` (every partition, or ``partitions``) to the end it has now; each record to
    ``on_record`` in log order per partition.  True once read; False if ``keep_going()`` turned false first.

    ``assign=True`` (catch up): the partitions are assigned from the beginning, or from ``start(low, end)``
    (``sie tail``: the last N).  ``assign=False`` (read barrier): the consumer already holds them where it
    is.  ``partitions`` defaults to every partition of the topic (``missing_ok``: a topic that does not exist
    reads as empty).  ``on_error``: what to do with a non-fatal consumer error (it may raise; default: log
    it; an authorization error raises).  The deadline covers the whole read, the end offsets included
    (``NotReadToEnd``)."""
    from confluent_kafka import KafkaError, TopicPartition

    deadline = clock() + timeout_s
    if partitions is None:
        found = partitions_of(consumer, topic, min(10.0, timeout_s))
        if found is None:
            if missing_ok:
                return True
            raise NotReadToEnd(topic, "the topic does not exist (create it: `sie topics ensure`)")
        partitions = found
    keys = [(topic, p) for p in partitions]
    marks = watermarks(consumer, keys, timeout_s=max(0.001, deadline - clock()), clock=clock)
    if assign:
        # nothing below the low watermark is there to read: a partition starts as read up to where it starts
        first = {k: max(low, min(end, start(low, end))) if start is not None else low for k, (low, end) in marks.items()}
        consumer.assign([TopicPartition(t, p, first[(t, p)]) for t, p in keys])
        progress = ReadProgress({k: end for k, (_low, end) in marks.items()}, first)
    else:
        progress = ReadProgress({k: end for k, (_low, end) in marks.items()})
    while keep_going():
        progress.check_positions(consumer)
        if progress.done:
            return True
        if clock() >= deadline:
            raise NotReadToEnd(topic, f"not read to its end within {timeout_s:g}s", progress.short())
        for msg in consumer.consume(_BATCH, _POLL_S):
            error = msg.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                if error.fatal():
                    raise KafkaUnavailable(f"reading {topic}: {error.str()}")
                if on_error is not None:
                    on_error(msg)
                elif error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise KafkaUnavailable(f"reading {topic}: {error.str()} (this principal may not read it: "
                                           f"grant READ, see `sie acls`)")
                else:
                    log.warning("reading %s: %s", topic, error.str())
                continue
            if progress.see(msg):
                on_record(msg)
    return False
