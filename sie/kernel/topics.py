"""Every system topic SIE owns, as it should exist: partitions, cleanup policy, purpose.

Names come from ``sie.kernel.names`` (the one place that builds them).  System topics carry
control-plane state and events; a model's data-path topics are created when its spec is applied
(``sie.kernel.admin.ensure_model_topics``).  ``docs/architecture.md`` documents who writes and who
reads each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sie.kernel.names import SYSTEM_TOPICS, Names


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


#: compacted control topics that every control plane (and, for assignments, every agent) replays from the beginning
#: at start: the broker compacts only closed segments, and a segment closes at 1 GiB or after 7 days by default,
#: so without this a replay reads every record ever written (docs/control-plane.md, "Scale").  A segment closed
#: after an hour of writes is compacted once a tenth of the log is dirty: a replay reads the live records, about an
#: hour of changes and the open segment.
_REPLAYED = {"segment.ms": str(3600 * 1000), "min.cleanable.dirty.ratio": "0.1"}

# name suffix -> (partitions, compacted, purpose, extra config)
_SYSTEM = [
    ("specs", 1, True, "ModelService specs, key = model name; tombstone = deleted", _REPLAYED),
    ("nodes", 1, True, "node registry: inventory of each node (CPU, memory, GPUs), key = node", _REPLAYED),
    # LogAppendTime: a heartbeat's timestamp is the broker's, never the agent's clock (replayed heartbeats
    # count as seen at that time; an agent whose clock is off cannot look dead or alive because of it)
    ("heartbeats", 3, False, "agent heartbeats with GPU metrics, key = node",
     {"retention.ms": str(6 * 3600 * 1000), "message.timestamp.type": "LogAppendTime"}),
    ("assignments", 3, True, "desired replicas per node published by the control plane, key = node", _REPLAYED),
    ("replica-status", 3, False, "replica state changes reported by agents, key = replica id", {}),
    ("events", 1, False, "control-plane decisions and failures (placements, evictions, unschedulable)", {}),
    ("control-leader", 1, True, "control-plane leadership epochs, key = cluster", _REPLAYED),
    ("model-status", 1, True, "desired vs actual per model published by the leading control plane, key = model",
     _REPLAYED),
    ("backfill-plans", 1, True, "the bounded range of each backfill job, fixed at its start, key = job id", {}),
    # content-addressed: a manifest (small, one partition, read whole by every lookup) is written only after
    # every chunk of its artifact was acknowledged; chunks of one artifact share a partition (a contiguous
    # range the manifest names), so a fetch reads that range and nothing else
    ("artifacts", 1, True, "artifact manifests (size, chunks, where they are), key = sha256:<hex>", {}),
    ("artifact-chunks", 3, True, "artifact bytes in chunks, key = sha256:<hex>/<index>", {}),
    ("connectors", 1, True, "CDC connectors applied through the control plane (spec, paused), key = name",
     _REPLAYED),
    ("rollouts", 1, True, "each model's rollout (phase, version weights + epoch, timeline), key = model", _REPLAYED),
]


def system_topics(prefix: str = "sie") -> list[TopicSpec]:
    """SIE's system topics for a prefix."""
    names = Names(prefix)
    return [TopicSpec(names.system_topic(suffix), parts, compacted, purpose, dict(cfg))
            for suffix, parts, compacted, purpose, cfg in _SYSTEM]


def system_topic(name: str, prefix: str = "sie") -> str:
    """Full name of a system topic, e.g. ``system_topic("specs") == "sie.specs"``."""
    return Names(prefix).system_topic(name)


assert {suffix for suffix, *_ in _SYSTEM} == set(SYSTEM_TOPICS), "sie.kernel.names.SYSTEM_TOPICS is out of date"
