"""Levels of the loggers of libraries SIE uses, set once by every entry point (the CLI and the worker process)."""

from __future__ import annotations

import logging


def quiet_http_logs(level: str) -> None:
    """httpx writes an INFO line per request (``HTTP Request: POST ... "HTTP/1.1 200 OK"``): one per LLM
    generation.  Its lines (and httpcore's) from ``warning`` up unless ``level`` is ``debug``."""
    floor = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(floor)
