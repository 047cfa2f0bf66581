"""The least-privilege Kafka ACLs of each SIE role, derived from ``sie.kernel.names`` (never restated).

One principal per role (``User:<name>``; SCRAM user, mTLS subject or OAuth ``sub``, whatever the cluster
authenticates): scorer, agent, control, cdc, backfill, producer, consumer.  What each role does on Kafka,
and so what it is allowed, is that role's branch of ``plan`` (every grant says why); the table for operators
is docs/security.md, "The roles and their ACLs".  An agent's workers are scorers (and CDC stages): they run
as that principal (``SIE_WORKER_SASL_USERNAME``).

Which CLI command runs as which role: ``COMMAND_ROLES`` (tests/infra/test_kafka_secure.py runs each command
as each role on the secured broker); a refused command names the role it needs and the ``sie acls apply``
line that grants it (``sie.kernel.authz.needs_role``).

Invariants:

* nothing creates topics: an administrator does (``sie topics ensure``) with a super-user principal;
* without ``--model``/``--node``/``--connector``/``--job`` a plan covers every one of them through PREFIXED
  patterns (every name starts with the cluster prefix); with them it is LITERAL where Kafka allows;
* a spec's topics and group pass the naming rules (``Names.data_topic_problem``), and no data-path role is
  planned a grant on a system topic beyond reading ``rollouts`` (scorer) and ``backfill-plans`` (backfill);
* no cluster ``IdempotentWrite``: Write on a topic implies it since Kafka 2.8 (KIP-679);
* a model name that is a dotted prefix of another (``fraud``, ``fraud.v2``) shares the PREFIXED
  transactional-id pattern: name models accordingly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie.kernel.errors import ConfigError, SieError
from sie.kernel.names import SYSTEM_TOPICS, Names

ROLES = ("scorer", "agent", "control", "cdc", "backfill", "producer", "consumer")
#: the CLI commands a data-path principal runs, and the role whose plan covers what each reads and writes
COMMAND_ROLES = {"sie produce": "producer", "sie tail": "consumer", "sie backfill": "backfill", "sie cdc run": "cdc"}
LITERAL, PREFIXED = "literal", "prefixed"
RESOURCES = ("topic", "group", "transactional_id", "cluster")
OPERATIONS = ("read", "write", "describe", "describe_configs", "create", "alter_configs", "idempotent_write")
#: the control topics the control plane replays into its state (``sie.control.reconcile.feeder``)
CONTROL_READS = ("specs", "nodes", "assignments", "control-leader", "heartbeats", "replica-status", "events",
                 "model-status", "connectors", "artifacts", "artifact-chunks", "rollouts")
#: the control topics the control plane writes (the leader transactionally; the API specs, connectors,
#: uploaded artifacts and audit events)
CONTROL_WRITES = ("assignments", "events", "control-leader", "model-status", "specs", "connectors", "artifacts", "nodes",
                  "artifact-chunks", "rollouts")


@dataclass(frozen=True, order=True)
class AclRule:
    """One ALLOW binding: ``principal`` may ``operation`` on ``resource`` ``name`` (``pattern``), and why."""

    principal: str
    resource: str
    name: str
    pattern: str
    operation: str
    why: str = field(compare=False, default="")

    def __post_init__(self) -> None:
        if self.resource not in RESOURCES or self.operation not in OPERATIONS or self.pattern not in (LITERAL, PREFIXED):
            raise ValueError(f"bad ACL rule {self}")

    def line(self) -> str:
        return (f"{self.principal:<20} {self.operation.upper():<17} {self.resource.upper():<17} "
                f"{self.pattern.upper():<9} {self.name}   # {self.why}")


@dataclass(frozen=True)
class ModelScope:
    """The Kafka names of one model's scorer (from its spec, or the defaults of ``Names``)."""

    model: str
    requests: str
    results: str
    dead_letters: str
    backfill: str
    group: str

    @classmethod
    def default(cls, names: Names, model: str) -> ModelScope:
        t = names.model_topics(model)
        return cls(model, t.requests, t.results, t.dead_letters, t.backfill_results, names.scorer_group(model))

    @classmethod
    def of_spec(cls, spec: Any) -> ModelScope:
        """From a ``ModelService`` (its topics and group may be overridden by the spec)."""
        t = spec.topics
        return cls(spec.name, t.requests, t.results, t.dead_letters, t.backfill, spec.group_id)


