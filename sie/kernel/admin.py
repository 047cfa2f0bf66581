"""Topic provisioning: make SIE's topics exist as ``sie.kernel.topics`` describes them.

``ensure_topics`` reconciles, Kubernetes-style: it reads what exists, creates
what is missing, fixes what is safe to fix (``cleanup.policy``) and reports
what is not (partition counts: shrinking is impossible and growing would move
keys between partitions, breaking compacted state and per-key order).  Running
it twice changes nothing the second time.

Replication: ``replication_factor`` argument, else ``settings.replication_factor``,
else 3 when the cluster has >= 3 brokers, else 1.  Topics replicated 3 times
get ``min.insync.replicas=2`` so an acks=all write survives one broker loss.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from sie.kernel.clients import KafkaClients, quiet_admin_config
from sie.kernel.errors import ConfigError, KafkaUnavailable, SieError
from sie.kernel.kafka_types import KafkaAdmin
from sie.kernel.names import Names
from sie.kernel.settings import Settings
from sie.kernel.topics import TopicSpec

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata


class Action(str, Enum):
    CREATED = "created"
    EXISTING = "existing"
    FIXED = "fixed"


@dataclass(frozen=True)
class TopicOutcome:
    """What ``ensure_topics`` found or did for one topic."""

    name: str
    partitions: int
    replication: int
    policy: str
    action: Action
    notes: tuple[str, ...] = ()  # mismatches it reported or fixed


@dataclass(frozen=True)
class EnsureReport:
    topics: tuple[TopicOutcome, ...]

    @property
    def created(self) -> list[str]:
        return [t.name for t in self.topics if t.action is Action.CREATED]

    @property
    def fixed(self) -> list[str]:
        return [t.name for t in self.topics if t.action is Action.FIXED]

    @property
    def existing(self) -> list[str]:
        return [t.name for t in self.topics if t.action is Action.EXISTING]

    @property
    def mismatches(self) -> list[str]:
        return [f"{t.name}: {note}" for t in self.topics for note in t.notes]

    def table(self) -> str:
        """A plain-text table: topic, partitions, replication, policy, action (+ notes)."""
        header = ("topic", "partitions", "replication", "policy", "action")
        rows = [(t.name, str(t.partitions), str(t.replication), t.policy,
                 t.action.value + (f" ({'; '.join(t.notes)})" if t.notes else "")) for t in self.topics]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows])


# ---- cluster helpers -----------------------------------------------------------------------------
# Every helper takes ``clients`` (``sie.kernel.clients.KafkaClients``): a component that was handed fakes
# makes its admin calls on them too (unit tests without a broker); None = the real librdkafka clients.
def admin_client(settings: Settings, clients: KafkaClients | None = None, **overrides: Any) -> KafkaAdmin:
    admin: KafkaAdmin = (clients or KafkaClients()).admin(quiet_admin_config(settings, **overrides))
    return admin


def watched_admin(settings: Settings, clients: KafkaClients | None = None) -> tuple[KafkaAdmin, list[Any]]:
    """An admin client plus the list its error callback fills with authentication failures (a refused
    SASL login shows only there, not in the failing call's exception)."""
    from sie.kernel.authz import AUTHENTICATION_ERRORS

    refused: list[Any] = []
    admin = admin_client(settings, clients,
                         error_cb=lambda err: refused.append(err) if err.name() in AUTHENTICATION_ERRORS else None)
    return admin, refused


def wait_for_cluster(settings: Settings, timeout: float = 30.0, clients: KafkaClients | None = None,
                     admin: KafkaAdmin | None = None, refused: list[Any] | None = None) -> ClusterMetadata:
    """Cluster metadata once any broker answers; KafkaUnavailable naming the servers otherwise, and
    ``NotAuthenticated`` within seconds when the cluster refuses our credentials (not after ``timeout``).
    ``admin``/``refused`` reuse a client from ``watched_admin``."""
    from confluent_kafka import KafkaException

    from sie.kernel.authz import NotAuthenticated

    if admin is None:
        admin, refused = watched_admin(settings, clients)
    refused = refused if refused is not None else []
    deadline = time.monotonic() + timeout
    while True:
        try:  # short calls: Ctrl-C is seen between them (a blocked C call holds the signal back)
            return admin.list_topics(timeout=max(0.2, min(1.0, deadline - time.monotonic())))
        except KafkaException as exc:
            # serve error_cb (an authentication failure shows there, not in the exception) and librdkafka's
            # log lines (sie.kafka logger: shown with `sie -v`)
            admin.poll(0.1)
            if refused:
                raise NotAuthenticated(settings.bootstrap_servers, settings.sasl_username, refused[-1].str()) from exc
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(
                    f"Kafka at {settings.bootstrap_servers} did not answer within {timeout:g}s "
                    f"({kafka_error_text(exc)}): start one with `sie kafka up` or set SIE_BOOTSTRAP_SERVERS"
                ) from None


def require_cluster(settings: Settings, clients: KafkaClients | None = None) -> ClusterMetadata:
    """What every command that needs Kafka calls first: the metadata within ``settings.connect_timeout_s``,
    else ``KafkaUnavailable`` with one line naming the servers (not a 30 s wait and a traceback)."""
    return wait_for_cluster(settings, settings.connect_timeout_s, clients)


def kafka_error_text(exc: BaseException) -> str:
    """The readable part of a ``KafkaException`` (``Local: Broker transport failure``), not its repr."""
    first = exc.args[0] if exc.args else exc
    text = first.str() if hasattr(first, "str") else str(first)
    return text.removeprefix("Failed to get metadata: ")


def cluster_broker_count(settings: Settings, timeout: float = 10.0) -> int:
    return len(wait_for_cluster(settings, timeout).brokers)


def resolve_replication(settings: Settings, broker_count: int, replication_factor: int | None = None) -> int:
    rf = replication_factor or settings.replication_factor or (3 if broker_count >= 3 else 1)
    if rf > broker_count:
        raise ConfigError(
            f"replication factor {rf} needs >= {rf} brokers but {settings.bootstrap_servers} has {broker_count}: "
            "set SIE_REPLICATION_FACTOR or start `sie kafka up --brokers 3`"
        )
    return rf


def min_insync_for(replication: int) -> int | None:
    return 2 if replication >= 3 else None


def topic_configs(settings: Settings, topic: str, timeout: float = 10.0, clients: KafkaClients | None = None,
                  admin: KafkaAdmin | None = None) -> dict[str, str]:
    """Effective config of a topic (``cleanup.policy``, ``min.insync.replicas``, ...)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = admin or admin_client(settings, clients)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
    return {name: entry.value for name, entry in entries.items()}


def wait_for_topics(settings: Settings, topics: Iterable[str], timeout: float = 30.0,
                    admin: KafkaAdmin | None = None) -> ClusterMetadata:
    """Until every partition of each topic has a leader, so a producer's first send does not fail.

    Returns the metadata (of every topic) in which they all appeared, as ``admin`` sees it: on a
    multi-broker cluster a new topic reaches each broker's metadata cache at its own pace, so a caller
    that goes on with the same client sees what was waited for.
    """
    admin = admin or admin_client(settings)
    pending = set(topics)
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
        pending = {
            t for t in pending
            if t not in md.topics or md.topics[t].error is not None
            or any(p.leader < 0 for p in md.topics[t].partitions.values())
        }
        if not pending:
            return md
        if time.monotonic() >= deadline:
            raise KafkaUnavailable(f"topics {sorted(pending)} have no leader after {timeout:.0f}s")
        time.sleep(0.05)


def delete_topics(settings: Settings, topics: Sequence[str], timeout: float = 30.0) -> list[str]:
    """Delete topics; ones that do not exist are skipped.  Returns the names deleted."""
    from confluent_kafka import KafkaError, KafkaException

    if not topics:
        return []
    admin = admin_client(settings)  # keep a reference: a destroyed client fails its pending futures
    futures = admin.delete_topics(list(topics), operation_timeout=timeout, request_timeout=timeout)
    deleted = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            deleted.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise SieError(f"deleting topic {name}: {exc.args[0].str()}") from exc
    return deleted


@dataclass(frozen=True)
class GroupProgress:
    """How far a consumer group has come on one topic: per partition, the next offset the group will read
    (its committed offset; the low watermark where it never committed, which is where ``earliest`` starts it)
    and the topic's end (the last stable offset: what a ``read_committed`` reader can reach)."""

    group: str
    topic: str
    committed: dict[int, int]
    ends: dict[int, int]

    @property
    def partitions(self) -> int:
        return len(self.ends)

    @property
    def committed_total(self) -> int:
        return sum(self.committed.get(p, 0) for p in self.ends)

    @property
    def end_total(self) -> int:
        return sum(self.ends.values())

    @property
    def lag(self) -> int:
        """Records appended but not yet committed by the group (the backlog)."""
        return sum(max(0, end - self.committed.get(p, end)) for p, end in self.ends.items())


def _offsets_topic_ready(admin: KafkaAdmin, group_id: str, topic: str, timeout: float) -> bool:
    """Whether group offsets can be asked for: False when ``__consumer_offsets`` does not exist (nothing was ever
    committed on this cluster); ``SieError`` (transient: the caller asks again later) while a partition of it has no
    leader.  WHY: librdkafka's ListConsumerGroupOffsets crashed the process (SIGSEGV, confluent-kafka 2.x) against a
    fresh broker whose offsets topic was still being created (its first coordinator lookup creates it); a
    DescribeTopics first never does."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    try:
        described = admin.describe_topics(TopicCollection(["__consumer_offsets"]), request_timeout=timeout)[
            "__consumer_offsets"].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        raise
    if not described.partitions or any(p.leader is None for p in described.partitions):
        raise SieError(f"progress of group {group_id} on {topic}: the cluster's offsets topic has partitions "
                       "without a leader yet (a fresh or recovering broker): asked again at the next sample")
    return True


def group_progress(admin: KafkaAdmin, group_id: str, topic: str, timeout: float = 5.0) -> GroupProgress:
    """Committed offsets of ``group_id`` and the ends of ``topic`` through one admin client (read-only: the
    group is never joined).  A topic that does not exist yet has no partitions (nothing waits on it);
    anything else that fails raises ``SieError`` naming the group and topic.

    WHY ``describe_topics`` and not ``list_topics(topic=...)``: an AdminClient's metadata request for one
    topic lets a broker with ``auto.create.topics.enable`` CREATE it, with the broker's default partition
    count; sampled right after ``sie apply``, before the worker created the model's topics, that left the
    request topic with one partition (and the autoscaler capped at one replica).  DescribeTopics never
    creates anything."""
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        IsolationLevel,
        KafkaError,
        KafkaException,
        TopicCollection,
        TopicPartition,
    )
    from confluent_kafka.admin import OffsetSpec

    try:
        try:
            described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(
                timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return GroupProgress(group_id, topic, {}, {})
            raise
        parts = [TopicPartition(topic, p.id) for p in sorted(described.partitions, key=lambda p: p.id)]
        committed: dict[int, int] = {}
        if _offsets_topic_ready(admin, group_id, topic, timeout):
            request = ConsumerGroupTopicPartitions(group_id, parts)
            done = admin.list_consumer_group_offsets([request], request_timeout=timeout)[group_id].result(
                timeout=timeout)
            committed = {tp.partition: tp.offset for tp in done.topic_partitions if tp.offset >= 0}

        def offsets(spec: OffsetSpec) -> dict[int, int]:
            futures = admin.list_offsets({tp: spec for tp in parts}, isolation_level=IsolationLevel.READ_COMMITTED,
                                         request_timeout=timeout)
            return {tp.partition: int(f.result(timeout=timeout).offset) for tp, f in futures.items()}

        ends = offsets(OffsetSpec.latest())  # type: ignore[no-untyped-call]
        for p, low in offsets(OffsetSpec.earliest()).items():  # type: ignore[no-untyped-call]
            committed[p] = max(committed.get(p, low), low)  # never committed, or behind retention: starts at low
        return GroupProgress(group_id, topic, committed, ends)
    except KafkaException as exc:
        raise SieError(f"progress of group {group_id} on {topic}: {exc.args[0].str()}") from exc


# ---- provisioning --------------------------------------------------------------------------------
#: topic configs a topic's readers depend on (besides cleanup.policy): drift is fixed, not only reported
_ENFORCED_CONFIGS = ("message.timestamp.type",)


def ensure_topics(
    settings: Settings,
    topics: Sequence[TopicSpec],
    replication_factor: int | None = None,
    timeout: float = 30.0,
    clients: KafkaClients | None = None,
) -> EnsureReport:
    """Create missing topics, fix cleanup.policy (and ``_ENFORCED_CONFIGS``) drift, report partition
    mismatches (idempotent)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin, refused = watched_admin(settings, clients)  # one client for every step: it sees what it created
    md = wait_for_cluster(settings, timeout, admin=admin, refused=refused)
    rf = resolve_replication(settings, len(md.brokers), replication_factor)
    min_isr = min_insync_for(rf)

    missing = [t for t in topics if t.name not in md.topics]
    _check_visible(admin, settings, missing, timeout)
    created: set[str] = set()
    if missing:
        futures = admin.create_topics(
            [NewTopic(t.name, num_partitions=t.partitions, replication_factor=rf, config=t.topic_config(min_isr))
             for t in missing],
            operation_timeout=timeout, request_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result(timeout=timeout)
                created.add(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent ensure won the race
                    raise SieError(f"creating topic {name}: {exc.args[0].str()}") from exc
        md = wait_for_topics(settings, [t.name for t in missing], timeout, admin)

    outcomes = []
    for spec in topics:
        wanted_policy = spec.topic_config(None)["cleanup.policy"]
        meta = md.topics[spec.name]
        partitions = len(meta.partitions)
        replication = len(next(iter(meta.partitions.values())).replicas) if meta.partitions else 0
        if spec.name in created:
            outcomes.append(TopicOutcome(spec.name, partitions, replication, wanted_policy, Action.CREATED))
            continue
        notes: list[str] = []
        if partitions < spec.partitions:
            notes.append(f"has {partitions} partitions, wants {spec.partitions} (not changed: "
                         "adding partitions moves keys; recreate the topic if that is acceptable)")
        elif partitions > spec.partitions:
            notes.append(f"has {partitions} partitions, more than the {spec.partitions} wanted (kept)")
        current = topic_configs(settings, spec.name, timeout, admin=admin)
        policy = current.get("cleanup.policy", "delete")
        action = Action.EXISTING
        if policy != wanted_policy:
            _set_topic_config(admin, spec.name, {"cleanup.policy": wanted_policy}, timeout)
            notes.append(f"cleanup.policy was {policy}, set to {wanted_policy}")
            action, policy = Action.FIXED, wanted_policy
        for key in _ENFORCED_CONFIGS:
            wanted = spec.config.get(key)
            if wanted is not None and current.get(key) != wanted:
                _set_topic_config(admin, spec.name, {key: wanted}, timeout)
                notes.append(f"{key} was {current.get(key)}, set to {wanted}")
                action = Action.FIXED
        outcomes.append(TopicOutcome(spec.name, partitions, replication, policy, action, tuple(notes)))
    return EnsureReport(tuple(outcomes))


def _check_visible(admin: KafkaAdmin, settings: Settings, missing: Sequence[TopicSpec], timeout: float) -> None:
    """On a cluster with ACLs a topic this principal may not Describe is absent from the metadata, exactly like
    a missing one; asked for by name, Kafka says which: refuse with the missing permission instead of trying
    (and failing) to create a topic that may well exist."""
    from sie.kernel.authz import topic_denied

    if not missing or settings.security_protocol in (None, "PLAINTEXT"):  # no principal, no ACLs to miss
        return
    for spec in missing:
        denied = topic_denied(admin, spec.name, settings.kafka_client_config(), "DESCRIBE (implied by READ or WRITE)",
                              timeout)
        if denied is not None:
            raise denied


def _set_topic_config(admin: KafkaAdmin, topic: str, values: dict[str, str], timeout: float) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(
        ResourceType.TOPIC, topic,
        incremental_configs=[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in values.items()],
    )
    for fut in admin.incremental_alter_configs([resource], request_timeout=timeout).values():
        fut.result(timeout=timeout)


#: what a record batch adds to its largest record (topic max.message.bytes bounds whole batches)
_BATCH_OVERHEAD = 1024


def check_data_topics(names: Names, topics: Iterable[str]) -> None:
    """``ConfigError`` naming any of ``topics`` that is one of SIE's system topics (never ensured as data)."""
    system = sorted(t for t in topics if names.is_system_topic(t))
    if system:
        raise ConfigError(f"{', '.join(system)}: SIE's system topic(s), not a model's data topics; refusing to "
                          "create or reconfigure them as such (fix the spec's topics)")


def model_topic_specs(topic_names: Sequence[str], partitions: int, max_record_bytes: int) -> list[TopicSpec]:
    """A model's data-path topics: requests, results, dead letters, backfill - all the same partition count.

    Results and dead letters share the request topic's partition count so a
    request's outputs land on the same partition number as its input.  Each accepts a record of
    ``max_record_bytes`` (the producers' ``message.max.bytes``): a dead letter that fits the producer
    always fits the topic.
    """
    if partitions < 1:
        raise ConfigError(f"partitions: must be >= 1 (got {partitions})")
    config = {"max.message.bytes": str(max_record_bytes + _BATCH_OVERHEAD)}
    return [TopicSpec(name, partitions, compacted=False, purpose="model data path", config=dict(config))
            for name in dict.fromkeys(topic_names)]


def ensure_model_topics(
    settings: Settings,
    topic_names: Sequence[str | None],
    partitions: int,
    replication_factor: int | None = None,
    clients: KafkaClients | None = None,
) -> EnsureReport:
    """Ensure a model's data-path topics (requests, results, dead letters, backfill); None entries are skipped.

    A system topic is refused (``ConfigError``) before anything is created or changed: ensuring it as a data topic
    would set ``cleanup.policy=delete`` on a compacted topic holding the cluster's state."""
    check_data_topics(settings.names, [n for n in topic_names if n])
    specs = model_topic_specs([n for n in topic_names if n], partitions, settings.max_record_bytes)
    return ensure_topics(settings, specs, replication_factor, clients=clients)
