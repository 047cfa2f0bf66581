"""The control API's server: uvicorn serving the app from a daemon thread of ``sie control``.

The socket is bound in ``ApiServer.start``, in the caller's thread, so a port in use fails there with the
address in the message; uvicorn bounds concurrency (``MAX_CONCURRENCY``: 503 beyond), header size and
keep-alive, and serves HTTPS when a certificate and key are given.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from sie.control.api.guard import guarded_h11
from sie.kernel.errors import ConfigError
from sie.kernel.supervised import ThreadStatus

log = logging.getLogger(__name__)

#: connections + in-flight requests beyond which uvicorn answers 503
MAX_CONCURRENCY = 64
#: bytes of a request line + headers (h11 refuses more with 431-like 400)
MAX_HEADER_BYTES = 16 * 1024


class ApiServer:
    """uvicorn serving the app from a daemon thread; the socket is bound in ``start`` (a port in use
    fails there, in the caller's thread, with the address in the message)."""

    def __init__(self, app: Any, host: str, port: int, tls_cert: Any = None, tls_key: Any = None) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("SIE_API_TLS_CERT and SIE_API_TLS_KEY: set both (HTTPS) or neither (HTTP)")
        self._app, self._host, self._port = app, host, port
        self._tls = (str(tls_cert), str(tls_key)) if tls_cert is not None else None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int | None:
        return self._socket.getsockname()[1] if self._socket is not None else None

    @property
    def scheme(self) -> str:
        return "https" if self._tls else "http"

    def start(self, timeout: float = 10.0) -> ApiServer:
        import uvicorn

        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"control API: cannot listen on {self._host}:{self._port} ({exc.strerror or exc}); "
                              "pass another --http-port") from None
        sock.listen(128)
        self._socket = sock
        config = uvicorn.Config(
            self._app, log_config=None, access_log=False, lifespan="off", http=guarded_h11(),
            timeout_keep_alive=5, limit_concurrency=MAX_CONCURRENCY, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            ssl_certfile=self._tls[0] if self._tls else None, ssl_keyfile=self._tls[1] if self._tls else None,
            server_header=False,
        )
        self._server = uvicorn.Server(config)

        def serve() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # SystemExit from a failed startup (e.g. a bad TLS key)
                self._error = exc
                log.error("control API stopped: %s", type(exc).__name__)

        self._thread = threading.Thread(target=serve, name="sie-control-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"control API did not start on {self._host}:{self._port}"
                                  + (" (check SIE_API_TLS_CERT / SIE_API_TLS_KEY)" if self._tls else "")
                                  + "; see the log above")
            time.sleep(0.01)
        return self

    def status(self) -> ThreadStatus:
        """The serving thread as health shows it.  Not restarted in-process when it dies (its socket was
        bound at start): /healthz then stops answering, and the process supervisor's probe restarts
        the whole control plane, which is stateless apart from Kafka."""
        running = self._thread is not None and self._thread.is_alive()
        stopping = self._server is not None and self._server.should_exit
        state = "running" if running else ("stopped" if stopping else "dead")
        error = None if self._error is None else type(self._error).__name__
        return ThreadStatus("sie-control-http", state, 0, error, None)

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._socket is not None:
            self._socket.close()
