"""The bounded range of a backfill job: parsed bounds -> per-partition ``[start, end)`` offsets, stored once.

A backfill replays a *fixed* slice of the request topic.  The slice is decided when the job is first
started and written to the compacted plans topic (``<prefix>.backfill-plans``, key = job id); a resumed
job reads it back, so ``--to now`` means "the end offsets when the job began", not "whenever it resumes".

Bounds (``--from`` / ``--to``; the range is half-open, ``[from, to)``, on every partition):

* ISO-8601 time (``2024-03-01T00:00:00Z``; no zone = UTC) or epoch milliseconds (an integer with
  12+ digits, or with an ``ms`` suffix) -> ``offsets_for_times``: the first offset whose record timestamp
  is >= that time (none -> the partition's end);
* an offset (an integer below 12 digits) -> that offset on every partition;
* ``P:OFFSET,P:OFFSET`` -> per partition; partitions not listed are left out of the job;
* ``earliest`` (from) / ``now`` or ``latest`` (to) -> the low / high watermark at start.

Every bound is clamped into ``[low watermark, high watermark]`` taken at start.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from sie.kernel.clients import KafkaClients, idempotent_producer_config, state_reader_config
from sie.kernel.errors import ConfigError, KafkaUnavailable

_EPOCH_MS_DIGITS = 12  # 10**11 ms is 1973: a 12+ digit integer is a time, a shorter one an offset
_PER_PARTITION = re.compile(r"^\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*$")
PLANS_SUFFIX = "backfill-plans"


class BoundKind(str, enum.Enum):
    TIME = "time"  # value = epoch ms
    OFFSET = "offset"  # value = one offset for every partition
    PER_PARTITION = "per_partition"  # offsets = {partition: offset}
    EARLIEST = "earliest"
    NOW = "now"


@dataclass(frozen=True)
class Bound:
    """One parsed ``--from``/``--to`` value; ``text`` is what the user typed (kept in the plan)."""

    kind: BoundKind
    text: str
    value: int = 0
    offsets: tuple[tuple[int, int], ...] = ()


def parse_bound(text: str, what: str) -> Bound:
    """Parse a bound or raise ``ConfigError`` naming the option and the accepted forms."""
    raw = text.strip()
    low = raw.lower()
    if low in ("earliest", "beginning"):
        if what != "--from":
            raise ConfigError(f"{what}: 'earliest' is only valid for --from (use 'now' for the end)")
        return Bound(BoundKind.EARLIEST, raw)
    if low in ("now", "latest", "end"):
        if what != "--to":
            raise ConfigError(f"{what}: 'now' is only valid for --to (use 'earliest' for the start)")
        return Bound(BoundKind.NOW, raw)
    if _PER_PARTITION.fullmatch(raw):
        pairs = [part.split(":") for part in raw.split(",")]
        offsets = {int(p): int(o) for p, o in pairs}
        if len(offsets) != len(pairs):
            raise ConfigError(f"{what}: {raw!r} names a partition twice")
        return Bound(BoundKind.PER_PARTITION, raw, offsets=tuple(sorted(offsets.items())))
    digits = low[:-2] if low.endswith("ms") else low
    if digits.isdigit():
        number = int(digits)
        if low.endswith("ms") or len(digits) >= _EPOCH_MS_DIGITS:
            return Bound(BoundKind.TIME, raw, value=number)
        return Bound(BoundKind.OFFSET, raw, value=number)
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{what}: cannot read {raw!r}; use an ISO-8601 time (2024-03-01T00:00:00Z), epoch ms "
            f"(1709251200000 or 1709251200000ms), an offset (1500), per-partition offsets (0:1500,1:1730), "
            f"'earliest' (--from) or 'now' (--to)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return Bound(BoundKind.TIME, raw, value=int(parsed.timestamp() * 1000))


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition; ``end`` is exclusive."""

    partition: int
    start: int
    end: int

    @property
    def total(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class BackfillPlan:
    """What a job replays and where it writes; immutable once stored."""

    job_id: str
    model: str
    version: str
    source_topic: str
    output_topic: str
    dead_letter_topic: str
    range_from: str
    range_to: str
    ranges: tuple[PartitionRange, ...]
    created_ms: int

    @property
    def total(self) -> int:
        return sum(r.total for r in self.ranges)

    def range_of(self, partition: int) -> PartitionRange | None:
        for r in self.ranges:
            if r.partition == partition:
                return r
        return None

    def to_json(self) -> bytes:
        doc = {k: getattr(self, k) for k in ("job_id", "model", "version", "source_topic", "output_topic",
                                              "dead_letter_topic", "range_from", "range_to", "created_ms")}
        doc["ranges"] = [[r.partition, r.start, r.end] for r in self.ranges]
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, data: bytes) -> BackfillPlan:
        doc = orjson.loads(data)
        ranges = tuple(PartitionRange(int(p), int(s), int(e)) for p, s, e in doc.pop("ranges"))
        return cls(ranges=ranges, **doc)

    def conflicts(self, **wanted: Any) -> list[str]:
        """Fields where a resume's arguments differ from the stored plan (a job id names one range)."""
        return [f"{k}: stored {getattr(self, k)!r}, asked {v!r}" for k, v in wanted.items()
                if v is not None and getattr(self, k) != v]


