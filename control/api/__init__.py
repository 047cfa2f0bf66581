"""The control plane's HTTP API: what operators and the CLI call, and the status page.

- ``routes``: the FastAPI app (``create_app``) and the route table read from it (``route_table``).
- ``routers``: one ``APIRouter`` per resource (models, rollouts, nodes, replicas, artifacts, connectors, cluster).
- ``deps``: what routes get by dependency: the service, the caller and its role, the audited write, the list
  routes' query parameters.
- ``listing``: filtered, paged lists (``page``, the query checks, the phase and status enums) and the replica index
  built once per published statuses (``ListCache``).
- ``errors``: ``ApiError`` and the one error shape; ``answers``: the writes' answers (pydantic).
- ``auth``: tokens and roles (``TokenStore``), the CLI's token files.
- ``audit``: ``AuditLog``, one ``audit`` event per write on the events topic (a producer of its own).
- ``guard``: ``RequestGuard`` (ASGI: body size, body deadline, 500s without internals) and the header deadline.
- ``server``: ``ApiServer``, the uvicorn server thread (concurrency and header-size limits, TLS).
- ``status_page`` and ``static/``: the status page.

May import every other room of the control plane; none of them imports it.
"""