def principal_of(name: str) -> str:
    """``User:<name>`` (a name given with a type, e.g. ``User:CN=scorer``, is kept)."""
    if not name or any(c in name for c in "\n\r\t"):
        raise ConfigError(f"principal: must be a user name or Type:name (got {name!r})")
    return name if ":" in name.split("=")[0] else f"User:{name}"


class _Rules:
    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.rules: list[AclRule] = []

    def add(self, resource: str, name: str, operations: Iterable[str], why: str, pattern: str = LITERAL) -> None:
        for op in operations:
            self.rules.append(AclRule(self.principal, resource, name, pattern, op, why))


def plan(names: Names, role: str, principal: str, *, models: Sequence[ModelScope] = (), nodes: Sequence[str] = (),
         connector: str | None = None, source_topics: Sequence[str] = (), job: str | None = None) -> list[AclRule]:
    """The ACL rules of ``role`` for ``principal`` on the cluster of ``names`` (see the module docstring)."""
    if role not in ROLES:
        raise ConfigError(f"role: one of {', '.join(ROLES)} (got {role!r})")
    _check_scopes(names, models, source_topics)
    r = _Rules(principal_of(principal))
    system = names.system_topic
    if role == "scorer":
        if models:
            for m in models:
                r.add("topic", m.requests, ["read", "describe_configs"], f"{m.model}: consume requests")
                for topic in (m.results, m.dead_letters):
                    r.add("topic", topic, ["write", "describe_configs"], f"{m.model}: results and dead letters")
                r.add("group", m.group, ["read"], f"{m.model}: the scorer's consumer group")
                r.add("transactional_id", names.scorer_transactional_id_prefix(m.model), ["write"],
                      f"{m.model}: one transactional id per replica", PREFIXED)
        else:
            r.add("topic", names.model_topic_prefix, ["read", "write", "describe_configs"],
                  "every model's requests, results and dead letters", PREFIXED)
            r.add("group", names.scorer_prefix, ["read"], "every scorer group", PREFIXED)
            r.add("transactional_id", names.scorer_prefix, ["write"], "every scorer replica", PREFIXED)
        r.add("topic", system("rollouts"), ["read"], "version weights of its model's rollout")
        r.add("group", names.reader_group_prefix("rollout-weights"), ["read"], "rollouts reader (never joined)",
              PREFIXED)
    elif role == "agent":
        r.add("topic", system("assignments"), ["read"], "this node's replicas")
        for suffix in ("artifacts", "artifact-chunks"):
            r.add("topic", system(suffix), ["read"], "artifacts its replicas need (fetched, verified by sha256)")
        for suffix in ("nodes", "heartbeats", "replica-status"):
            r.add("topic", system(suffix), ["write"], "registration, heartbeats, replica states")
        if nodes:
            for node in nodes:
                r.add("group", names.agent_group(node), ["read"], f"{node}: assignments reader (never joined)")
        else:
            r.add("group", names.agent_group_prefix, ["read"], "every agent's assignments reader", PREFIXED)
    elif role == "control":
        for suffix in CONTROL_READS:
            ops = ["read", "describe_configs"] + (["write"] if suffix in CONTROL_WRITES else [])
            r.add("topic", system(suffix), ops, "control-plane state" + (" it publishes" if "write" in ops else ""))
        r.add("group", names.control_group, ["read"], "leader election")
        r.add("group", names.control_state_group, ["read"], "state reader (never joined)")
        r.add("transactional_id", names.control_transactional_id, ["write"], "the leader's fenced writer")
        r.add("group", names.scorer_prefix, ["describe"], "autoscaler: each scorer group's committed offsets", PREFIXED)
        r.add("topic", names.model_topic_prefix, ["read"],
              "rollout gates: what each version answered; autoscaler: the request topics' ends", PREFIXED)
        r.add("group", names.reader_group_prefix(), ["read"], "rollouts and gate readers (never joined)", PREFIXED)
    elif role == "cdc":
        if connector is None or not source_topics or not models:
            raise ConfigError("role cdc: pass --connector NAME, --source-topic TOPIC (repeatable) and the target "
                              "--model NAME (repeatable) or -f SPEC")
        for topic in source_topics:
            r.add("topic", topic, ["read"], f"{connector}: change events")
        for m in models:
            r.add("topic", m.requests, ["write", "describe_configs"], f"{connector}: requests to {m.model}")
        r.add("topic", names.cdc_dead_letter_topic(connector), ["write", "describe_configs"], f"{connector}: dead letters")
        r.add("group", names.cdc_group(connector), ["read"], f"{connector}: the stage's consumer group")
        r.add("transactional_id", names.cdc_transactional_id_prefix(connector), ["write"],
              f"{connector}: one transactional id per stage instance", PREFIXED)
        r.add("topic", system("specs"), ["read"], "sie cdc run without --model-spec: the model's spec")
    elif role == "backfill":
        if not models:
            raise ConfigError("role backfill: pass the --model NAME (or -f SPEC) it re-scores")
        r.add("topic", system("backfill-plans"), ["read", "write", "describe_configs"], "job plans")
        r.add("topic", system("specs"), ["read"], "sie backfill --model: the applied spec it re-scores with")
        for m in models:
            r.add("topic", m.requests, ["read"], f"{m.model}: the range to re-score")
            for topic in (m.backfill, names.backfill_dead_letter_topic(m.backfill)):
                r.add("topic", topic, ["write", "describe_configs"], f"{m.model}: backfill results and dead letters")
            r.add("group", m.group, ["describe"], f"{m.model}: pacing by the live scorer's lag")
        if job:
            r.add("group", names.backfill_group(job), ["read"], f"job {job}")
            r.add("transactional_id", names.backfill_transactional_id(job), ["write"], f"job {job}")
        else:
            r.add("group", names.backfill_prefix, ["read"], "every backfill job", PREFIXED)
            r.add("transactional_id", names.backfill_prefix, ["write"], "every backfill job", PREFIXED)
    elif role == "producer":
        if models:
            for m in models:
                r.add("topic", m.requests, ["write"], f"requests to {m.model}")
        else:
            r.add("topic", names.model_topic_prefix, ["write"], "requests to every model (also results: narrow it "
                  "with --model)", PREFIXED)
        r.add("topic", system("specs"), ["read"], "sie produce --model: the model's request topic and input schema")
    elif role == "consumer":
        if models:
            for m in models:
                for topic in (m.results, m.dead_letters):
                    r.add("topic", topic, ["read"], f"{m.model}: results and dead letters (sie tail)")
        else:
            r.add("topic", names.model_topic_prefix, ["read"], "every model's topics (narrow it with --model)",
                  PREFIXED)
        r.add("topic", system("specs"), ["read"], "sie tail --model: the model's topics")
    rules = sorted(set(r.rules))
    _check_system_grants(names, role, rules)
    _check_model_grants(names, role, rules, models)
    return rules


