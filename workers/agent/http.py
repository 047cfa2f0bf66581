"""The agent's HTTP port (``sie agent --metrics-port``): ``/metrics``, and its replicas' worker logs behind a
token, which the control API proxies (``GET /v1/replicas/{id}/log``, ``sie logs --control-url``: like ``kubectl
logs``, an operator reads a replica's log without a shell on its node).

    GET /metrics                                       Prometheus text; no token (scraped like every /metrics)
    GET /v1/replicas/<replica id>/log?lines=N&follow=0|1&previous=0|1
        Authorization: Bearer <an API token>           a token of the control plane's API (``SIE_API_TOKENS`` or the
                                                       tokens file, read as the control plane reads them; any role)
        -> 200 text/plain: the last N lines of ``<work dir>/<node>/<id>/worker.log`` (``previous``: of
           ``worker.previous.log``, the process before the last (re)start), then with ``follow`` what is appended,
           until the client goes away

The address is the heartbeat's ``metrics_address`` (the agent's advertised host and this port), so the control
plane finds it without a new field.  WHY the caller's own token, forwarded by the control plane: the control plane
keeps only hashes of tokens, and the agent then checks the same people the API does.

=====================================  ================================================
failure                                answer
=====================================  ================================================
no token, or one not known             401, ``WWW-Authenticate: Bearer``
a replica id that names no folder      400 (``check_replica_id``: never a path outside the work directory)
no log of that replica on this node    404 naming the replica and the node
any other path                         404
the client goes away while following   the stream ends (the write fails)
=====================================  ================================================
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

#: the current process's log and the one before the last (re)start (``launch.rotate_log``)
LOG_NAME, PREVIOUS_LOG_NAME = "worker.log", "worker.previous.log"
#: most lines one request returns before following
MAX_LINES = 10_000
#: how often a follower looks for appended bytes
FOLLOW_POLL_S = 0.25


def _gone(sock: Any) -> bool:
    """Whether the client closed its end (readable with nothing to read): a follower stops instead of waiting for a
    write to fail, which never comes while the log is quiet."""
    import select
    import socket

    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def rotate_log(directory: Path) -> None:
    """Keep the log of the process that ran before as ``worker.previous.log`` (``sie logs --previous``); the next
    process writes a fresh ``worker.log``."""
    current = directory / LOG_NAME
    try:
        if current.stat().st_size > 0:
            current.replace(directory / PREVIOUS_LOG_NAME)
    except FileNotFoundError:
        pass


class AgentHttp:
    """The server: ``start(port, host)`` returns the bound port; ``stop()`` closes it."""

    def __init__(self, node: str, work_dir: Path, render_metrics: Any, tokens: Any) -> None:
        self.node, self.work_dir = node, work_dir
        self._render_metrics, self._tokens = render_metrics, tokens
        self._server: ThreadingHTTPServer | None = None

    def start(self, port: int, host: str) -> int:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes: what a follower needs

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                log.debug("agent http: " + format, *args)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                owner.handle(self)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="sie-agent-http", daemon=True).start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- requests ------------------------------------------------------------------------------------------------

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        if url.path == "/metrics":
            self._send(req, 200, self._render_metrics(), "text/plain; version=0.0.4")
            return
        parts = url.path.split("/")
        if len(parts) != 5 or parts[:3] != ["", "v1", "replicas"] or parts[4] != "log":
            self._send(req, 404, b"no such path\n")
            return
        auth = req.headers.get("Authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if self._tokens.authenticate(token) is None:
            self._send(req, 401, b"a token of the control plane's API is required (Authorization: Bearer)\n",
                       extra={"WWW-Authenticate": "Bearer"})
            return
        from sie.kernel.errors import ConfigError
        from sie.kernel.names import check_replica_id

        replica = unquote(parts[3])
        try:
            check_replica_id(replica, "replica id")
        except ConfigError as exc:
            self._send(req, 400, f"{exc}\n".encode())
            return
        query = parse_qs(url.query)

        def flag(name: str) -> bool:
            return (query.get(name) or ["0"])[0].lower() in ("1", "true", "yes")

        try:
            lines = max(0, min(MAX_LINES, int((query.get("lines") or ["100"])[0])))
        except ValueError:
            self._send(req, 400, b"lines: a whole number\n")
            return
        path = self.work_dir / replica / (PREVIOUS_LOG_NAME if flag("previous") else LOG_NAME)
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            which = "log of a previous process" if flag("previous") else "log"
            self._send(req, 404, f"replica {replica} has no {which} on node {self.node}\n".encode())
            return
        with fh:
            tail = b"".join(deque(fh, maxlen=lines)) if lines else b""
            if not lines:
                fh.seek(0, 2)
            try:
                req.send_response(200)
                req.send_header("Content-Type", "text/plain; charset=utf-8")
                req.send_header("Cache-Control", "no-store")
                req.end_headers()
                req.wfile.write(tail)
                req.wfile.flush()
                while flag("follow"):
                    chunk = fh.read(65536)
                    if chunk:
                        req.wfile.write(chunk)
                        req.wfile.flush()
                    elif _gone(req.connection):
                        return
                    else:
                        time.sleep(FOLLOW_POLL_S)
            except (BrokenPipeError, ConnectionResetError):
                return

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              extra: dict[str, str] | None = None) -> None:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(body)
