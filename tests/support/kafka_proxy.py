"""A fault-injecting TCP proxy between Kafka clients and one broker, that reads the Kafka protocol's framing.

Each broker gets a second listener (``PROXIED``) that advertises the proxy's address, so a client that
bootstraps through the proxy is sent back to it by every metadata answer and never bypasses it; the brokers
talk to each other on their own listener, untouched.  ``proxied_cluster`` starts such a cluster.

The proxy knows, per connection, which request each answer belongs to (a request frame starts with its API
key and correlation id, an answer with the correlation id), so it can do what a generic proxy (Toxiproxy)
cannot: forward a request and drop exactly its answer.  Faults, each switched on and off while it runs:

* ``drop(api_key, count)``: requests of that kind reach the broker, their answers are swallowed (the commit
  that reached the coordinator and whose answer was lost): the next ``count``, or all until ``undrop``;
  ``dropped[api_key]`` counts them;
* ``delay_s``: every answer is held this long before it is forwarded;
* ``freeze()`` / ``thaw()``: nothing is forwarded either way, the connections stay open (a frozen broker, as
  seen from the client; the broker itself runs on and talks to the others);
* ``cut()``: every open connection is closed now; ``cut_mid_answer(api_key)``: the next answer of that kind
  is forwarded half-way, then its connection is closed.

``requests[api_key]`` counts requests forwarded.  API keys: ``PRODUCE`` 0, ``INIT_PRODUCER_ID`` 22,
``ADD_PARTITIONS_TO_TXN`` 24, ``ADD_OFFSETS_TO_TXN`` 25, ``END_TXN`` 26, ``TXN_OFFSET_COMMIT`` 28,
``OFFSET_FETCH`` 9, ``FIND_COORDINATOR`` 10.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PRODUCE, OFFSET_FETCH, FIND_COORDINATOR = 0, 9, 10
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaProxy:
    """One broker's proxy (module docstring).  ``port``: where clients connect; ``upstream``: the broker's
    proxied listener."""

    def __init__(self, upstream_port: int, port: int | None = None, name: str = "proxy") -> None:
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self.name = name
        self.requests: Counter[int] = Counter()
        self.dropped: Counter[int] = Counter()
        self.delay_s = 0.0
        self._drop: dict[int, int | None] = {}  # api key -> answers left to drop (None: all)
        self._cut_mid: set[int] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=f"kafka-{name}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{name}: the proxy did not start listening on 127.0.0.1:{self.port}")

    # --- faults (any thread) ------------------------------------------------------------------------------
    def drop(self, api_key: int, count: int | None = None) -> None:
        """Swallow the answers of ``api_key`` requests: the next ``count`` of them, or all until ``undrop``."""
        with self._lock:
            self._drop[api_key] = count

    def undrop(self, api_key: int) -> None:
        with self._lock:
            self._drop.pop(api_key, None)

    def cut_mid_answer(self, api_key: int) -> None:
        with self._lock:
            self._cut_mid.add(api_key)

    def freeze(self) -> None:
        self._call(lambda: self._flowing.clear() if self._flowing else None)

    def thaw(self) -> None:
        self._call(lambda: self._flowing.set() if self._flowing else None)

    def cut(self) -> None:
        def close_all() -> None:
            for writer in list(self._writers):
                writer.close()
        self._call(close_all)

    def close(self) -> None:
        def stop() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            self._loop.stop()
        self._call(stop)
        self._thread.join(5)

    # --- the loop -------------------------------------------------------------------------------------------
    def _call(self, fn: Any) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(fn)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True))
        ready.set()
        self._loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, broker_w}
        pending: dict[int, int] = {}  # correlation id -> api key, of requests whose answer is due
        try:
            await asyncio.gather(self._requests(client_r, broker_w, pending),
                                 self._answers(broker_r, client_w, pending))
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for w in (client_w, broker_w):
                w.close()
                self._writers.discard(w)

    async def _frame(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readexactly(4)
        return head + await reader.readexactly(struct.unpack(">i", head)[0])

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        pending: dict[int, int]) -> None:
        assert self._flowing is not None
        while True:
            frame = await self._frame(reader)
            api_key, _version, correlation = struct.unpack(">hhi", frame[4:12])
            await self._flowing.wait()
            pending[correlation] = api_key
            self.requests[api_key] += 1
            writer.write(frame)
            await writer.drain()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       pending: dict[int, int]) -> None:
        assert self._flowing is not None
        while True:
            frame = await self._frame(reader)
            api_key = pending.pop(struct.unpack(">i", frame[4:8])[0], -1)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)  # the injected fault: each answer held back delay_s
            await self._flowing.wait()
            with self._lock:
                dropped = api_key in self._drop
                left = self._drop.get(api_key)
                if left is not None:
                    if left <= 1:
                        del self._drop[api_key]
                    else:
                        self._drop[api_key] = left - 1
                cut = api_key in self._cut_mid
                self._cut_mid.discard(api_key)
            if dropped:
                self.dropped[api_key] += 1
                continue
            if cut:
                writer.write(frame[: len(frame) // 2])
                await writer.drain()
                raise ConnectionError(f"{self.name}: cut in the middle of an answer to api key {api_key}")
            writer.write(frame)
            await writer.drain()


def proxied_properties(internal: dict[int, int], proxies: dict[int, int]) -> Any:
    """The ``LocalKafka(properties=...)`` hook: node i also listens on ``internal[i]`` as ``PROXIED`` and
    advertises the proxy's port ``proxies[i]`` there."""
    def add(node: Any, props: dict[str, str]) -> dict[str, str]:
        port = internal[node.node_id]
        return {**props,
                "listeners": f"{props['listeners']},PROXIED://127.0.0.1:{port}",
                "advertised.listeners": f"{props['advertised.listeners']},PROXIED://127.0.0.1:{proxies[node.node_id]}",
                "listener.security.protocol.map": f"{props['listener.security.protocol.map']},PROXIED:PLAINTEXT"}
    return add


class ProxiedCluster:
    """A local cluster whose every broker sits behind its own ``KafkaProxy``."""

    def __init__(self, kafka: Any, proxies: dict[int, KafkaProxy]) -> None:
        self.kafka = kafka
        self.proxies = proxies

    @property
    def bootstrap_servers(self) -> str:
        """Where clients connect: the proxies (the brokers' metadata keeps them there)."""
        return ",".join(f"127.0.0.1:{p.port}" for p in self.proxies.values())

    def settings(self) -> Any:
        return self.kafka.settings.with_overrides(bootstrap_servers=self.bootstrap_servers)

    def direct_settings(self) -> Any:
        """Settings that bypass the proxies (the test's own instruments: a frozen proxy must not stall them)."""
        return self.kafka.settings_for_clients()

    def all(self) -> list[KafkaProxy]:
        return list(self.proxies.values())


@contextmanager
def proxied_cluster(settings: Any, data_dir: Path, brokers: int = 1) -> Iterator[ProxiedCluster]:
    from sie.infra.kafka.local import LocalKafka, free_base_port

    internal = {i: free_port() for i in range(1, brokers + 1)}
    proxies = {i: KafkaProxy(internal[i], name=f"proxy-{i}") for i in internal}
    kafka = LocalKafka(settings, brokers=brokers, base_port=free_base_port(2 * brokers), data_dir=data_dir,
                       detach=False, properties=proxied_properties(internal, {i: p.port for i, p in proxies.items()}))
    try:
        kafka.up(timeout=180)
        yield ProxiedCluster(kafka, proxies)
    finally:
        kafka.down(timeout=10)
        for proxy in proxies.values():
            proxy.close()
