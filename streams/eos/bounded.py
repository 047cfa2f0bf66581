"""Bounded, stop-aware waits on client calls that may block past their own timeout.

librdkafka calls take a timeout, but some block far longer while a coordinator
is down (adding offsets to a transaction, librdkafka #5456) and some take none
at all (``Consumer.close()``).  A loop that must keep recovering until the broker
is back, and must honour SIGTERM within seconds, cannot sit inside such a call.
``call_bounded`` runs the call on a daemon thread and waits at most ``limit_s``,
or until ``stop`` is set; an abandoned call keeps running on its own thread
(holding its client) and its outcome is discarded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

_TICK_S = 0.1  # how often a stop request is looked at while waiting


class CallAbandoned(Exception):
    """A bounded call was given up: it outlived ``limit_s`` (``stopped`` False) or a stop was requested."""

    def __init__(self, what: str, waited_s: float, stopped: bool) -> None:
        reason = "stop requested" if stopped else "no answer"
        super().__init__(f"{what}: {reason} after {waited_s:.0f}s")
        self.what = what
        self.waited_s = waited_s
        self.stopped = stopped


def call_bounded(fn: Callable[[], Any], what: str, limit_s: float, stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> Any:
    """``fn()``'s value (or its exception, re-raised here); ``CallAbandoned`` after ``limit_s`` or on ``stop``."""
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def target() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    started = clock()
    threading.Thread(target=target, name=f"bounded-{what}", daemon=True).start()
    deadline = started + limit_s
    while not done.is_set():
        left = deadline - clock()
        if left <= 0:
            raise CallAbandoned(what, clock() - started, stopped=False)
        if stop is not None and stop.is_set():
            raise CallAbandoned(what, clock() - started, stopped=True)
        done.wait(min(left, _TICK_S) if stop is not None else left)
    ok, value = outcome[0]
    if ok:
        return value
    raise value
