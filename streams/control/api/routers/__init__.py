"""The control API's routes, one ``APIRouter`` per resource; ``routes.create_app`` includes them all.

- ``cluster``: ``/healthz``, ``/metrics``, ``/openapi.json``, ``/v1/events``, ``/v1/prometheus/targets``
- ``models``: ``/v1/models`` (apply, read, scale, delete)
- ``rollouts``: ``/v1/rollouts`` (read, steer)
- ``nodes``: ``/v1/nodes`` (read, forget)
- ``replicas``: ``/v1/replicas`` (read, the worker log through the agent)
- ``artifacts``: ``/v1/artifacts`` (read a manifest, upload)
- ``connectors``: ``/v1/connectors`` (apply, read, pause, resume, delete)
"""
