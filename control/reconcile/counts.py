"""A model's replica count: ``desired_count``, the one rule every count of the reconcile loop goes through.

A pass decides a count in layers (step 3, ``scaling``); each site passes the layers it has::

    base    = the autoscaler's count when there is one, else max(0, sla.min_replicas)
    count   = max(0, base, director_floor, rebalance_floor)     floors only raise a count
    desired = count + surge                                     a rollout's trial replica (surge 1)

The layers come from:

==================  =====================================================================  =========================
layer               rule                                                                   decided in
==================  =====================================================================  =========================
``autoscaled``      min..max replicas, P0 never below one, scale to zero after idle;      ``autoscaler.decide``
                    a fixed-size model (``can_scale`` False): the low end of its range;
                    a standby: the leader's last published decision; no signal source:
                    None (the spec's minimum)
``director_floor``  one replica more than the count, on a cooler node, at most ``ceiling``  ``director.replica_lever``
``rebalance_floor`` a move's replacement replica (count + 1) while it warms up              ``rebalance.Rebalancer``
``surge``           the trial replica a rollout places to see whether a surge fits        ``demands``
==================  =====================================================================  =========================

Pure functions over a spec (duck-typed: ``spec.sla.min_replicas``/``max_replicas``, ``spec.priority_level``);
no state, no I/O.
"""

from __future__ import annotations

from typing import Any

from sie.control.reconcile.autoscaler import ModelInputs, bounds


def desired_count(spec: Any, autoscaled: int | None = None, *, director_floor: int = 0, rebalance_floor: int = 0,
                  surge: int = 0) -> int:
    """The replicas ``spec``'s model should have (module docstring: the layers).  ``autoscaled`` None: the
    spec's ``sla.min_replicas``; a negative number counts as zero."""
    base = int(spec.sla.min_replicas) if autoscaled is None else int(autoscaled)
    return max(0, base, int(director_floor), int(rebalance_floor)) + max(0, int(surge))


def scale_range(spec: Any) -> tuple[int, int]:
    """(lowest, highest) count the autoscaler may choose for ``spec`` (``autoscaler.bounds``: P0 never below
    one; the highest never below the lowest)."""
    lo, hi, _ = bounds(ModelInputs(str(getattr(spec, "name", "")), str(spec.priority_level), int(spec.sla.min_replicas),
                                   int(spec.sla.max_replicas)))
    return lo, hi


def can_scale(spec: Any) -> bool:
    """Whether the autoscaler has a count to decide (min != max after the P0 rule); a fixed-size model has not."""
    lo, hi = scale_range(spec)
    return lo != hi


def ceiling(spec: Any) -> int:
    """The most replicas anything may add up to (the director's bound): ``sla.max_replicas``, never below
    ``sla.min_replicas``."""
    return max(int(spec.sla.max_replicas), int(spec.sla.min_replicas))
