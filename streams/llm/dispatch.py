"""Sending requests: C worker threads over one keep-alive HTTP client, fed from a queue.

Why threads, not asyncio: the stage's Kafka loop is synchronous (librdkafka's consumer and the
transactional producer are blocking calls made from one thread), and C is bounded by what the
servers can run at once (tens to a few hundred), so C threads blocked in ``httpx.Client.post`` cost
little and need no second event loop handing results across threads.  Each worker takes the next
request *itself* the moment its previous one finishes (the queue holds a backlog the stage keeps
filled), so a slot is never idle while the stage's thread is committing or polling Kafka: the
continuous in-flight window.  One ``httpx.Client`` (thread-safe; a connection pool with keep-alive,
``max_connections`` = C) is shared; every request has connect and read timeouts.

Outcomes of one request (``Job``):

* an answer that parses -> ``job.generation`` (the stage maps it to outputs);
* the server refused the request itself (HTTP 400/413/422, or an answer that is not the protocol's
  shape) -> ``job.error`` (the stage dead-letters the record ``inference_error``);
* no usable answer (connection refused/reset, timeout, 5xx, 404/401/403/503: a server that is down,
  starting, or misconfigured) -> the endpoint is ejected (``EndpointPool.failed``) and the request is
  dispatched again, to whichever endpoint is in service: never dead-lettered.  One exception, so a
  prompt that crashes the server cannot loop forever: a request that got a 5xx ``poison_after`` times
  while the pool served other requests meanwhile is dead-lettered with the server's message;
* 408/429 (the server is busy): a short pause, the same request again; the endpoint stays in service.

Streaming (``protocol.stream``): the answer is read as server-sent events (``sse_lines``: lines end only
at CR, LF or CRLF, not at U+0085/U+2028/U+2029 inside generated text; ``StreamReader``); the
moment of the first event carrying text is ``job.first_token`` (time to first token = that less
``job.sent``, the start of the attempt that answered).  A stream cut before its ``[DONE]`` is no usable
answer (like a reset connection): the endpoint is ejected and the request sent again.

A job with a ``deadline`` (the spec's ``sla.max_queue_time_ms`` counted from the request's timestamp) that
passes while the job waits for a slot (every endpoint out of service, or all full) is not sent (again):
``job.expired``, the stage answers it as expired.  A generation already running is never cut short by it.

A job whose record left the window meanwhile (``is_current`` False: revoked, reset) is dropped
before it is sent and between retries.  Workers are supervised: ``check()`` raises if one died.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from sie.streams.llm.pool import EndpointPool
from sie.streams.llm.protocols import BadOutput, Generation, Protocol, StreamReader, sse_lines

log = logging.getLogger("sie.llm")

_POISON_STATUSES = frozenset({400, 413, 422})
_BUSY_STATUSES = frozenset({408, 429})


@dataclass(slots=True)
class Job:
    """One request in flight: where its record is, what to send, what came back."""

    tp: tuple[str, int]
    offset: int
    epoch: int
    key: bytes | None
    body: dict[str, Any]
    generation: Generation | None = None
    error: str | None = None
    endpoint: str = ""
    attempts: int = 0
    server_errors: int = 0
    started: float = 0.0
    finished: float = 0.0
    sent: float = 0.0  # when the last attempt was sent
    first_token: float | None = None  # streamed: when its first text arrived
    #: the clock's time after which the request is not sent (again): sla.max_queue_time_ms from its timestamp
    deadline: float | None = None
    #: requests in flight at its endpoint when its last attempt was sent, itself included: the server's
    #: continuous batch it joined (the result's ``timings.batch_size``)
    batch: int = 1
    expired: bool = False  # the deadline passed before a server answered it: the stage answers "expired"


def _said(response: httpx.Response) -> str:
    """The server's own error message, short: OpenAI-compatible servers answer ``{"error": {"message"}}``
    (vLLM, llama.cpp), SGLang ``{"error": ...}`` or ``{"message"}``; else the body's start."""
    try:
        doc = response.json()
    except ValueError:
        return response.text[:200]
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    message = err.get("message") if isinstance(err, dict) else err
    return str(message if message is not None else doc)[:200]


class _Incomplete(Exception):
    """A streamed answer ended before its ``[DONE]``: no usable answer (the server's fault)."""


class WorkerDied(RuntimeError):
    """A dispatch worker thread ended unexpectedly: the stage stops (its supervisor restarts it)."""


