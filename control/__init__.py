"""The control plane: which model replica runs on which node and GPU, kept true by one leader's reconcile loop.

Four rooms, each importing only the rooms below it (import-linter contracts in pyproject.toml):

- ``api/``: the HTTP surface: routes, tokens and roles (``auth``), the status page and its static files,
  the audit writer, the ASGI request guard and the uvicorn server thread.
- ``rollout/``: moving a model from one version to the next: the state machine, the canary gates, the
  leader's driver over the rollouts topic and the service the API and the reconcile pass call.
- ``reconcile/``: the core: cluster state rebuilt from the control topics (``records``, ``feeder``), the
  controller and its ports, leader election, liveness, autoscaler, traffic director, signals, connectors
  as replicas, model status and observability.
- ``placement/``: pure and deterministic (no I/O, no clock): node inventory, replica demand, host memory,
  the placement engine and the rollout capacity plan.

``service`` (``ControlService``) wires the rooms into the running process ``sie control`` starts.
"""
