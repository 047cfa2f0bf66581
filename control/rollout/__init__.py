"""Rollouts: one model moving from a stable version to a new one, step by step, behind canary gates.

- ``machine``: the pure rollout state machine (``Rollout``, ``Phase``, ``TRANSITIONS``).
- ``gates``: the sequential tests that pass or fail a canary step.
- ``driver``: the leader's driver: the rollouts topic, the weights it publishes, the version windows.
- ``service``: ``Rollouts``, what the API and the reconcile pass call (implements ``reconcile.ports.RolloutView``).

The replica plan during a rollout is a pure placement decision (``placement.rollout_capacity``).  May import
``reconcile`` and ``placement``; never ``api``.
"""
