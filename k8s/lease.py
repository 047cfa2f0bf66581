"""Leader election on a ``coordination.k8s.io/v1`` Lease: one operator replica acts, the others wait.

    every retry_s:
        read the Lease
        held by someone else and its record changed within lease_s (by MY clock)  -> follower
        else write it with my identity and renewTime, conditional on its resourceVersion
             (409 Conflict = another replica wrote first -> follower)
    leading  <=>  my last successful write is younger than renew_deadline_s (< lease_s)

WHY "changed within lease_s by my clock" and not the holder's renewTime: the holder's clock is not mine; a
replica whose clock runs a minute ahead would otherwise look alive forever (this is what client-go does:
it times the observed record, never the timestamps in it).  WHY the conditional write: two candidates that
both see an expired Lease both try to take it; the API server accepts the first write on that
resourceVersion and refuses the other (optimistic concurrency), so at most one wins each round.

The leader steps down by itself when it cannot renew for renew_deadline_s (the API server unreachable,
its writes refused): it stops acting BEFORE its Lease can expire for the others (renew_deadline_s <
lease_s), so two replicas never act at once unless a process is frozen mid-action past both (what the
operator does is idempotent for that case: it publishes a spec only when the cluster's differs, and the
same CR gives the same spec).  ``release()`` on a clean stop hands the Lease over at once.

Failures:
| what | effect |
|---|---|
| API server unreachable | leader: steps down after renew_deadline_s; followers keep waiting |
| Lease deleted | recreated by the next candidate |
| two candidates race | one write wins (resourceVersion), the other stays follower |
| leader SIGKILLed | a follower takes over lease_s after the last renewal it observed |
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("sie.k8s.lease")


@dataclass
class _Observed:
    holder: str | None
    renew_time: Any
    resource_version: str | None
    at: float


def _now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaseElector:
    """One candidate for a Lease.  Call ``step()`` every ``retry_s``; ``leading`` says whether to act."""

    def __init__(self, coordination: Any, namespace: str, name: str, identity: str, *, lease_s: float = 15.0,
                 renew_deadline_s: float = 10.0, retry_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = _now_utc) -> None:
        if not retry_s < renew_deadline_s < lease_s:
            raise ValueError(f"need retry_s < renew_deadline_s < lease_s (got {retry_s}, {renew_deadline_s}, {lease_s})")
        self.api, self.namespace, self.name, self.identity = coordination, namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self._clock, self._wall = clock, wall
        self._observed: _Observed | None = None
        self._renewed_at: float | None = None
        self.transitions = 0
        self.last_error: str | None = None

    @property
    def leading(self) -> bool:
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.renew_deadline_s

    @property
    def holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    def step(self) -> bool:
        """One round: renew or try to take the Lease.  Returns ``leading``."""
        from kubernetes.client import ApiException

        was = self.leading
        try:
            self._round()
            self.last_error = None
        except ApiException as exc:
            self.last_error = f"lease {self.namespace}/{self.name}: {exc.status} {exc.reason}"
            log.warning("%s", self.last_error)
        except Exception as exc:  # the API server unreachable: urllib3 errors and the like
            self.last_error = f"lease {self.namespace}/{self.name}: {type(exc).__name__}: {exc}"
            log.warning("%s", self.last_error)
        now = self.leading
        if now != was:
            log.warning("%s %s leadership of lease %s/%s", self.identity, "took" if now else "lost",
                        self.namespace, self.name)
        return now

    def _round(self) -> None:
        from kubernetes.client import ApiException, V1Lease, V1LeaseSpec, V1ObjectMeta

        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = V1Lease(metadata=V1ObjectMeta(name=self.name, namespace=self.namespace),
                           spec=self._spec(V1LeaseSpec(), taking=True))
            try:
                self.api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:  # another candidate created it first
                    return
                raise
            self._won()
            return
        spec = lease.spec or V1LeaseSpec()
        seen = _Observed(spec.holder_identity or None, spec.renew_time, lease.metadata.resource_version, self._clock())
        if self._observed is None or (self._observed.holder, self._observed.renew_time) != (seen.holder, seen.renew_time):
            self._observed = seen  # the record changed: restart its clock
        mine = seen.holder == self.identity
        expired = self._clock() - self._observed.at >= float(spec.lease_duration_seconds or self.lease_s)
        if not mine and seen.holder and not expired:
            self._renewed_at = None
            return
        lease.spec = self._spec(spec, taking=not mine)
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:  # someone wrote it since we read it: they won this round
                if not mine:
                    self._renewed_at = None
                return
            raise
        self._won()

    def _spec(self, spec: Any, taking: bool) -> Any:
        now = self._wall()
        created = spec.holder_identity is None and spec.lease_transitions is None
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = int(self.lease_s)
        spec.renew_time = now
        if taking:
            spec.acquire_time = now
            # a change of holder (released or expired) counts, as client-go counts it; a new Lease starts at 0
            spec.lease_transitions = 0 if created else int(spec.lease_transitions or 0) + 1
        return spec

    def _won(self) -> None:
        self._renewed_at = self._clock()
        self._observed = None

    def release(self) -> None:
        """A clean stop: give the Lease up so a follower takes it at its next round, not lease_s later."""
        from kubernetes.client import ApiException

        if not self.leading:
            return
        self._renewed_at = None
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except (ApiException, OSError) as exc:
            log.warning("could not release lease %s/%s (%s); it expires in %ss", self.namespace, self.name, exc,
                        self.lease_s)
