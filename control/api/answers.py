"""The fixed-shape answers of the control API's writes, declared once: a route builds its body from one of these
and the OpenAPI document shows it (``response_model``).  The reads' shapes are in ``views``."""

from __future__ import annotations

from pydantic import BaseModel


class Applied(BaseModel):
    """``POST /v1/models``: the spec is on the specs topic; the leader reconciles it."""

    name: str
    version: str
    accepted: bool = True
    status: str
    warnings: list[str]


class RolloutStarted(Applied):
    """``POST /v1/models`` of a new version whose spec asks for a rollout: the leader moves traffic step by step."""

    rollout: str


class Scaled(BaseModel):
    """``POST /v1/models/{name}/scale``: the applied spec re-published with the asked-for count."""

    name: str
    version: str
    accepted: bool = True
    change: str
    min_replicas: int
    max_replicas: int
    status: str


class Deleted(BaseModel):
    """``DELETE /v1/models/{name}``, ``DELETE /v1/connectors/{name}``: the tombstone is on its topic."""

    name: str
    deleted: bool = True


class Accepted(BaseModel):
    """``POST /v1/nodes/{name}/forget``: the request is on the events topic; ``status`` shows its effect."""

    name: str
    accepted: bool = True
    status: str


class ConnectorState(BaseModel):
    """``POST /v1/connectors/{name}/pause|resume``: the connector as published."""

    name: str
    paused: bool
    accepted: bool = True


class ConnectorApplied(ConnectorState):
    """``POST /v1/connectors``: the connector is on its topic (a re-apply keeps it paused if it was)."""

    status: str
