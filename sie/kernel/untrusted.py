"""Walking and showing values that came from outside (records, specs, keys): bounded and non-recursive.

Python's own tools are unsafe on hostile data: ``repr``/``str``/``==`` recurse through nested containers
and raise ``RecursionError`` near 1,000 levels (orjson parses up to 1,024), ``str(int)`` refuses more than
4,300 digits, and the ``repr`` of a 10 MB string is 10 MB.  So a value read from a record reaches an error
message only through ``preview`` (bounded text, never recursive), and parsed JSON is bounded with
``depth_exceeds`` (iterative) before anything else walks it.
"""

from __future__ import annotations

from typing import Any

PREVIEW_LIMIT = 60
_BIG_INT_BITS = 200  # ~60 decimal digits: larger integers are described, not printed


def depth_exceeds(obj: Any, limit: int) -> int:
    """Nesting depth of ``obj`` (JSON dicts and lists) if it exceeds ``limit``, else 0.

    Iterative, and it stops at the first container deeper than ``limit``, so a hostile document costs
    at most one visit per container it holds up to that depth.  A scalar has depth 0."""
    if type(obj) is not dict and type(obj) is not list:
        return 0
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return depth
        children = node.values() if type(node) is dict else node
        for child in children:
            t = type(child)
            if t is dict or t is list:
                stack.append((child, depth + 1))
    return 0


def json_text_depth_exceeds(text: bytes | str, doc: Any, limit: int) -> int:
    """``depth_exceeds(doc, limit)`` for ``doc`` parsed from ``text``, with the scorer codec's cheap
    pre-check: a document with at most ``limit`` opening brackets cannot be deeper than ``limit``."""
    if type(doc) is not dict and type(doc) is not list:
        return 0
    if isinstance(text, str):
        opening = text.count("{") + text.count("[")
    else:
        opening = text.count(b"{") + text.count(b"[")
    if opening <= limit:
        return 0
    return depth_exceeds(doc, limit)


def preview(value: Any, limit: int = PREVIEW_LIMIT) -> str:
    """A short, safe text of ``value`` for an error message: scalars as ``repr`` (strings and bytes cut
    at ``limit`` characters before quoting), huge integers by their size, containers by type and length."""
    if value is None or value is True or value is False or type(value) is float:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > _BIG_INT_BITS:
            digits = int(value.bit_length() * 0.30103) + 1
            return f"{'-' if value < 0 else ''}<integer of ~{digits} digits>"
        return repr(int(value))
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, (bytes, bytearray, memoryview)):
        head = bytes(value[:limit])
        return repr(head) + ("..." if len(value) > limit else "")
    if isinstance(value, dict):
        return f"an object of {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__}"


def exception_text(exc: BaseException, limit: int = 200, with_type: bool = True) -> str:
    """``"<Type>: <message>"`` (or the message alone) of an exception, bounded; never raises (a message
    may embed user data, and ``str`` of an exception may itself fail).  The type is always there when
    the message is empty."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not turn a dead letter into a crash
        message = ""
    if len(message) > limit:
        message = message[: limit - 3] + "..."
    if not message:
        return type(exc).__name__
    return f"{type(exc).__name__}: {message}" if with_type else message
