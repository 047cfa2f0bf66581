"""The mass-offline guard: "every node died at once" is usually "the control plane stopped hearing them".

WHY: a node is offline when no heartbeat of it was seen for ``node_timeout_s``, and the controller then
moves its replicas.  That is right for one node that dies.  When MANY nodes go silent within one
liveness window it is far more likely that the heartbeats stopped reaching this control plane (its state
reader died, stalled or lags; the agents lost the brokers) than that the machines all died, and acting on
it is a total outage: the leader publishes empty assignments for every node and every agent drains every
replica the moment it hears from Kafka again.  And when the machines really did all die, moving their
replicas gains nothing: there is nowhere to move them to.

Rule (``MassOfflineGuard.assess``, once per reconcile pass):

* *suspicious*: at least ``fraction`` of the nodes that were online one liveness window ago went offline
  within that window, or are on their way there (silent for more than half the window).  A node "went
  offline" when its last proof of life is older than the timeout; for nodes this controller has only seen
  in the replayed history, the window starts when it started watching, so a control plane restarted in
  the middle of such an outage holds too.  The "on their way" part matters: when every heartbeat stops at
  once, the nodes time out one by one over a heartbeat interval, and the first one must already be held;
* *evidence that the silence is ours*: no heartbeat has arrived from ANY node for more than half the
  window (a node that dies alone leaves the others heartbeating, every agent interval being well under
  half the node timeout: 2 s against 6 s by default), or the state reader lags behind the heartbeats
  topic (``StateFeeder.lag_reason``);
* both -> **hold**: the nodes that went offline are treated as online (their replicas stay where they
  are, nothing is removed from their assignments, no ``moved``/``node_offline`` churn); an event
  ``liveness_guard`` says why, health reports it, ``sie_control_liveness_guard`` is 1;
* **release** once the evidence has been gone for one full liveness window (heartbeats flow again and
  the reader keeps up): nodes heard again are online; those still silent are taken as truly offline
  (``liveness_guard_released``), and their replicas move as usual.

A node that dies alone (the others keep heartbeating, the reader keeps up) is never held: there is no
evidence, so it moves in the usual time.  Pure and clock-driven: unit tests call ``assess`` with times.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GuardDecision:
    """What one pass must do: treat ``holding`` as online; publish ``engaged``/``released`` as events."""

    holding: frozenset[str] = frozenset()
    reason: str | None = None
    engaged: str | None = None
    released: str | None = None


@dataclass
class _Hold:
    since: float
    suspects: set[str]
    reason: str
    calm_since: float | None = None
    back: set[str] = field(default_factory=set)


class MassOfflineGuard:
    """Tracks one hold at a time (module docstring).  ``fraction`` in (0, 1]: 1.0 holds only when every
    node that was online went silent."""

    def __init__(self, window_s: float, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"mass_offline_fraction: must be > 0 and <= 1 (got {fraction})")
        self.window_s = window_s
        self.fraction = fraction
        self._hold: _Hold | None = None
        self._acknowledged: set[str] = set()  # released as truly offline: never held again until back
        self._watching_since: float | None = None

    @property
    def holding(self) -> bool:
        return self._hold is not None

    def status(self) -> dict[str, object]:
        hold = self._hold
        if hold is None:
            return {"ok": True, "detail": "not holding"}
        calm = "" if hold.calm_since is None else "; heartbeats flow again, releasing after one liveness window"
        return {"ok": False, "detail": hold.reason + calm, "holding": sorted(hold.suspects - hold.back),
                "since": hold.since}

    def assess(self, now: float, alive_at: Mapping[str, float | None], online: Set[str],
               lag: str | None = None) -> GuardDecision:
        """``alive_at``: every registered node -> its latest proof of life (None: never heard);
        ``online``: the nodes alive within the timeout; ``lag``: why the state reader lags, if it does."""
        if self._watching_since is None:
            self._watching_since = now
        self._acknowledged -= set(online)
        window, quiet_limit = self.window_s, self.window_s / 2
        recent = {
            n for n, at in alive_at.items()
            if n not in online and n not in self._acknowledged and at is not None
            and max(at, self._watching_since - window) + 2 * window > now
        }
        fading = {n for n in online if (at := alive_at.get(n)) is not None and now - at > quiet_limit}
        heard = [at for at in alive_at.values() if at is not None]
        quiet = now - max(heard) if heard else None
        evidence = lag or (f"no heartbeat has arrived from any node for {quiet:.0f}s"
                           if quiet is not None and quiet > quiet_limit else None)
        hold = self._hold
        if hold is None:
            suspects = recent | fading
            base = len(online) + len(recent)
            if recent and evidence and len(suspects) >= self.fraction * base:
                reason = (f"{len(suspects)} of {base} nodes went offline or silent within {window:g}s while "
                          f"{evidence}: treating them as online (nothing moves) until heartbeats flow again")
                self._hold = _Hold(now, set(suspects), reason)
                return GuardDecision(frozenset(recent), reason, engaged=f"{reason}; holding {_names(suspects)}")
            return GuardDecision()
        hold.suspects |= recent  # a node going silent while we hold is held too
        hold.back = {n for n in hold.suspects if n in online}
        if evidence:
            hold.calm_since = None
        elif hold.calm_since is None:
            hold.calm_since = now
        if hold.calm_since is not None and now - hold.calm_since >= window:
            silent = {n for n in hold.suspects if n not in online and n in alive_at}
            self._acknowledged |= silent
            self._hold = None
            detail = (f"heartbeats flow again: {len(hold.back)} of {len(hold.suspects)} held nodes are back"
                      + (f"; still silent after {window:g}s, taken as offline: {_names(silent)}" if silent else ""))
            return GuardDecision(released=detail)
        waiting = hold.suspects - hold.back
        return GuardDecision(frozenset(waiting), hold.reason)


def _names(nodes: set[str], shown: int = 10) -> str:
    ordered = sorted(nodes)
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more
