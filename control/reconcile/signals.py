"""The autoscaler's backlog signal: each autoscaled model's lag, arrival rate and drain rate, sampled from Kafka.

WHY from the scorer group's committed offsets: the scorer commits its offsets in the same transaction as
its results (exactly-once), so "end of the request topic minus committed offset" is precisely the
records still waiting, and the rate at which committed offsets advance is the rate at which results
became visible: throughput measured from results, without reading a single result.  One admin client
answers both (``sie.kernel.admin.group_progress``); the group is never joined.

``BacklogSampler`` samples every ``interval_s`` on a ``SupervisedThread`` (a death restarts it; the
signals it leaves behind simply grow old and the autoscaler holds on a stale signal, ``signal_max_age_s``).
Only models that can scale (``min_replicas != max_replicas``) are sampled: a fixed-size model costs no
admin requests.  ``window(samples)`` is the pure part (unit-tested): rates over the last ``rate_window_s``
of samples (not just the last two: a scorer commits once per batch, and a batch of a slow model can take
seconds, so committed offsets advance in steps), and ``busy`` when the replicas had work queued all through
the window: the lowest lag seen in it was at least what they committed over it.  (A lag above zero is not enough: a replica that keeps up
still has its in-flight batch uncommitted, and measuring "capacity" then would only measure arrivals.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sie.control.reconcile.autoscaler import ModelSignals
from sie.kernel.clients import KafkaClients
from sie.kernel.supervised import SupervisedThread, ThreadStatus

log = logging.getLogger(__name__)

#: model name -> (scorer group, request topic)
ModelSource = Callable[[], Mapping[str, tuple[str, str]]]


@dataclass(frozen=True)
class Sample:
    """One reading of a model's progress (totals over its partitions)."""

    at: float
    committed: int
    end: int
    lag: int
    partitions: int


def window(samples: Sequence[Sample]) -> ModelSignals:
    """The signal from the samples of one window, oldest first (rates need two; the partition count must
    not have changed within the window, or the totals are not comparable)."""
    current = samples[-1]
    first = samples[0]
    if len(samples) < 2 or current.at <= first.at or any(s.partitions != current.partitions for s in samples):
        return ModelSignals(at=current.at, lag=current.lag, partitions=current.partitions)
    span = current.at - first.at
    committed = max(0, current.committed - first.committed)
    return ModelSignals(
        at=current.at, lag=current.lag, partitions=current.partitions,
        arrival_rate=max(0, current.end - first.end) / span, drain_rate=committed / span,
        busy=min(s.lag for s in samples) >= max(1, committed), window_s=span,
    )


class BacklogSampler:
    """Samples the backlog of every model ``models()`` names, every ``interval_s`` (module docstring)."""

    def __init__(self, settings: Any, models: ModelSource, clock: Callable[[], float] = time.time,
                 interval_s: float = 2.0, clients: KafkaClients | None = None,
                 read: Callable[[Any, str, str], Any] | None = None, request_timeout_s: float = 5.0,
                 rate_window_s: float = 10.0) -> None:
        from sie.kernel.admin import group_progress

        self._settings = settings
        self._models = models
        self._clock = clock
        self.interval_s = interval_s
        self._clients = clients or KafkaClients()
        self._read = read or (lambda admin, group, topic: group_progress(admin, group, topic, request_timeout_s))
        self._lock = threading.Lock()
        self.rate_window_s = rate_window_s
        self._history: dict[str, deque[Sample]] = {}
        self._signals: dict[str, ModelSignals] = {}
        self._stop = threading.Event()
        self._thread = SupervisedThread("sie-control-backlog", self._run, self._stop)
        self.errors = 0
        self.last_error: str | None = None

    def start(self) -> BacklogSampler:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def signals(self) -> dict[str, ModelSignals]:
        with self._lock:
            return dict(self._signals)

    def thread_status(self) -> ThreadStatus:
        return self._thread.status()

    def status(self) -> dict[str, Any]:
        """As ``/healthz`` shows it: not ok while its thread is not running."""
        thread = self._thread.status()
        with self._lock:
            failing = sorted(name for name, s in self._signals.items() if s.error)
        detail = (f"sampler thread {thread.state}: {thread.last_error}" if not thread.ok else
                  f"backlog of {', '.join(failing)} unreadable: {self.last_error}" if failing else "sampling")
        return {**thread.to_json(), "detail": detail, "read_errors": self.errors}

    def sample_once(self, admin: Any) -> None:
        """One round over every model (a model whose backlog cannot be read gets a signal with its error)."""
        wanted = dict(self._models())
        for name, (group, topic) in sorted(wanted.items()):
            at = self._clock()
            try:
                progress = self._read(admin, group, topic)
                sample = Sample(at, progress.committed_total, progress.end_total, progress.lag, progress.partitions)
                with self._lock:
                    history = self._history.setdefault(name, deque())
                    history.append(sample)
                    while len(history) > 2 and history[1].at <= at - self.rate_window_s:
                        history.popleft()  # keep one sample at or before the window's start
                    self._signals[name] = window(list(history))
            except Exception as exc:  # one model's unreadable backlog must not stop the others
                self.errors += 1
                self.last_error = f"{name}: {exc}"
                log.warning("backlog of %s unreadable: %s", name, exc)
                with self._lock:
                    self._signals[name] = ModelSignals(at=at, lag=None, error=str(exc))
                    self._history.pop(name, None)
        with self._lock:
            for gone in set(self._signals) - set(wanted):
                self._signals.pop(gone, None)
                self._history.pop(gone, None)

    def _run(self) -> None:
        from sie.kernel.admin import admin_client

        admin = admin_client(self._settings, self._clients)
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once(admin)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