class Dispatcher:
    """C workers sending ``Job``s to the pool's endpoints (module docstring)."""

    def __init__(self, pool: EndpointPool, protocol: Protocol, concurrency: int, stop: threading.Event, *,
                 on_done: Callable[[Job], None], is_current: Callable[[Job], bool],
                 timeout_s: float = 120.0, connect_timeout_s: float = 5.0, poison_after: int = 3,
                 client: httpx.Client | None = None, clock: Callable[[], float] = time.monotonic,
                 priority: int = 1) -> None:
        self.pool = pool
        self.priority = priority  # the model's priority level (P0 = 0): its place in the pool's order
        self.protocol = protocol
        self.concurrency = concurrency
        self._stop = stop
        self._on_done = on_done
        self._is_current = is_current
        self._poison_after = poison_after
        self._clock = clock
        self._client = client or httpx.Client(
            follow_redirects=False,  # a redirect would carry prompts to a host the node never allowed (SIE_SGLANG_ENDPOINTS)
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8))
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._busy_lock = threading.Lock()
        self.busy = 0  # workers inside a request (the sie_llm_in_flight gauge)
        self.error: BaseException | None = None

    def start(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._work, name=f"sie-llm-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def queued(self) -> int:
        """Jobs submitted and not yet taken by a worker."""
        return self._queue.qsize()

    def check(self) -> None:
        """Raise ``WorkerDied`` if a worker ended while the dispatcher is open (supervision)."""
        if self.error is not None or (not self._closed.is_set() and any(not t.is_alive() for t in self._threads)):
            raise WorkerDied(f"an LLM dispatch worker died: {self.error!r}")

    def close(self) -> None:
        """Stop the workers (requests in flight are abandoned: their records are read again)."""
        self._closed.set()
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + 2.0  # workers blocked in a generation are daemons: not waited for
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._client.close()

    # --- one worker ----------------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while not self._closed.is_set():
                job = self._queue.get()
                if job is None:
                    return
                if not self._is_current(job):
                    continue
                with self._busy_lock:
                    self.busy += 1
                try:
                    done = self._run(job)
                finally:
                    with self._busy_lock:
                        self.busy -= 1
                if done:
                    job.finished = self._clock()
                    self._on_done(job)
        except BaseException as exc:  # noqa: BLE001 - recorded, then seen by check() in the stage's loop
            self.error = exc
            log.exception("LLM dispatch worker died")

    def _gone(self, job: Job) -> bool:
        return self._closed.is_set() or self._stop.is_set() or not self._is_current(job)

    def _expired(self, job: Job) -> bool:
        """Its ``deadline`` passed while it waited for a slot (every endpoint out, or full): never sent again."""
        if job.deadline is not None and self._clock() >= job.deadline:
            job.expired = True
        return job.expired

    def _run(self, job: Job) -> bool:
        """Send until the job has an answer or an error (True), or it is no longer wanted (False)."""
        job.started = self._clock()
        pool, path = self.pool, self.protocol.path
        first_5xx_served = 0
        while True:
            if self._expired(job):
                return True
            endpoint = pool.acquire(job.key, self._stop, lambda: self._gone(job) or self._expired(job), self.priority)
            if endpoint is None:
                return job.expired and not self._gone(job)  # expired: done (answered "expired"); gone: dropped
            job.attempts += 1
            job.endpoint = endpoint.url
            job.batch = max(1, endpoint.in_flight)  # read without the pool's lock: a figure, not a decision
            sent = self._clock()
            job.sent, job.first_token = sent, None
            try:
                if self.protocol.stream:
                    response, streamed = self._stream(endpoint.url + path, job)
                else:
                    response, streamed = self._client.post(endpoint.url + path, json=job.body), None
            except (httpx.HTTPError, _Incomplete) as exc:  # refused, reset, timed out, cut: the server's fault
                if self._closed.is_set():  # our own client closed under the request: not the server's fault
                    pool.release(endpoint)
                    return False
                pool.failed(endpoint, f"{type(exc).__name__}: {str(exc)[:120]}")
                continue
            status = response.status_code
            if status in _BUSY_STATUSES:
                pool.release(endpoint)
                self._stop.wait(0.05 * min(job.attempts, 20))
                continue
            if status in _POISON_STATUSES:
                pool.release(endpoint)
                job.error = f"{path}: HTTP {status} {response.text[:300]}"
                return True
            if status >= 500 and status != 503:
                served = sum(e.served for e in pool.endpoints)
                job.server_errors += 1
                if job.server_errors == 1:
                    first_5xx_served = served
                pool.failed(endpoint, f"HTTP {status}: {_said(response)}")
                if job.server_errors >= self._poison_after and served > first_5xx_served:
                    job.error = f"{path}: HTTP {status} {job.server_errors} times while the servers answered " \
                                f"other requests: {response.text[:300]}"
                    return True
                continue
            if status != 200:  # 503 starting/stopping, 404/401/403 misconfigured: not this request's fault
                # what the server said is the fix (vLLM: 404 "The model `x` does not exist." for a served name
                # the spec's served_model_name does not match); a redirect is never followed
                why = "a redirect: not followed" if 300 <= status < 400 else _said(response)
                pool.failed(endpoint, f"HTTP {status} on {path}: {why}")
                continue
            pool.release(endpoint, self._clock() - sent)
            if isinstance(streamed, BadOutput):
                job.error = str(streamed)
                return True
            try:
                job.generation = streamed if streamed is not None else self.protocol.parse(response.json())
            except ValueError:  # not JSON
                job.error = f"{path}: answer is not JSON: {response.text[:200]!r}"
            except BadOutput as exc:
                job.error = str(exc)
            return True

    def _stream(self, url: str, job: Job) -> tuple[httpx.Response, Generation | BadOutput | None]:
        """Send ``job`` and read its answer as events: (the response, read in full unless it is 200; the
        generation, or why the stream cannot be the request's answer)."""
        with self._client.stream("POST", url, json=job.body) as response:
            if response.status_code != 200 or not response.headers.get("content-type", "").startswith(
                    "text/event-stream"):
                # an error answer, or a server that answered the whole body at once (no streaming): read as
                # without streaming (no first token to time)
                response.read()
                return response, None
            reader = StreamReader(self.protocol)
            try:
                for line in sse_lines(response.iter_bytes()):  # never iter_lines(): sse_lines says why
                    if reader.feed(line) and job.first_token is None:
                        job.first_token = self._clock()
                    if reader.done:
                        return response, reader.result()
            except BadOutput as exc:
                return response, exc
            raise _Incomplete("the stream ended before data: [DONE]")
