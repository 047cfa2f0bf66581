"""The control plane's configuration: ``ControlConfig``, its defaults and its YAML file.

``ControlConfig.from_yaml`` reads the article's ``control-plane-config.yaml`` plus SIE's ``control:`` section
(the autoscaler's and the traffic director's policies included); ``sie control`` passes CLI options as
overrides.  A value that is out of range or of the wrong type is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.control.reconcile.autoscaler import AutoscalePolicy, policy_numbers
from sie.control.reconcile.director import DirectorPolicy
from sie.control.reconcile.rebalance import RebalancePolicy


@dataclass(frozen=True)
class ControlConfig:
    """Timings and policy of the control plane (``control-plane-config.yaml`` + CLI options).

    ``node_timeout_s``: a node silent this long is offline and its replicas move (protocol: 6 s).
    ``failure_cooldown_s``: after a replica reports FAILED on a node, it is kept off that node this long.
    ``reconcile_interval_s``: how often the loop runs (it also runs soon after a change is seen).
    ``strategy``: only ``binpack`` exists (the article's default).
    ``preemption``: a P0 (then P1) replica that finds no room evicts the cheapest set of lower-priority
    replicas on one node (docs/control-plane.md, "Placement: the rules"); False: it stays unschedulable.
    ``autoscale``: the autoscaler's policy (``autoscaler.AutoscalePolicy``); ``backlog_interval_s``: how often
    each autoscaled model's backlog is sampled, ``backlog_window_s``: the window its rates are measured over
    (``signals.BacklogSampler``).
    ``mass_offline_fraction``: when at least this fraction of the nodes that were online go offline within
    one ``node_timeout_s`` while no heartbeat arrives from any node or the state reader lags, the leader
    holds their replicas where they are instead of removing them (``liveness.MassOfflineGuard``); 1.0 holds
    only when every node goes silent.  Default 0.5: losing half the cluster at once is rarer than losing
    sight of it.
    ``node_forget_after_s``: a node offline this long is forgotten (``sie node forget`` by the leader itself: its
    registration and assignment tombstoned, gone from ``sie get nodes``, the status and ``SieNodeOffline``);
    0 = never.  Default one day.
    """

    node_timeout_s: float = 6.0
    failure_cooldown_s: float = 300.0
    reconcile_interval_s: float = 1.0
    strategy: str = "binpack"
    mass_offline_fraction: float = 0.5
    preemption: bool = True
    autoscale: AutoscalePolicy = AutoscalePolicy()
    backlog_interval_s: float = 2.0
    backlog_window_s: float = 10.0
    #: the traffic director's rule over each model's replicas (``director.DirectorPolicy``; None: off)
    director: DirectorPolicy | None = DirectorPolicy()
    node_forget_after_s: float = 86400.0
    #: moving replicas back toward the spread (``rebalance.RebalancePolicy``; ``enabled: false`` packs every model)
    rebalance: RebalancePolicy = RebalancePolicy()
    #: how often a pass plans every model and checks the state kept between passes against it (``incremental``);
    #: the passes between plan only the models whose inputs changed
    full_check_s: float = 300.0

    def __post_init__(self) -> None:
        from sie.kernel.errors import ConfigError

        if not 0.0 < self.mass_offline_fraction <= 1.0:
            raise ConfigError(f"control.mass_offline_fraction: must be > 0 and <= 1 (got {self.mass_offline_fraction})")
        if self.node_timeout_s <= 0:
            raise ConfigError(f"control.node_timeout_s: must be > 0 (got {self.node_timeout_s})")
        if self.node_forget_after_s < 0:
            raise ConfigError(f"control.node_forget_after_s: must be >= 0, 0 = never (got {self.node_forget_after_s})")
        for key in ("backlog_interval_s", "backlog_window_s", "full_check_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"control.{key}: must be > 0 (got {getattr(self, key)})")

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> ControlConfig:
        """Read the article's control-plane-config.yaml (``scheduling.strategy``,
        ``monitoring.interval_seconds``) plus SIE's ``control:`` section (with ``control.autoscale:``, the
        ``AutoscalePolicy`` fields, and ``control.preemption``); unknown keys are ignored."""
        import yaml

        from sie.kernel.errors import ConfigError

        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the control-plane config: {exc}") from None
        values: dict[str, Any] = {}
        strategy = (doc.get("scheduling") or {}).get("strategy")
        if strategy is not None:
            if strategy != "binpack":
                raise ConfigError(f"{path}: scheduling.strategy: only 'binpack' is supported (got {strategy!r})")
            values["strategy"] = strategy
        control = doc.get("control") or {}
        for key in ("node_timeout_s", "failure_cooldown_s", "reconcile_interval_s", "mass_offline_fraction",
                    "backlog_interval_s", "backlog_window_s", "node_forget_after_s", "full_check_s"):
            if key in control:
                try:
                    values[key] = float(control[key])
                except (TypeError, ValueError):
                    raise ConfigError(f"{path}: control.{key}: must be a number (got {control[key]!r})") from None
        if "director" in control:
            director = control["director"]
            values["director"] = None if director is False else DirectorPolicy(**policy_numbers(
                DirectorPolicy, director if isinstance(director, dict) else None, f"{path}: control.director"))
        if "preemption" in control:
            if not isinstance(control["preemption"], bool):
                raise ConfigError(f"{path}: control.preemption: must be true or false (got {control['preemption']!r})")
            values["preemption"] = control["preemption"]
        if "rebalance" in control:
            values["rebalance"] = _rebalance_policy(control["rebalance"], f"{path}: control.rebalance")
        autoscale = control.get("autoscale") or {}
        if autoscale:
            values["autoscale"] = AutoscalePolicy(**policy_numbers(AutoscalePolicy, autoscale, f"{path}: control.autoscale"))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _rebalance_policy(doc: Any, where: str) -> RebalancePolicy:
    """``control.rebalance``: ``false`` (no moves), or ``{enabled, min_interval_s, step_timeout_s, backoff_s,
    pack_tiers}``."""
    from sie.kernel.errors import ConfigError

    if doc is False:
        return RebalancePolicy(enabled=False)
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: false, or a mapping of enabled, min_interval_s, step_timeout_s, backoff_s, "
                          f"pack_tiers (got {doc!r})")
    known = {"enabled", "min_interval_s", "step_timeout_s", "backoff_s", "pack_tiers"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    if "enabled" in doc:
        if not isinstance(doc["enabled"], bool):
            raise ConfigError(f"{where}.enabled: must be true or false (got {doc['enabled']!r})")
        values["enabled"] = doc["enabled"]
    for key in ("min_interval_s", "step_timeout_s", "backoff_s"):
        if key in doc:
            try:
                values[key] = float(doc[key])
            except (TypeError, ValueError):
                raise ConfigError(f"{where}.{key}: must be a number (got {doc[key]!r})") from None
            if values[key] < 0:
                raise ConfigError(f"{where}.{key}: must be >= 0 (got {doc[key]!r})")
    if "pack_tiers" in doc:
        tiers = doc["pack_tiers"]
        if not isinstance(tiers, list) or not all(isinstance(t, str) for t in tiers):
            raise ConfigError(f"{where}.pack_tiers: a list of tier names (got {tiers!r})")
        values["pack_tiers"] = tuple(tiers)
    return RebalancePolicy(**values)