#: the only system topics a data-path role is granted anything on, and what
_DATA_ROLE_SYSTEM_GRANTS = {("scorer", "rollouts", "read"), ("backfill", "backfill-plans", "read"),
                            ("backfill", "backfill-plans", "write"), ("backfill", "backfill-plans", "describe_configs"),
                            ("producer", "specs", "read"), ("consumer", "specs", "read"), ("cdc", "specs", "read"),
                            ("backfill", "specs", "read")}


def _check_scopes(names: Names, models: Sequence[ModelScope], source_topics: Sequence[str]) -> None:
    """A model's topics and group from a spec (``-f SPEC``) under the naming rules, before any rule is made: a spec
    naming ``<p>.specs`` as its results would otherwise be granted Write on it."""
    problems = []
    for m in models:
        for what, topic in (("requests", m.requests), ("results", m.results), ("deadLetters", m.dead_letters),
                            ("backfill", m.backfill)):
            problem = names.data_topic_problem(m.model, topic)
            if problem:
                problems.append(f"{m.model}: topics.{what}: {problem}")
        problem = names.group_problem(m.model, m.group)
        if problem:
            problems.append(f"{m.model}: group: {problem}")
    for topic in source_topics:
        if names.is_system_topic(topic):
            problems.append(f"--source-topic {topic}: SIE's system topic, not a change stream")
    if problems:
        raise ConfigError("refusing to plan ACLs: " + "; ".join(problems))


