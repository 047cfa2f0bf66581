"""The reconcile core: the cluster as the control topics say it is, and the leader's level-triggered pass over it.

- ``records``: pure records and the fold of the control topics into ``ClusterState``/``StateSnapshot``.
- ``feeder``: ``StateFeeder``, the thread that reads the control topics into ``ClusterState``.
- ``controller``: one reconcile pass (``Controller``: its steps in order, and the state kept between passes);
  ``config`` its YAML config, ``ports`` the protocols it is handed (publisher, leadership, state, signals,
  rollouts) and their null objects, ``report`` what a pass decided.
- the steps, pure functions over the snapshot: ``cooldowns`` (failures), ``nodes`` (inventory, forgetting),
  ``scaling`` (counts; the rule in ``counts``), ``demands`` (replicas wanted), ``assignments`` (placement,
  Assignment records), ``narration`` (events and reasons), ``publishing`` (statuses, stamping), ``takeover``
  (when a pass may act, what a new term continues from).
- ``leader``: leader election and the transactional publisher; ``liveness``: the mass-offline guard.
- ``autoscaler``, ``director``, ``signals``: elasticity (replica counts, hot replicas, backlog samples).
- ``connectors``: connectors as replicas; ``status``: ``ModelStatus``; ``observability``: numbers for the API.

May import ``placement`` (and ``sie.streams.eos``, ``sie.schemas``, ``sie.kernel``); never ``rollout`` or ``api``:
the rollout room plugs in through ``ports.RolloutView``.
"""
