"""The agent's side of artifact distribution: a replica's artifacts made local before its worker starts.

The agent's loop must never block on a download (a multi-gigabyte artifact would stop its heartbeats
and the node would look dead), so fetches run on a small thread pool and the command builder only asks
``resolve(ref)``:

* the verified copy is in the cache -> its path (the worker's spec names it);
* a fetch is running, or waits to retry after a transient failure -> ``LaunchDeferred``: the replica
  stays PENDING with the reason (``fetching sha256:ab12... (fraud.safetensors)``), nothing crashes;
* the bytes were refused (digest mismatch, a corrupt or missing chunk, a source this node does not
  allow, not on the cluster at all) -> ``LaunchRefused``: the replica goes FAILED with that reason at once
  (no crash loop); the control plane keeps it off this node for its cool-down.  The refusal is
  remembered for ``forget_refusal_s`` and then forgotten, so a later launch (after the artifact was
  uploaded again) fetches afresh.

Sources: the cluster's artifacts topic (``sie.schemas.artifact_store``), or the ref's URI
(``sie.schemas.artifact_cache.download``), which the node's spec policy must allow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sie.kernel.settings import Settings
from sie.schemas.artifact_cache import ArtifactCache, ArtifactRefused, ArtifactUnavailable, download
from sie.schemas.artifact_store import ArtifactStore
from sie.workers.process import LaunchDeferred, LaunchRefused

log = logging.getLogger(__name__)


class ArtifactFetcher:
    """Fetches and verifies artifacts in the background; ``resolve`` never blocks (see the module docstring)."""

    def __init__(self, settings: Settings, policy: Any, store: ArtifactStore | None = None, *, group_id: str | None = None,
                 clients: Any = None, workers: int = 2, backoff_initial_s: float = 1.0, backoff_max_s: float = 30.0,
                 forget_refusal_s: float = 30.0, fetch_timeout_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = ArtifactCache(settings.artifact_cache_dir, settings.max_artifact_bytes)
        self.store = store or ArtifactStore(settings, group_id=group_id, clients=clients)
        self.policy = policy
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sie-artifact-fetch")
        self._lock = threading.Lock()
        self._jobs: dict[str, Future[Path]] = {}
        self._retry: dict[str, tuple[float, int, str]] = {}  # sha -> (not before, failures, last reason)
        self._refused: dict[str, tuple[float, str]] = {}  # sha -> (when, reason)
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._forget_s = forget_refusal_s
        self._timeout = fetch_timeout_s
        self._clock = clock
        self.fetched = 0

    def resolve(self, ref: Any) -> Path:
        """The verified local copy of ``ref`` (an ``ArtifactRef``); ``LaunchDeferred`` / ``LaunchRefused``."""
        local = self.cache.get(ref)
        if local is not None:
            return local
        now = self._clock()
        key = ref.sha256
        with self._lock:
            refused = self._refused.get(key)
            if refused is not None:
                if now - refused[0] < self._forget_s:
                    raise LaunchRefused(refused[1])
                del self._refused[key]
            job = self._jobs.get(key)
            if job is not None and job.done():
                del self._jobs[key]
                error = job.exception()
                if error is None:
                    self._retry.pop(key, None)
                    return job.result()
                self._failed(ref, error, now)  # raises
            retry = self._retry.get(key)
            if job is None and retry is not None and now < retry[0]:
                raise LaunchDeferred(f"artifact {ref.label}: {retry[2]}; retrying in {retry[0] - now:.0f}s")
            if job is None:
                self._jobs[key] = self._pool.submit(self._fetch, ref)
        raise LaunchDeferred(f"fetching artifact {ref.label}"
                             + (f" ({ref.size} bytes)" if ref.size is not None else ""))

    def _failed(self, ref: Any, error: BaseException, now: float) -> None:
        if isinstance(error, ArtifactUnavailable):
            _, failures, _ = self._retry.get(ref.sha256, (0.0, 0, ""))
            first, cap = self._backoff
            delay = min(cap, first * (2 ** failures))
            self._retry[ref.sha256] = (now + delay, failures + 1, str(error))
            log.warning("artifact %s: %s; retrying in %.0fs", ref.label, error, delay)
            raise LaunchDeferred(f"artifact {ref.label}: {error}; retrying in {delay:.0f}s")
        reason = str(error) if isinstance(error, ArtifactRefused) else \
            f"artifact {ref.label}: fetch failed ({type(error).__name__}: {error})"
        self._retry.pop(ref.sha256, None)
        self._refused[ref.sha256] = (now, reason)
        log.error("artifact %s refused: %s", ref.label, reason)
        raise LaunchRefused(reason)

    def _fetch(self, ref: Any) -> Path:
        started = time.monotonic()
        if ref.uri is not None:
            problems = self.policy.check_uri(ref.uri, "spec.backend.artifact.uri") if self.policy is not None else []
            if problems:
                raise ArtifactRefused("; ".join(problems))
            path = self.cache.put(ref, lambda sink: download(ref.uri, sink, timeout=self._timeout))
        else:
            manifest = self.store.require(ref.sha256, ref.label)
            path = self.cache.put(ref, lambda sink: self.store.fetch(manifest, sink, timeout=self._timeout))
        self.fetched += 1
        log.info("artifact %s fetched and verified in %.1fs: %s", ref.label, time.monotonic() - started, path)
        return path

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
