"""The status pipe between the node agent and the processes it runs (a model's worker, a connector's stage).

One JSON object per line on the fd the agent names with ``--status-fd`` (``sie.workers.process``); what
each event means is listed in ``sie.workers.worker_main``.  It lives with the contracts because both kinds
of replica process write it: ``sie.workers.worker_main`` and ``sie.connectors.worker``.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, TextIO

log = logging.getLogger("sie.worker")


class StatusWriter:
    """Writes status lines to the agent (or to the log, when run by hand without --status-fd)."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        if self._stream is None:
            log.info("status %s %s", event, fields)
            return
        line = json.dumps({"event": event, **fields}, default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, OSError):
                pass  # the agent is gone; PDEATHSIG will end us
