"""Dead letters, written the same way by every stage: the source record's bytes and key unchanged, its
own headers (minus stale ``sie.*`` ones), and why and where it came from.

Headers every dead letter carries::

    sie.reason              machine-readable reason (invalid_json, schema_violation, too_large, ...)
    sie.detail              one line naming the field and the problem (at most 500 characters)
    sie.source.topic|partition|offset   where the original record is (it stays there: retrieval, redrive)

plus the stage's own (``sie.model``/``sie.version`` from the scorer, ``sie.connector`` from the CDC stage,
``sie.backfill.job`` from backfill).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DETAIL_MAX = 500


def short(text: str, limit: int = DETAIL_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dead_letter_headers(reason: str, detail: str, topic: str, partition: int, offset: int,
                        original: Iterable[tuple[str, Any]] | None = None,
                        extra: Iterable[tuple[str, bytes]] = ()) -> list[tuple[str, bytes]]:
    """Headers of a dead letter (module docstring)."""
    headers = [(k, v) for k, v in original if not k.startswith("sie.")] if original else []
    headers += [
        ("sie.reason", reason.encode()),
        ("sie.detail", short(detail).encode()),
        ("sie.source.topic", topic.encode()),
        ("sie.source.partition", str(partition).encode()),
        ("sie.source.offset", str(offset).encode()),
    ]
    headers.extend(extra)
    return headers


def produce_dead_letter(txn: Any, dlq_topic: str, msg: Any, reason: str, detail: str,
                        extra: Iterable[tuple[str, bytes]] = ()) -> None:
    """Queue ``msg``'s dead letter in the open transaction ``txn`` (a ``Checkpoint``)."""
    headers = dead_letter_headers(reason, detail, msg.topic(), msg.partition(), msg.offset(), msg.headers(), extra)
    txn.produce(dlq_topic, msg.value(), msg.key(), -1, headers)
