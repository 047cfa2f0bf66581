"""Request parsing and result / dead-letter building: the scorer's wire contract.

One ``Codec`` per scorer holds everything per-message work needs (the compiled
input validator, limits, the model name) so the hot path is a handful of C
calls (orjson) and dict operations, with no per-message configuration lookups.
``docs/scoring.md`` is the user-facing description of this contract.

Request value (UTF-8 JSON object)::

    {"id": "r-1", "inputs": {...}, "metadata": {...}, "<any other key>": ...}

* ``inputs`` (object, required) is validated against the spec's input schema.
* ``id`` (string or integer, optional) defaults to ``<topic>:<partition>:<offset>``,
  which is deterministic, so a re-read record gets the same id.
* Every other top-level key (``metadata`` is the conventional one) is copied
  unchanged into the result, except the names the result itself uses
  (``RESERVED``), which make the request a ``schema_violation``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

import orjson

from sie.streams.eos.deadletter import short
from sie.streams.scorer.errors import DeadLetterReason

RESERVED = frozenset({"model", "version", "status", "outputs", "source", "timings", "error"})
_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}


class Request:
    """One valid request of a batch: where it came from and what to score."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "timestamp_ms", "id", "inputs", "extra")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes,
                 timestamp_ms: int | None, request_id: str, inputs: dict, extra: dict | None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.timestamp_ms = timestamp_ms
        self.id = request_id
        self.inputs = inputs
        self.extra = extra


@final
@dataclass(frozen=True)
class Poison:
    """A record that can't be scored: it goes to the dead-letter topic with this reason and detail."""

    reason: DeadLetterReason
    detail: str


def default_id(topic: str, partition: int, offset: int) -> str:
    """Id of a request that has none: unique and stable across re-reads of the same record."""
    return f"{topic}:{partition}:{offset}"


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)


def _depth_exceeds(obj: Any, limit: int) -> int:
    """Nesting depth of ``obj`` if it exceeds ``limit``, else 0 (iterative: no recursion on hostile input)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return depth
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return 0


class Codec:
    """Parses request records and builds result values and dead-letter headers for one model."""

    def __init__(self, model: str, validate: Callable[[dict], dict], max_request_bytes: int,
                 max_json_depth: int) -> None:
        self.model = model
        self._model_b = model.encode()
        self._validate = validate
        self._max_bytes = max_request_bytes
        self._max_depth = max_json_depth

    # --- requests ---------------------------------------------------------------
    def parse(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
              timestamp_ms: int | None) -> Request | Poison:
        """A valid ``Request`` or the ``Poison`` verdict naming the field and the problem."""
        if not value:
            return Poison(DeadLetterReason.INVALID_JSON, "value: empty (null or zero bytes); expected a JSON object")
        if len(value) > self._max_bytes:
            return Poison(DeadLetterReason.TOO_LARGE,
                          f"value: {len(value)} bytes > max_request_bytes {self._max_bytes}")
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError as exc:  # also NaN/Infinity, invalid UTF-8, truncated input
            return Poison(DeadLetterReason.INVALID_JSON, short(f"value: not valid JSON ({exc})"))
        if type(doc) is not dict:
            return Poison(DeadLetterReason.SCHEMA_VIOLATION,
                          f"request: must be a JSON object (got {_json_type(doc)})")
        if value.count(b"{") + value.count(b"[") > self._max_depth:  # cheap pre-check, exact check if needed
            depth = _depth_exceeds(doc, self._max_depth)
            if depth:
                return Poison(DeadLetterReason.SCHEMA_VIOLATION,
                              f"request: nested {depth}+ levels deep > max_json_depth {self._max_depth}")
        inputs = doc.pop("inputs", None)
        if type(inputs) is not dict:
            got = "missing" if inputs is None and "inputs" not in doc else f"got {_json_type(inputs)}"
            return Poison(DeadLetterReason.SCHEMA_VIOLATION, f"inputs: required JSON object ({got})")
        raw_id = doc.pop("id", None)
        if raw_id is None:
            request_id = default_id(topic, partition, offset)
        elif type(raw_id) is str and raw_id:
            request_id = raw_id
        elif type(raw_id) is int:
            request_id = str(raw_id)
        else:
            return Poison(DeadLetterReason.SCHEMA_VIOLATION,
                          f"id: must be a non-empty string or an integer (got {short(repr(raw_id))})")
        if doc:
            clash = RESERVED.intersection(doc)
            if clash:
                name = sorted(clash)[0]
                return Poison(DeadLetterReason.SCHEMA_VIOLATION,
                              f"request.{name}: reserved for the result; put it under metadata")
        try:
            clean = self._validate(inputs)
        except Exception as exc:  # SchemaViolation names the field; anything else is still the input's fault
            return Poison(DeadLetterReason.SCHEMA_VIOLATION, short(str(exc) or type(exc).__name__))
        return Request(topic, partition, offset, key, value, timestamp_ms, request_id, clean, doc or None)

    # --- results ----------------------------------------------------------------
    def result(self, req: Request, version: str, outputs: Any, queue_ms: float, inference_ms: float,
               batch_size: int) -> bytes:
        """The ``status: ok`` result value; raises TypeError if ``outputs`` is not JSON-serialisable."""
        doc = {
            "id": req.id,
            "model": self.model,
            "version": version,
            "status": "ok",
            "outputs": outputs,
            "source": {"topic": req.topic, "partition": req.partition, "offset": req.offset},
            "timings": {"queue_ms": round(queue_ms, 3), "inference_ms": round(inference_ms, 3),
                        "batch_size": batch_size},
        }
        if req.extra:
            doc.update(req.extra)
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)

    def expired(self, req: Request, version: str, queue_ms: float, max_queue_ms: float) -> bytes:
        """The ``status: expired`` result: the caller gets an answer instead of silence."""
        doc = {
            "id": req.id,
            "model": self.model,
            "version": version,
            "status": "expired",
            "outputs": None,
            "error": f"queued {queue_ms:.0f} ms > sla.max_queue_time_ms {max_queue_ms:g}",
            "source": {"topic": req.topic, "partition": req.partition, "offset": req.offset},
            "timings": {"queue_ms": round(queue_ms, 3), "inference_ms": 0.0, "batch_size": 0},
        }
        if req.extra:
            doc.update(req.extra)
        return orjson.dumps(doc)

    # --- dead letters -------------------------------------------------------------
    def dead_letter_tags(self, version: str) -> list[tuple[str, bytes]]:
        """The scorer's own dead-letter headers (the common ones come from ``sie.streams.eos.deadletter``)."""
        return [("sie.model", self._model_b), ("sie.version", version.encode())]
