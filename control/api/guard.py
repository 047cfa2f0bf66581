"""The control API's guards against slow and oversized requests, below the routes.

* ``RequestGuard`` (ASGI middleware): the body size cap enforced while reading (not only from
  Content-Length), a deadline for the body (an idle limit for artifact uploads), a request path with a
  control character refused, and a 500 without internals for anything a route did not handle.
* ``guarded_h11``: uvicorn's h11 protocol plus a deadline for a request's headers (slowloris), which
  uvicorn itself lacks.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

log = logging.getLogger(__name__)

#: seconds a client has to send a request's headers (from connect, or from the previous response)
HEADER_TIMEOUT_S = 10.0


class _BodyTooLarge(Exception):
    pass


class _BodyTimeout(Exception):
    pass


class RequestGuard:
    """ASGI middleware: body size cap (Content-Length and bytes actually read), body deadline, and a
    500 without internals for anything a route did not handle (the traceback goes to the log with a
    reference the answer quotes)."""

    def __init__(self, app: Any, max_body: int, body_timeout_s: float,
                 large_bodies: tuple[str, int] | None = None) -> None:
        self.app = app
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        #: (path prefix, cap): PUTs under it may send bodies up to cap, with an idle limit instead of a deadline
        self.large_bodies = large_bodies

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def reply(status: int, error: str) -> None:
            from starlette.responses import JSONResponse

            if not started:
                await JSONResponse({"error": error, "errors": []}, status_code=status,
                                   headers={"Connection": "close"})(scope, receive, send)

        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in str(scope.get("path", ""))):
            # %0a, %1b ... decoded into a path parameter would reach the audit event and the log: refused, not echoed
            await reply(400, "the request path holds a control character")
            return
        large = (self.large_bodies is not None and scope.get("method") == "PUT"
                 and str(scope.get("path", "")).startswith(self.large_bodies[0]))
        max_body = self.large_bodies[1] if large and self.large_bodies is not None else self.max_body
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body):
            await reply(413, f"body larger than {max_body} bytes")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        received = 0

        async def guarded_receive() -> Any:
            nonlocal received
            wait = self.body_timeout_s if large else max(0.001, deadline - loop.time())
            try:
                message = await asyncio.wait_for(receive(), timeout=wait)
            except TimeoutError:
                raise _BodyTimeout() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracking_send)
        except _BodyTooLarge:
            await reply(413, f"body larger than {max_body} bytes")
        except _BodyTimeout:
            await reply(408, f"body not received within {self.body_timeout_s:g} s")
        except Exception:
            ref = uuid.uuid4().hex[:12]
            log.exception("control API: %s %s failed (ref %s)", scope.get("method"), scope.get("path"), ref)
            await reply(500, f"internal error (ref {ref}); the control plane's log has the details")


def _no_delay(transport: Any) -> None:
    """TCP_NODELAY on an accepted connection: h11 writes a response's headers and its body separately, and with
    Nagle's algorithm on the body waited for the ACK of the headers, which the client delays by up to 40 ms: every
    request after the first on a kept-alive connection (the status page's, a script's) took 40 ms more."""
    import socket

    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # a connection already reset: nothing to speed up
            pass


def guarded_h11() -> Any:
    """uvicorn's h11 protocol plus a deadline for a request's headers: uvicorn itself waits forever for
    the first request of a connection, so a client sending nothing (or a byte a minute) would hold a
    connection slot for good; and TCP_NODELAY on each connection (``_no_delay``)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            _no_delay(transport)
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            handle = getattr(self, "_header_deadline", None)
            if handle is not None:
                handle.cancel()
            self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_overdue)

        def _headers_overdue(self) -> None:
            # IDLE: the client has not finished a request's headers since the deadline was armed
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            handle = getattr(self, "_header_deadline", None)
            if handle is not None:
                handle.cancel()
            super().connection_lost(exc)

    return GuardedH11Protocol
