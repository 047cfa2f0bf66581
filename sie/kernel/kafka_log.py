"""librdkafka's own log lines, routed through Python logging (``sie.kafka``) instead of raw stderr.

Every client config built by ``Settings.kafka_client_config`` carries ``"logger": kafka_logger()``, so
a broker that cannot be reached shows up as records of the ``sie.kafka`` logger (formatted, filtered and
levelled like every other SIE log) and not as hundreds of ``%3|...|FAIL|`` lines on stderr.

WHY a de-duplicating filter: librdkafka repeats the same connect failure every reconnect backoff for
every client; one line per distinct message per minute says everything (the count of the ones held back
is added to the next line that passes); debug lines (SIE_KAFKA_DEBUG) pass unfiltered: they were asked for.
confluent-kafka hands each line to the logger as
``log(level, "%s [%s] %s", facility, client name, message)`` from the client's ``poll()``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

LOGGER_NAME = "sie.kafka"
_DIGITS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Passes the first record of each distinct message per ``window_s``; counts the ones it holds back.

    "Distinct" ignores numbers (``after 3ms``, ``#producer-7``): a reconnect loop is one message.
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 1000) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        #: distinct message -> (when it last passed, how many were held back since)
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:  # SIE_KAFKA_DEBUG's lines: asked for, every one of them kept
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        text = str(args[-1]) if args else record.getMessage()
        facility = str(args[0]) if len(args) >= 3 else ""
        key = (record.levelno, facility + " " + _DIGITS.sub("#", text))
        now = self._clock()
        last, held = self._seen.get(key, (None, 0))
        if last is not None and now - last < self.window_s:
            self._seen[key] = (last, held + 1)
            self.suppressed += 1
            return False
        if len(self._seen) >= self._max_keys:  # bounded: forget the oldest half
            for old in sorted(self._seen, key=lambda k: self._seen[k][0])[: self._max_keys // 2]:
                del self._seen[old]
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (%d similar line(s) held back)"
            record.args = (*args, held) if args else (held,)
        return True


def kafka_logger(debug: bool = False) -> logging.Logger:
    """The ``sie.kafka`` logger, with its repeat filter installed once.  ``debug`` (SIE_KAFKA_DEBUG set): the
    logger lets librdkafka's debug lines (syslog level 7, logged at DEBUG) through whatever level the command's
    logging set for it, so they reach the process's log."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    if debug and logger.level != logging.DEBUG:
        logger.setLevel(logging.DEBUG)
    return logger
