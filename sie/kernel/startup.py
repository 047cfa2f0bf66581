"""Start in any order: a long-running component waits for Kafka and its topics instead of exiting.

On Kubernetes every pod of a release starts at once: the agent DaemonSet, the control plane, the topics
Job, maybe Kafka itself (and a Strimzi ``KafkaUser`` whose credentials exist only once its operator made
them).  A component that exits because its topic is not there yet is restarted by the kubelet with a
growing CrashLoopBackOff; one that waits is up the moment the topic appears.  So::

    backoff = 0.5 s
    until stopped:
        ask the cluster for metadata          (unreachable / credentials refused -> waiting for Kafka)
        every needed topic has partitions with leaders?  -> ready to open its clients; return True
        else                                   -> waiting for topics [...] (the chart's topics Job)
        say what is awaited: Readiness (/readyz answers 503 with it) and a log line when it changes
        (and once a minute while it does not)
        sleep backoff; backoff = min(2 * backoff, 30 s)          (bounded: never more than 30 s late)
    return False (stopped while waiting)

``Readiness`` is what the component's readiness endpoint reports (``serve_readiness``: ``/readyz`` 200
``ready`` or 503 ``waiting for: <what>``, ``/livez`` 200 while the process serves); the component sets it
ready when it really is (the agent: registered and consuming its assignments).

Failures while waiting:
| what | reported as |
|---|---|
| no broker answers | ``Kafka at <servers>: <librdkafka's reason>`` |
| credentials refused (the KafkaUser not created yet) | ``Kafka at <servers> refuses user <u>: <reason>`` |
| topic missing or leaderless | ``topics [<names>] (run sie topics ensure, or the chart's topics Job)`` |
| a first read refused after that (a topic created a moment ago answers ListOffsets ``NOT_LEADER_FOR_PARTITION``) | ``<what> (<librdkafka's reason>)``, retried: ``retry_until_answered`` |
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sie.kernel.clients import KafkaClients
from sie.kernel.errors import KafkaUnavailable
from sie.kernel.settings import Settings

log = logging.getLogger("sie.startup")

T = TypeVar("T")

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
REPEAT_LOG_S = 60.0


class Readiness:
    """Ready, or the one thing a component waits for; read by its readiness endpoint (thread-safe)."""

    def __init__(self, component: str) -> None:
        self.component = component
        self._lock = threading.Lock()
        self._ready = False
        self._reason = "starting"

    def waiting(self, what: str) -> None:
        with self._lock:
            self._ready, self._reason = False, what

    def set_ready(self, detail: str = "ready") -> None:
        with self._lock:
            self._ready, self._reason = True, detail

    def snapshot(self) -> tuple[bool, str]:
        with self._lock:
            return self._ready, self._reason

    @property
    def ready(self) -> bool:
        return self.snapshot()[0]


def missing_topics(metadata: Any, topics: Iterable[str]) -> list[str]:
    """The topics of ``topics`` that ``metadata`` lacks, or that have a partition without a leader."""
    out = []
    for name in topics:
        info = metadata.topics.get(name)
        if info is None or info.error is not None or not info.partitions or \
                any(p.leader < 0 for p in info.partitions.values()):
            out.append(name)
    return sorted(out)


def wait_for_kafka(settings: Settings, topics: Iterable[str], readiness: Readiness, stop: threading.Event, *,
                   clients: KafkaClients | None = None, metadata: Callable[[], Any] | None = None,
                   max_backoff_s: float = MAX_BACKOFF_S, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait (bounded backoff) until Kafka answers and every topic of ``topics`` exists; False if ``stop``.

    ``metadata``: how to ask (a client the component already has, e.g. its consumer's ``list_topics``);
    default an admin client from ``clients``, which also tells refused credentials from a broker that is down.
    """
    from confluent_kafka import KafkaException

    from sie.kernel.admin import kafka_error_text, wait_for_cluster
    from sie.kernel.authz import NotAuthenticated

    wanted = sorted(set(topics))
    backoff = INITIAL_BACKOFF_S
    said, said_at = "", 0.0
    while not stop.is_set():
        try:
            md = metadata() if metadata is not None else wait_for_cluster(settings, settings.connect_timeout_s, clients)
        except NotAuthenticated as exc:
            what = f"Kafka at {settings.bootstrap_servers} to accept our credentials ({exc})"
        except KafkaUnavailable as exc:
            what = f"Kafka ({exc})"
        except KafkaException as exc:
            what = f"Kafka at {settings.bootstrap_servers} ({kafka_error_text(exc)})"
        else:
            missing = missing_topics(md, wanted)
            if not missing:
                if said:
                    log.warning("%s: %s available; going on", readiness.component,
                                "topics" if wanted else "Kafka")
                return True
            what = f"topics {missing} (run `sie topics ensure`; on Kubernetes the chart's topics Job creates them)"
        readiness.waiting(what)
        now = clock()
        if what != said or now - said_at >= REPEAT_LOG_S:
            log.warning("%s: waiting for %s; next try in %.1fs", readiness.component, what, backoff)
            said, said_at = what, now
        stop.wait(backoff)
        backoff = min(backoff * 2, max_backoff_s)
    return False


def retry_until_answered(call: Callable[[], T], what: str, readiness: Readiness, stop: threading.Event, *,
                         max_backoff_s: float = MAX_BACKOFF_S) -> T | None:
    """``call()``'s value, retried with the same bounded backoff while it raises ``KafkaException`` (module
    docstring); None if ``stop`` was set first.  For the first reads a component makes once ``wait_for_kafka``
    returned (watermarks of the topic it replays): on a topic created a moment ago a broker may still refuse
    them, and a component that died there would need a restart to try again (a CI run: the agent's thread
    ended on ``NOT_LEADER_FOR_PARTITION`` and never followed its assignments)."""
    from confluent_kafka import KafkaException

    from sie.kernel.admin import kafka_error_text

    backoff = INITIAL_BACKOFF_S
    while not stop.is_set():
        try:
            return call()
        except KafkaException as exc:
            why = f"{what} ({kafka_error_text(exc)})"
            readiness.waiting(why)
            log.warning("%s: waiting for %s; next try in %.1fs", readiness.component, why, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, max_backoff_s)
    return None


def serve_readiness(readiness: Readiness, host: str, port: int,
                    check: Callable[[], tuple[bool, str]] | None = None) -> int:
    """``/readyz`` (200 ready / 503 ``waiting for: ...``) and ``/livez`` on a daemon thread; the bound port.
    Bounded (``sie.kernel.probe_http``): idle connections time out, at most a few are served at once.

    ``check``: once ``readiness`` is ready, the component's own live verdict (the control plane: its state
    has caught up with the topics)."""
    from sie.kernel.probe_http import ProbeHandler, serve_probes

    class Handler(ProbeHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            ready, reason = readiness.snapshot()
            if ready and check is not None:
                try:
                    ready, reason = check()
                except Exception as exc:  # a probe must answer, not hang up
                    ready, reason = False, f"readiness check failed ({type(exc).__name__})"
            if self.path == "/readyz":
                code, text = (200, reason) if ready else (503, f"waiting for: {reason}")
            elif self.path == "/livez":
                code, text = 200, "alive"
            else:
                code, text = 404, "not found: /readyz, /livez"
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = serve_probes(Handler, host, port, name=f"sie-{readiness.component}-readiness")
    return int(server.server_address[1])