def _bound_offsets(consumer: Any, topic: str, bound: Bound, watermarks: dict[int, tuple[int, int]],
                   is_end: bool, timeout: float) -> dict[int, int]:
    """Offset of ``bound`` on every partition (clamped to the watermarks); a left-out partition is absent."""
    from confluent_kafka import TopicPartition

    parts = sorted(watermarks)
    if bound.kind is BoundKind.EARLIEST:
        raw = {p: watermarks[p][0] for p in parts}
    elif bound.kind is BoundKind.NOW:
        raw = {p: watermarks[p][1] for p in parts}
    elif bound.kind is BoundKind.OFFSET:
        raw = {p: bound.value for p in parts}
    elif bound.kind is BoundKind.PER_PARTITION:
        unknown = sorted(set(dict(bound.offsets)) - set(parts))
        if unknown:
            raise ConfigError(f"{'--to' if is_end else '--from'} {bound.text!r}: {topic} has no partition(s) "
                              f"{unknown} (it has {len(parts)})")
        raw = dict(bound.offsets)
    else:
        found = consumer.offsets_for_times([TopicPartition(topic, p, bound.value) for p in parts], timeout=timeout)
        raw = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaUnavailable(f"offsets_for_times {topic}[{tp.partition}]: {tp.error}")
            # -1: no record at or after the time -> the partition's end (empty if it is the start)
            raw[tp.partition] = tp.offset if tp.offset >= 0 else watermarks[tp.partition][1]
    return {p: min(max(o, watermarks[p][0]), watermarks[p][1]) for p, o in raw.items()}


def resolve_ranges(consumer: Any, topic: str, start: Bound, end: Bound, timeout: float = 30.0,
                   config: dict[str, Any] | None = None) -> tuple[PartitionRange, ...]:
    """Per-partition ``[start, end)`` from the live topic (watermarks taken now, once).  ``config``: the
    consumer's, to name its principal when the topic is not its to read (``NotAuthorized``)."""
    from sie.kernel.authz import topic_partitions

    partitions = topic_partitions(consumer, topic, config or {}, "READ", timeout)
    if partitions is None:
        raise ConfigError(f"source topic {topic!r} does not exist on the cluster; pass --source-topic or check "
                          f"the model's spec.topics.requests")
    from confluent_kafka import TopicPartition

    watermarks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                  for p in partitions}
    starts = _bound_offsets(consumer, topic, start, watermarks, False, timeout)
    ends = _bound_offsets(consumer, topic, end, watermarks, True, timeout)
    ranges = []
    for p in sorted(watermarks):
        if p not in starts or p not in ends:
            continue  # per-partition bounds name only some partitions: the others are not part of the job
        s, e = starts[p], ends[p]
        ranges.append(PartitionRange(p, s, max(s, e)))
    return tuple(ranges)


# --- the plans topic --------------------------------------------------------------------------------------
# Each function takes ``clients`` (``sie.kernel.clients.KafkaClients``), so a job handed fake clients reads and
# writes its plan through them too; None = the real librdkafka clients.
def plans_topic(settings: Any) -> str:
    return str(settings.names.system_topic(PLANS_SUFFIX))


def ensure_plans_topic(settings: Any, clients: KafkaClients | None = None) -> str:
    """Make the plans topic exist as the system topic catalogue (``sie.kernel.topics``) describes it."""
    from sie.kernel.admin import ensure_topics
    from sie.kernel.topics import system_topics

    name = plans_topic(settings)
    ensure_topics(settings, [t for t in system_topics(settings.topic_prefix) if t.name == name], clients=clients)
    return name


def read_plan(settings: Any, job_id: str, timeout: float = 30.0,
              clients: KafkaClients | None = None) -> BackfillPlan | None:
    """The stored plan of ``job_id`` (latest record of that key), or None: the plans topic read to its end
    (``sie.kernel.replay``: past the transaction markers and aborted records a log can end on)."""
    from sie.kernel.replay import read_to_end

    names = settings.names
    topic = plans_topic(settings)
    consumer = (clients or KafkaClients()).consumer(state_reader_config(
        settings, names.reader_group(PLANS_SUFFIX, job_id), names.backfill_client_id(job_id, "plan-reader")))
    found: list[bytes | None] = [None]
    wanted = job_id.encode()

    def see(msg: Any) -> None:
        if msg.key() == wanted:
            found[0] = msg.value()

    try:
        read_to_end(consumer, topic, see, timeout_s=timeout, missing_ok=True)  # no topic yet: no plan yet
    finally:
        consumer.close()
    return None if found[0] is None else BackfillPlan.from_json(found[0])


def write_plan(settings: Any, plan: BackfillPlan, timeout: float = 30.0, clients: KafkaClients | None = None) -> None:
    """Store the plan (acks=all; waits for the broker) before the job scores anything."""
    producer = (clients or KafkaClients()).producer(idempotent_producer_config(
        settings, settings.names.backfill_client_id(plan.job_id, "plan-writer")))
    errors: list[str] = []
    producer.produce(plans_topic(settings), plan.to_json(), plan.job_id.encode(),
                     on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    if producer.flush(timeout) or errors:
        raise KafkaUnavailable(f"storing the plan of backfill job {plan.job_id}: {errors or 'not delivered'}; "
                               f"check the broker at {settings.bootstrap_servers}")
