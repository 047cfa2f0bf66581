"""Replica demand: what one replica of a model asks of a node, derived from its ModelService spec.

WHY a separate value: the placer must not depend on the spec's full shape (schemas, backends,
topics); it needs only resources, constraints and priority. Replica ids are stable
(``<model>-<index>``) so the same replica keeps its place across passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PRIORITIES = ("P0", "P1", "P2")
#: a model's label choosing between packing and spreading its replicas (docs/control-plane.md, "Pack or spread")
PLACEMENT_LABEL = "sie.lmsys.org/placement"


@dataclass(frozen=True)
class ReplicaDemand:
    """One replica to place. ``gpus > 0`` = that many whole GPUs; else ``gpu_memory_mb`` on one shared GPU;
    both 0 = CPU-only model. ``node_selector`` is a sorted tuple of (key, value) pairs (hashable).
    ``memory_mb`` is the spec's declared host memory (0 = not declared); ``backend`` its backend type ("" for
    what is not a model, e.g. a connector), which decides whether it may share a worker process.  ``spread``:
    place it where the fewest replicas are (True) or fill nodes and GPUs first (False, ``binpack``)."""

    model: str
    index: int
    version: str = "1"
    priority: str = "P1"
    gpu_memory_mb: int = 0
    gpus: int = 0
    cpu: float = 1.0
    memory_mb: int = 0
    node_selector: tuple[tuple[str, str], ...] = ()
    tier: str | None = None
    backend: str = ""
    spread: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("ReplicaDemand.model: must not be empty")
        if self.priority not in PRIORITIES:
            raise ValueError(f"ReplicaDemand.priority: must be one of {PRIORITIES} (got {self.priority!r})")
        for name in ("index", "gpu_memory_mb", "gpus", "memory_mb"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"ReplicaDemand.{name}: must be >= 0 (got {value})")
        if self.cpu < 0:
            raise ValueError(f"ReplicaDemand.cpu: must be >= 0 (got {self.cpu})")
        selector: Iterable[tuple[Any, Any]] = self.node_selector  # callers may pass a mapping
        if isinstance(selector, Mapping):
            selector = selector.items()
        object.__setattr__(self, "node_selector", tuple(sorted((str(k), str(v)) for k, v in selector)))

    @property
    def replica_id(self) -> str:
        return f"{self.model}-{self.index}"

    @property
    def selector(self) -> dict[str, str]:
        return dict(self.node_selector)

    @property
    def priority_rank(self) -> int:
        return PRIORITIES.index(self.priority)


def make_demands(model: str, replicas: int = 1, **fields: Any) -> list[ReplicaDemand]:
    """``replicas`` demands ``<model>-0 .. <model>-(n-1)`` with the same resources (tests, benches)."""
    return [ReplicaDemand(model=model, index=i, **fields) for i in range(replicas)]


def asked_placement(spec: Any, pack_tiers: Iterable[str] = ()) -> bool | None:
    """What ``spec`` asks for, spread (True) or pack (False): the label ``sie.lmsys.org/placement: pack|spread``
    decides; else a model asking for a tier in ``pack_tiers`` packs; else None (the caller's default).  Placing new
    replicas (``spreads_on_place``) and moving them back ("Spread restored") differ only in that default."""
    label = (getattr(spec, "labels", None) or {}).get(PLACEMENT_LABEL)
    if label in ("spread", "pack"):
        return bool(label == "spread")
    if spec.scheduling.tier and spec.scheduling.tier in tuple(pack_tiers):
        return False
    return None


def spreads_on_place(spec: Any, pack_tiers: Iterable[str] = ()) -> bool:
    """Whether a new replica of ``spec`` is spread over the nodes rather than packed: as asked
    (``asked_placement``); else CPU-only models spread and GPU models pack (whole GPUs and GPU memory kept in big
    holes)."""
    asked = asked_placement(spec, pack_tiers)
    if asked is not None:
        return asked
    return not int(spec.resources.gpus) and not int(spec.resources.gpu_memory_mb)


def demands_from_spec(spec: Any, replicas: int | None = None, pack_tiers: Iterable[str] = ()) -> list[ReplicaDemand]:
    """The replicas to place now for a ModelService: ``replicas`` of them (the autoscaler's count), or
    ``sla.min_replicas`` when not given.  Ids are ``<model>-0 .. <model>-(n-1)``: scaling down removes the
    highest index, so the replicas that stay keep their ids and places.  Reads only the agreed attributes of
    ``sie.schemas.spec.ModelService`` (duck-typed, so tests can pass a small stand-in).
    """
    res = spec.resources
    sched = spec.scheduling
    replicas = max(0, int(spec.sla.min_replicas if replicas is None else replicas))  # 0 = scaled to zero (long tail)
    return make_demands(
        spec.name,
        replicas,
        version=str(spec.version),
        priority=spec.priority_level,
        gpu_memory_mb=int(res.gpu_memory_mb),
        gpus=int(res.gpus),
        cpu=float(res.cpu),
        memory_mb=int(res.memory_mb),
        node_selector=tuple(dict(sched.node_selector or {}).items()),
        tier=sched.tier,
        backend=str(spec.backend.type),
        spread=spreads_on_place(spec, pack_tiers),
    )
