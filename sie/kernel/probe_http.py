"""The HTTP server behind every health/readiness and metrics port (agent, workers, CDC stage, control plane,
operator): bounded.

``http.server.ThreadingHTTPServer`` starts a thread per connection and waits for its request forever, so 100
idle connections would hold 100 threads.  ``ProbeServer`` bounds both::

    on accept:
        at MAX_CONNECTIONS already?  -> shut the OLDEST connection down (its thread ends), then serve this one
        serve it on a daemon thread; the socket times out after IDLE_TIMEOUT_S without a byte
    per connection: one request (HTTP/1.0: no keep-alive), then close

Evicting the oldest rather than refusing the newest keeps a kubelet probe answered while someone holds idle
connections: to starve it they would have to open ``MAX_CONNECTIONS`` connections in the time the probe's
one request takes.

| failure | handling |
|---|---|
| a client connects and sends nothing | its socket times out after ``IDLE_TIMEOUT_S``; the thread ends |
| more than ``MAX_CONNECTIONS`` at once | the oldest is shut down (its handler sees EOF/an error and ends) |
| a request line or header over http.server's limits | 414/431 from http.server, connection closed |
"""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: seconds a probe connection may stay silent (a kubelet probe sends its request at once)
IDLE_TIMEOUT_S = 5.0
#: connections served at once; each holds one thread
MAX_CONNECTIONS = 16


class ProbeHandler(BaseHTTPRequestHandler):
    """Base of the probe handlers: a socket timeout, no keep-alive, no access log."""

    timeout = IDLE_TIMEOUT_S
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        return


class ProbeServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_connections`` connections (the oldest is evicted)."""

    daemon_threads = True
    block_on_close = False
    #: the kernel's accept queue: connections beyond it wait for SYN retries (seconds), probes among them
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._open: OrderedDict[int, socket.socket] = OrderedDict()
        self._lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            while len(self._open) >= self.max_connections:
                _, oldest = self._open.popitem(last=False)
                try:
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's recv returns; the thread closes and ends
                except OSError:
                    pass
            self._open[id(request)] = request
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                if self._open.get(id(request)) is request:
                    del self._open[id(request)]

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)


def start_metrics_server(port: int, addr: str = "127.0.0.1", registry: Any = None) -> tuple[ProbeServer, threading.Thread]:
    """``prometheus_client.start_http_server``'s drop-in on a ``ProbeServer``: the same ``/metrics`` handler
    (content negotiation, gzip, ``name[]`` filters), with the idle timeout and the connection cap."""
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import MetricsHandler

    handler = type("SieMetricsHandler", (ProbeHandler, MetricsHandler.factory(registry or REGISTRY)), {})
    server = ProbeServer((addr, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="sie-metrics", daemon=True)
    thread.start()
    return server, thread


def serve_probes(handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str) -> ProbeServer:
    """A ``ProbeServer`` on ``host:port`` serving on a daemon thread named ``name``."""
    server = ProbeServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
