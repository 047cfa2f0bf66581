"""Host memory one replica costs on a node: its spec's ``memoryMb`` plus the memory of the process it runs in.

WHY an overhead at all: a worker process holds far more than its model (torch and its libraries, one Kafka
consumer and producer), so a node packed by declared ``memoryMb`` alone runs out of host memory long before
placement thinks it is full (docs/control-plane.md, "Placement with host memory"). A model added to a shared
multi-model process costs only its own share (docs/density.md; ``bench/bench_density.py`` measures it).

WHY one module: the rule deciding which overhead a replica pays (``process_overhead_mb``) is read by the
placer for packing, for the reason of an unplaced replica and for preemption; a second copy would let them
disagree about whether a replica fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.inventory import NodeState
from sie.schemas.spec_models import may_share_process


@dataclass(frozen=True)
class HostOverheads:
    """Host memory (MiB) of a worker process beyond its model's declared ``memoryMb``.

    ``process_mb``: a worker process of its own (``SIE_PROCESS_OVERHEAD_MB``).
    ``model_mb``: one more model in a shared multi-model process (``SIE_MODEL_OVERHEAD_MB``).
    ``HostOverheads()`` counts nothing: a bare ``place()`` packs declared memory only.
    """

    process_mb: int = 0
    model_mb: int = 0

    def __post_init__(self) -> None:
        if self.process_mb < 0 or self.model_mb < 0:
            raise ValueError(f"HostOverheads: process_mb/model_mb must be >= 0 (got {self.process_mb}/{self.model_mb})")

    @classmethod
    def from_settings(cls, settings: Any) -> HostOverheads:
        """``SIE_PROCESS_OVERHEAD_MB`` / ``SIE_MODEL_OVERHEAD_MB`` of ``sie.kernel.settings.Settings``."""
        return cls(process_mb=int(settings.process_overhead_mb), model_mb=int(settings.model_overhead_mb))

    @classmethod
    def defaults(cls) -> HostOverheads:
        """The settings' defaults, without reading the environment (a controller built without settings)."""
        from sie.kernel.settings import Settings

        fields = Settings.model_fields
        return cls(process_mb=int(fields["process_overhead_mb"].default), model_mb=int(fields["model_overhead_mb"].default))


def shares_process(demand: ReplicaDemand, node: NodeState) -> bool:
    """Does ``demand`` run in a shared multi-model process on ``node``?  Only where the node's agent runs
    shared processes (``process_slots > 0``) and only replicas ``may_share_process`` allows (the agent's
    launcher asks the same rule)."""
    return bool(node.process_slots) and may_share_process(demand.priority, demand.backend, demand.gpus)


def process_overhead_mb(demand: ReplicaDemand, node: NodeState, overheads: HostOverheads) -> int:
    """THE rule for the host memory a replica's process costs on ``node`` beyond its declared ``memoryMb``.

    - The node's agent does not say how it runs replicas (``process_slots is None``: an agent older than
      host-memory reporting): 0. What it costs is unknown there, so it is not a constraint: such a node is
      packed by declared ``memoryMb`` against its registered memory.
    - The replica shares a process (``shares_process``: P1/P2, torch/python, no whole GPU, on a node with
      shared processes): ``overheads.model_mb``. The shared process's own base is not split among its models
      here; an agent that wants it counted reports it as held memory (``reserved_memory_mb``).
    - Otherwise (every P0 replica, sglang, whole-GPU models, nodes without shared processes):
      ``overheads.process_mb``, a worker process of its own.
    """
    if node.process_slots is None:
        return 0
    return overheads.model_mb if shares_process(demand, node) else overheads.process_mb


def host_memory_mb(demand: ReplicaDemand, node: NodeState, overheads: HostOverheads) -> int:
    """All the host memory ``demand`` holds on ``node``: declared ``memoryMb`` + its process overhead."""
    return demand.memory_mb + process_overhead_mb(demand, node, overheads)


def describe_need(demand: ReplicaDemand, node: NodeState, overheads: HostOverheads) -> str:
    """``604 MiB host memory (25 MiB declared + 579 MiB process overhead)`` for an unplaced replica's reason."""
    overhead = process_overhead_mb(demand, node, overheads)
    total = demand.memory_mb + overhead
    if not overhead:
        return f"{total} MiB host memory"
    kind = "shared-process overhead" if shares_process(demand, node) else "process overhead"
    return f"{total} MiB host memory ({demand.memory_mb} MiB declared + {overhead} MiB {kind})"