def _check_system_grants(names: Names, role: str, rules: Sequence[AclRule]) -> None:
    """The last word: a scorer, connector, backfill or producer principal is never granted a system topic beyond
    ``_DATA_ROLE_SYSTEM_GRANTS``, whatever the names it was planned from."""
    if role in ("agent", "control"):
        return
    suffixes = {names.system_topic(s): s for s in SYSTEM_TOPICS}
    for rule in rules:
        if rule.resource == "topic" and rule.name in suffixes and \
                (role, suffixes[rule.name], rule.operation) not in _DATA_ROLE_SYSTEM_GRANTS:
            raise ConfigError(f"refusing to plan ACLs: role {role} would get {rule.operation.upper()} on the system "
                              f"topic {rule.name}")


def _check_model_grants(names: Names, role: str, rules: Sequence[AclRule], models: Sequence[ModelScope]) -> None:
    """The last word for a plan scoped to models: a topic under ``<p>.model.`` is granted only if it is one of
    those models' own (``Names.model_of_topic``), never another model's that happens to share a prefix."""
    if role in ("agent", "control") or not models:
        return
    planned = {m.model for m in models}
    for rule in rules:
        if rule.resource != "topic" or not rule.name.startswith(names.model_topic_prefix):
            continue
        owner = names.model_of_topic(rule.name) if rule.pattern == LITERAL else None
        if owner not in planned:
            raise ConfigError(f"refusing to plan ACLs: role {role} for {', '.join(sorted(planned))} would get "
                              f"{rule.operation.upper()} on {rule.name}, "
                              + (f"model {owner}'s topic" if owner else "a pattern over other models' topics"))


def render(rules: Sequence[AclRule]) -> str:
    return "\n".join(rule.line() for rule in rules)


# ---- applying through the admin client ------------------------------------------------------------------


def to_binding(rule: AclRule) -> Any:
    """The confluent-kafka ``AclBinding`` of a rule (host ``*``, ALLOW)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    resource = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                "transactional_id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}[rule.resource]
    pattern = ResourcePatternType.LITERAL if rule.pattern == LITERAL else ResourcePatternType.PREFIXED
    name = "kafka-cluster" if rule.resource == "cluster" else rule.name
    return AclBinding(resource, name, pattern, rule.principal, "*", getattr(AclOperation, rule.operation.upper()),
                      AclPermissionType.ALLOW)


def apply(admin: Any, rules: Sequence[AclRule], timeout: float = 30.0, wait: bool = True) -> int:
    """Create the bindings (existing ones are unchanged: Kafka's CreateAcls is idempotent); returns how many.

    ``wait``: until the broker answering ``describe_acls`` lists every one (ACLs reach the brokers'
    authorizers asynchronously through the metadata log), so a client started next is allowed at once.
    """
    if not rules:
        return 0
    futures = admin.create_acls([to_binding(r) for r in rules], request_timeout=timeout)
    failed = []
    for binding, future in futures.items():
        try:
            future.result(timeout=timeout)
        except Exception as exc:  # KafkaException: not authorized (not a super user), no authorizer, ...
            failed.append(f"{binding.principal} {binding.operation.name} {binding.restype.name} {binding.name}: {exc}")
    if failed:
        raise SieError("creating ACLs failed (the admin client must be a super user or hold Alter on the cluster):\n  "
                       + "\n  ".join(failed[:10]))
    if wait:
        _wait_visible(admin, [to_binding(r) for r in rules], timeout)
    return len(futures)


def _wait_visible(admin: Any, bindings: list[Any], timeout: float) -> None:
    import time

    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
                                  AclOperation.ANY, AclPermissionType.ANY)
    wanted = set(bindings)
    deadline = time.monotonic() + timeout
    while True:
        seen = set(admin.describe_acls(everything, request_timeout=timeout).result(timeout=timeout))
        if wanted <= seen:
            return
        if time.monotonic() >= deadline:
            raise SieError(f"{len(wanted - seen)} ACL binding(s) not visible on the broker after {timeout:.0f}s")
        time.sleep(0.1)


def revoke(admin: Any, rules: Sequence[AclRule], timeout: float = 30.0) -> int:
    """Delete exactly these bindings; returns how many were deleted."""
    from confluent_kafka.admin import AclBindingFilter

    if not rules:
        return 0
    filters = []
    for rule in rules:
        b = to_binding(rule)
        filters.append(AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                        b.permission_type))
    deleted = 0
    for future in admin.delete_acls(filters, request_timeout=timeout).values():
        deleted += len(future.result(timeout=timeout))
    return deleted
