"""The control API's audit trail: one ``audit`` event per write, on the events topic, from a producer of its own.

Every write by an authenticated caller (applied, refused, forbidden) becomes a ``ControlEvent`` of kind
``audit`` (who, what, outcome, when).  Every part of it may carry text a caller chose, so control characters
are written escaped (``escape_text``): an audit line never forges a log line or a terminal sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


def escape_text(text: str) -> str:
    """``text`` with every control character (newline, escape, NUL, DEL, C1) written as its escape (``\\n``,
    ``\\x1b``): one line, never a forged log line or terminal sequence."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


class AuditLog:
    """Audit events (kind ``audit``) on the events topic: who did what to which model, the outcome, when.

    One idempotent producer per API (made on first use). A write is answered only after its audit
    record was acknowledged or failed; a failure is logged at ERROR (the spec itself is already on
    Kafka or refused, so the answer stays the truth).
    """

    def __init__(self, settings: Any, clock: Any = time.time, clients: Any = None) -> None:
        self._settings = settings
        self._clock = clock
        self._clients = clients
        self._producer: Any = None
        self._lock = threading.Lock()

    def record(self, principal: Any, action: str, model: str | None, outcome: str, client: str) -> None:
        from sie.kernel.clients import KafkaClients, idempotent_producer_config
        from sie.schemas.avro_codec import encode

        who = f"{principal.name} ({principal.role})" if principal is not None else "anonymous"
        # every part may carry text a caller chose (a path, a model name, a refusal quoting a spec): a newline or
        # an escape sequence would forge a log line or an event, so each control character is shown escaped
        detail = escape_text(f"{who} {action} {model or '-'}: {outcome}; from {client}")
        value = encode("ControlEvent", {"ts_ms": int(self._clock() * 1000), "kind": "audit", "model": model,
                                        "replica_id": None, "node": None, "detail": detail[:2000]})
        log.info("audit: %s", detail)
        try:
            with self._lock:
                if self._producer is None:
                    self._producer = (self._clients or KafkaClients()).producer(idempotent_producer_config(
                        self._settings, self._settings.names.control_audit_client_id, message_timeout_s=10))
                errors: list[str] = []
                self._producer.produce(self._settings.names.system_topic("events"), key=(model or "cluster").encode(),
                                       value=value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
                left = self._producer.flush(10)
            if left or errors:
                log.error("audit event not written (%s): %s", errors[:1] or "not acknowledged in 10 s", detail)
        except Exception:  # never let auditing turn an answered write into a 500
            log.exception("audit event not written: %s", detail)

    def close(self) -> None:
        """Flush and drop the producer (its threads stop with it)."""
        with self._lock:
            if self._producer is not None:
                self._producer.flush(5)
                self._producer = None
