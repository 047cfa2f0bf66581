"""Dead letters, written the same way by every stage, and always small enough to be written.

A dead letter is the source record's key and bytes unchanged, its own headers (minus stale ``sie.*`` ones),
and why and where it came from::

    sie.reason              machine-readable reason (invalid_json, schema_violation, too_large, ...)
    sie.detail              one line naming the field and the problem (at most 500 characters)
    sie.source.topic|partition|offset   where the original record is (it stays there: retrieval, redrive)

plus the stage's own tags (``sie.model``/``sie.version`` from the scorer, ``sie.connector`` from the CDC
stage, ``sie.backfill.job`` from backfill).

**It always fits.**  A dead letter that cannot be written would abort its batch, and the batch would come
back with the same record at its head, forever.  So a dead letter larger than the producer's
``message.max.bytes`` (``max_bytes``) is cut down before it is produced, in this order: the source's own
headers are dropped (``sie.headers.dropped``), then the value keeps only the prefix that fits
(``sie.truncated: value kept N of M bytes``), then the key too.  The ``sie.*`` headers (bounded) always
stay, so the source coordinates travel with it: the whole original can be read from the request topic.
``minimal`` is the last resort if the producer still refuses one (no value, no key, ``sie.*`` only).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sie.streams.eos.records import Headers, Output, safe_headers

DETAIL_MAX = 500
#: librdkafka's framing per record beyond key, value and header bytes (varints, attributes, header
#: counts, the record batch header shared by the batch): a generous bound, so "fits" is never optimistic
RECORD_OVERHEAD = 1024
#: ``Output.kind`` of a dead letter
DEAD_LETTER = "dead_letter"


def short(text: str, limit: int = DETAIL_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dead_letter_headers(reason: str, detail: str, topic: str, partition: int, offset: int,
                        original: Iterable[tuple[str, Any]] | None = None,
                        extra: Iterable[tuple[str, bytes]] = ()) -> Headers:
    """Headers of a dead letter (module docstring); ``original=None`` records that they were dropped."""
    headers: Headers = [(k, v) for k, v in original if not k.startswith("sie.")] if original else []
    headers += [
        ("sie.reason", reason.encode()),
        ("sie.detail", short(detail).encode()),
        ("sie.source.topic", topic.encode()),
        ("sie.source.partition", str(partition).encode()),
        ("sie.source.offset", str(offset).encode()),
    ]
    headers.extend(extra)
    if original is None:
        headers.append(("sie.headers.dropped", b"the source record's headers could not be decoded"))
    return headers


def dead_letter(dlq_topic: str, msg: Any, reason: str, detail: str, extra: Iterable[tuple[str, bytes]] = (),
                max_bytes: int | None = None) -> Output:
    """``msg``'s dead letter, cut down to fit ``max_bytes`` when given (module docstring)."""
    headers = dead_letter_headers(reason, detail, msg.topic(), msg.partition(), msg.offset(), safe_headers(msg),
                                  extra)
    out = Output(dlq_topic, msg.value(), msg.key(), -1, headers, msg, DEAD_LETTER)
    return out if max_bytes is None else fit(out, max_bytes)


def fit(out: Output, max_bytes: int) -> Output:
    """``out`` if it fits in ``max_bytes``, else a copy cut down as the module docstring says."""
    budget = max_bytes - RECORD_OVERHEAD
    if out.size() <= budget:
        return out
    headers = [(k, v) for k, v in out.headers or () if k.startswith("sie.")]
    if len(headers) != len(out.headers or ()):
        headers.append(("sie.headers.dropped", b"the source record's headers did not fit"))
    key, value = out.key, out.value
    fixed = Output(out.topic, None, None, out.partition, headers).size() + 200  # + the truncation note
    room = max(0, budget - fixed)
    if key is not None and len(key) > room // 2:  # a key may keep at most half of what is left
        headers.append(("sie.key.truncated", f"key kept {room // 2} of {len(key)} bytes".encode()))
        key = key[: room // 2]
    room -= len(key or b"")
    if value is not None and len(value) > room:
        headers.append(("sie.truncated", f"value kept {max(room, 0)} of {len(value)} bytes; the whole "
                                         f"record is at its source coordinates".encode()))
        value = value[: max(room, 0)]
    return Output(out.topic, value, key, out.partition, headers, out.source, out.kind)


def minimal(out: Output) -> Output:
    """The smallest form of a dead letter: no key, no value, only its bounded ``sie.*`` headers."""
    headers = [(k, v) for k, v in out.headers or () if k.startswith("sie.")]
    headers.append(("sie.truncated", b"value and key dropped: the producer refused the dead letter; the whole "
                                     b"record is at its source coordinates"))
    return Output(out.topic, None, None, -1, headers, out.source, DEAD_LETTER)
