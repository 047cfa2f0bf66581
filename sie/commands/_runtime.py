"""Process set-up shared by the long-running commands (`sie score`, `sie cdc run`, `sie backfill`).

Each of them logs to stderr in one format and turns SIGTERM/SIGINT into a
``threading.Event`` that its loop checks between batches: the current batch is
finished and committed, the consumer group left, and the command prints its summary.
Written once here so the three commands cannot drift apart.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log records at ``level`` (``debug``/``info``/``warning``/``error``) and above to stderr."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT)


def stop_on_signals(action: str = "finishing the current batch") -> threading.Event:
    """An event set by SIGTERM/SIGINT, which also print ``<SIGNAL>: <action>`` on stderr.

    Must be called from the main thread (Python only installs signal handlers there).
    """
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        click.echo(f"{signal.Signals(signum).name}: {action}", err=True)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
