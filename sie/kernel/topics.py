"""Every topic SIE owns: names, cleanup policy, partitions.

System topics carry control-plane state and events; their names are
``<prefix>.<name>``.  Each model gets request/result/dead-letter topics whose
default names derive from the model name (``<prefix>.model.<name>.requests``);
a spec may override them.  ``docs/architecture.md`` documents who writes and
who reads each.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TopicSpec:
    """A topic as SIE wants it to exist."""

    name: str
    partitions: int
    compacted: bool
    purpose: str
    config: dict[str, str] = field(default_factory=dict)

    def topic_config(self, min_insync_replicas: int | None) -> dict[str, str]:
        config = {"cleanup.policy": "compact" if self.compacted else "delete", **self.config}
        if min_insync_replicas is not None:
            config["min.insync.replicas"] = str(min_insync_replicas)
        return config


# name suffix -> (partitions, compacted, purpose, extra config)
_SYSTEM = [
    ("specs", 1, True, "ModelService specs, key = model name; tombstone = deleted", {}),
    ("nodes", 1, True, "node registry: inventory of each node (CPU, memory, GPUs), key = node", {}),
    ("heartbeats", 3, False, "agent heartbeats with GPU metrics, key = node", {"retention.ms": str(6 * 3600 * 1000)}),
    ("assignments", 3, True, "desired replicas per node published by the control plane, key = node", {}),
    ("replica-status", 3, False, "replica state changes reported by agents, key = replica id", {}),
    ("events", 1, False, "control-plane decisions and failures (placements, evictions, unschedulable)", {}),
    ("control-leader", 1, True, "control-plane leadership epochs, key = cluster", {}),
    ("model-status", 1, True, "desired vs actual per model published by the leading control plane, key = model", {}),
    ("backfill-plans", 1, True, "the bounded range of each backfill job, fixed at its start, key = job id", {}),
]


def system_topics(prefix: str = "sie") -> list[TopicSpec]:
    """SIE's system topics for a prefix."""
    return [TopicSpec(f"{prefix}.{suffix}", parts, compacted, purpose, dict(cfg)) for suffix, parts, compacted, purpose, cfg in _SYSTEM]


def system_topic(name: str, prefix: str = "sie") -> str:
    """Full name of a system topic, e.g. ``system_topic("specs") == "sie.specs"``."""
    known = {suffix for suffix, *_ in _SYSTEM}
    if name not in known:
        raise KeyError(f"unknown system topic {name!r}; known: {sorted(known)}")
    return f"{prefix}.{name}"


@dataclass(frozen=True)
class ModelTopics:
    """The data-path topics of one model."""

    requests: str
    results: str
    dead_letters: str
    backfill_results: str

    @classmethod
    def default_for(cls, model_name: str, prefix: str = "sie") -> "ModelTopics":
        base = f"{prefix}.model.{model_name}"
        return cls(f"{base}.requests", f"{base}.results", f"{base}.dlq", f"{base}.backfill")
