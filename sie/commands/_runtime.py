"""Process set-up shared by the commands: exit codes, logging, the Kafka preflight, clean stops.

The long-running commands (`sie score`, `sie cdc run`, `sie backfill`, `sie agent`, `sie control`) log to
stderr in one format and turn SIGTERM/SIGINT into a ``threading.Event`` that their loop checks between
batches: the current batch is finished and committed, the consumer group left, and the command prints its
summary.  One-shot commands print no logs of librdkafka (``sie.kafka``) unless ``sie -v``: their own
one-line error says what is wrong.  Every command that needs Kafka calls ``require_kafka`` first, so an
unreachable cluster is one line within ``SIE_CONNECT_TIMEOUT_S`` (5 s), never a long wait and a traceback.
Written once here so the commands cannot drift apart.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from sie.kernel.logs import quiet_http_logs

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: exit codes, the same for every command (sie/cli.py lists them)
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 3
EXIT_PARTIAL = 4


def configure_logging(level: str) -> None:
    """Log records at ``level`` (``debug``/``info``/``warning``/``error``) and above to stderr; librdkafka's
    own lines (``sie.kafka``) from ``warning`` up (its info lines are noise to an operator)."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    logging.getLogger("sie.kafka").setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    quiet_http_logs(level)


def quiet_kafka_logs(verbose: bool) -> None:
    """One-shot commands: librdkafka's lines only with ``sie -v`` (then with SIE's info logs)."""
    if verbose:
        configure_logging("info")
    else:
        logging.getLogger("sie.kafka").setLevel(logging.CRITICAL + 1)


def require_kafka(settings: object) -> None:
    """Fail with one line (``KafkaUnavailable``, exit 1) unless Kafka answers within ``connect_timeout_s``."""
    from sie.kernel.admin import require_cluster

    require_cluster(settings)  # type: ignore[arg-type]


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
