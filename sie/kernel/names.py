"""Every topic, consumer-group, transactional-id and client-id name SIE uses, built in one place.

Every name starts with the cluster's prefix (``SIE_TOPIC_PREFIX``, default ``sie``), so one prefixed
ACL per resource type covers a whole SIE cluster and two clusters on one Kafka never collide::

    <p>.specs, <p>.nodes, ...                   system topics (sie.kernel.topics lists them)
    <p>.model.<model>.requests|results|dlq|backfill|backfill-dlq|deferred
                                                a model's data-path topics (a spec may override): always ONE
                                                word after the model, so no two models' topics collide
    <p>.scorer.<model>                          a model's scorer group;  <p>.scorer.<model>.<instance> its txn id
    <p>.cdc.<connector>[.<instance>]            CDC stage group / txn id;  <p>.cdc.<connector>.dlq its DLQ
    <p>.backfill.<job>                          backfill group and txn id; <output topic>-dlq its DLQ
    <p>.backfill.<job>.<role>                   a backfill job's client ids (consumer, probe, plan reader/writer)
    <p>.control                                 control-plane election group and the leader's shared txn id
    <p>.control.state                           control-plane state reader (assign(), never joined)
    <p>.agent.<node>                            a node agent's assignments reader (assign(), never joined)
    <p>.reader.<purpose>.<unique>               a one-off reader's group (assign(), never joined)
    <p>.redrive.<model>.<reason>                dead-letter redrive: group (its committed offsets mark what was
                                                redriven) and transactional id, one per (model, reason)
    <p>.cli.<command>                           a one-shot CLI writer's client id (`sie replica reset`)
    <p>.artifacts / <p>.artifact-chunks         artifact manifests (key sha256:<hex>) / their chunks (sha256:<hex>/<i>)
    <p>.connectors                              CDC connectors applied through the control plane (key = name)
    cdc:<connector>                             a connector's replica "model" in placements (never a model name)

Names that come FROM DATA (a spec, an assignment, a connector) are checked here, once, by whoever decodes them:

* a model name (``MODEL_NAME_RE``) and a replica id (``REPLICA_ID_RE``: it becomes a folder under the agent's
  work directory, so no ``/``, no leading ``.``);
* a spec's topic and group overrides and a connector's topics (``Names.data_topic_problem``, ``group_problem``):
  everything under ``<p>.`` is SIE's own namespace (system topics, other models' topics and groups, the control
  plane's groups), so a spec may name there only its OWN names (its defaults, or ``<p>.model.<model>.<word>``);
  anything outside ``<p>.`` is the team's own topic.  Otherwise ``sie acls plan -f SPEC`` would grant a scorer Write on ``<p>.specs``, and ensuring the
  model's topics would flip a compacted system topic to ``cleanup.policy=delete``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from sie.kernel.errors import ConfigError

#: instance names (scorer replicas, CDC stage instances) become part of transactional ids and client ids
INSTANCE_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def check_instance(instance: str, what: str = "instance") -> str:
    """``instance`` if it can be part of a transactional id, else a ``ConfigError`` naming the fix."""
    if not INSTANCE_RE.fullmatch(instance):
        raise ConfigError(f"{what}: must match {INSTANCE_RE.pattern} (got {instance!r}); pass --instance NAME")
    return instance


#: model names (the spec parser's rule): they name topics, groups, transactional ids and metrics labels
MODEL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
#: replica ids (``<model>-<n>``, ``cdc:<connector>-<n>``): a folder under the agent's work directory, a process
#: name, a Kafka key; never a path separator, never a leading dot
REPLICA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
#: node names (the agent's ``--node``): the key of the node's records on Kafka, a folder under the agent's work
#: directory, a host or Kubernetes node name; never a path separator, never a leading dot
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
#: a Kafka topic name (Kafka's own rule, as the spec parser checks it)
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_model_name(name: object, what: str = "model name") -> str:
    """``name`` if it can name a model's topics, else a ``ConfigError`` naming the rule."""
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        raise ConfigError(f"{what}: must be lowercase [a-z0-9._-], start with a letter or digit, at most 200 "
                          f"characters (got {_shown(name)})")
    return name


def check_node_name(name: object, what: str = "node name") -> str:
    """``name`` if it can name a node (its records' key, its work folder), else a ``ConfigError`` naming the rule."""
    if not isinstance(name, str) or not NODE_NAME_RE.fullmatch(name):
        raise ConfigError(f"{what}: must match {NODE_NAME_RE.pattern} (a host or Kubernetes node name: letters, "
                          f"digits, '.', '_', ':', '-'; no '/', no leading '.'; got {_shown(name)})")
    return name


def check_replica_id(replica_id: object, what: str = "replica_id") -> str:
    """``replica_id`` if it can name a folder under the agent's work directory, else a ``ConfigError``."""
    if not isinstance(replica_id, str) or not REPLICA_ID_RE.fullmatch(replica_id):
        raise ConfigError(f"{what}: must match {REPLICA_ID_RE.pattern} (a folder name: no '/', no leading '.'; "
                          f"got {_shown(replica_id)})")
    return replica_id


#: what every Linux file system SIE runs on allows: a path component of at most NAME_MAX bytes, a whole path of
#: at most PATH_MAX; a longer name from data is refused by name here, never an ``OSError: [Errno 36]`` later
NAME_MAX = 255
PATH_MAX = 4096


def path_problem(path: object) -> str | None:
    """Why ``path`` (a file path or name FROM DATA: a spec's artifact, a module's package folder) may not be handed
    to the file system, or None.  Checked before ``is_file()``/``stat()``, which raise on a too-long name."""
    if not isinstance(path, str):
        return f"must be a path (got {_shown(path)})"
    if "\0" in path:
        return "must not contain a NUL character"
    try:
        encoded = os.fsencode(path)
    except UnicodeError:
        return f"is not a file name this system can encode (got {_shown(path)})"
    if len(encoded) > PATH_MAX:
        return f"is {len(encoded)} bytes long; a path may have at most {PATH_MAX}"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"has a file or folder name of {len(longest)} bytes ({_shown(longest.decode(errors='replace'))}); "
                f"a file system allows at most {NAME_MAX}")
    return None


def _shown(value: object) -> str:
    """``value`` for a message: repr (control characters escaped, never a raw newline in a log), cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

#: system topic suffixes (the catalogue with partitions and policies is sie.kernel.topics)
SYSTEM_TOPICS = ("specs", "nodes", "heartbeats", "assignments", "replica-status", "events", "control-leader",
                 "model-status", "backfill-plans", "artifacts", "artifact-chunks", "connectors",
                 "rollouts")


@dataclass(frozen=True)
class ModelTopics:
    """The data-path topics of one model."""

    requests: str
    results: str
    dead_letters: str
    backfill_results: str

    @classmethod
    def default_for(cls, model_name: str, prefix: str = "sie") -> ModelTopics:
        return Names(prefix).model_topics(model_name)


@dataclass(frozen=True)
class Names:
    """Names of one SIE cluster (one prefix)."""

    prefix: str = "sie"

    # --- topics -----------------------------------------------------------------------------------
    def system_topic(self, suffix: str) -> str:
        """``<prefix>.<suffix>`` for one of ``SYSTEM_TOPICS`` (KeyError names the known ones)."""
        if suffix not in SYSTEM_TOPICS:
            raise KeyError(f"unknown system topic {suffix!r}; known: {sorted(SYSTEM_TOPICS)}")
        return f"{self.prefix}.{suffix}"

    def is_system_topic(self, topic: str) -> bool:
        return any(topic == f"{self.prefix}.{suffix}" for suffix in SYSTEM_TOPICS)

    def own_data_topics(self, model: str) -> tuple[str, ...]:
        """Every topic under ``<p>.`` that belongs to ``model``: its defaults, its deferred topic, its backfill DLQ."""
        t = self.model_topics(model)
        return (t.requests, t.results, t.dead_letters, t.backfill_results, self.llm_deferred_topic(model),
                self.backfill_dead_letter_topic(t.backfill_results))

    def data_topic_problem(self, model: str, topic: str) -> str | None:
        """Why ``topic`` may not be a data-path topic of ``model`` (a spec's override, a connector's request topic),
        or None.  Under ``<p>.`` only the model's own names; outside it any valid topic (the team's own)."""
        if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
            return f"not a valid Kafka topic name ([A-Za-z0-9._-], at most 249 characters; got {_shown(topic)})"
        if topic in self.own_data_topics(model):
            return None
        own = f"{self.model_topic_prefix}{model}."
        if topic.startswith(own) and re.fullmatch(r"[A-Za-z0-9_-]+", topic[len(own):]):
            return None  # <p>.model.<model>.<one word>: the model's own (one more dot would be model "<model>.x"'s)
        if self.is_system_topic(topic):
            return (f"{topic} is SIE's system topic; a model's data may not go there (whoever may write the "
                    "model's topics would write the cluster's state)")
        if topic == self.prefix or topic.startswith(self.prefix + "."):
            return (f"{topic} is in SIE's own namespace '{self.prefix}.' (system topics, other models' topics); "
                    f"name a topic outside it, or leave the override out for {self.model_topic_prefix}{model}.*")
        return None

    def group_problem(self, model: str, group: str) -> str | None:
        """Why ``group`` may not be the consumer group of ``model``'s scorer, or None (same rule as topics)."""
        if not isinstance(group, str) or not group or len(group) > 249 or any(ord(c) < 0x20 for c in group):
            return f"not a usable consumer group id (got {_shown(group)})"
        if group == self.scorer_group(model):
            return None
        if group == self.prefix or group.startswith(self.prefix + "."):
            return (f"{group} is in SIE's own namespace '{self.prefix}.' (the control plane's, agents' and other "
                    f"models' groups); name a group outside it, or leave it out for {self.scorer_group(model)}")
        return None

    def model_topics(self, model: str) -> ModelTopics:
        base = f"{self.prefix}.model.{model}"
        return ModelTopics(f"{base}.requests", f"{base}.results", f"{base}.dlq", f"{base}.backfill")

    def llm_deferred_topic(self, model: str) -> str:
        """An LLM model's deferred requests (quota policy ``delay``: ``sie.streams.llm.defer``); not compacted."""
        return f"{self.prefix}.model.{model}.deferred"

    def cdc_dead_letter_topic(self, connector: str) -> str:
        """A connector's own DLQ: source records (CDC JSON), not requests, so not the model's DLQ."""
        return f"{self.prefix}.cdc.{connector}.dlq"

    @staticmethod
    def backfill_dead_letter_topic(output_topic: str) -> str:
        """``<output topic>-dlq``: one word after the model (``<p>.model.m.backfill-dlq``).  Not
        ``<output topic>.dlq``: for model ``m`` that is ``<p>.model.m.backfill.dlq``, model ``m.backfill``'s own
        dead-letter topic (docs/connectors.md, "Backfill dead letters", for clusters with the older name)."""
        return f"{output_topic}-dlq"

    def model_of_topic(self, topic: str) -> str | None:
        """The model whose topic ``topic`` is under ``<p>.model.`` (``<p>.model.<model>.<one word>``), or None for
        a topic outside it.  Every name a model owns there has exactly one word after the model, so this is the
        only model that may be granted it."""
        if not topic.startswith(self.model_topic_prefix):
            return None
        model, _, word = topic[len(self.model_topic_prefix):].rpartition(".")
        return model if model and word else None

    # --- scorer -------------------------------------------------------------------------------------
    def scorer_group(self, model: str) -> str:
        return f"{self.prefix}.scorer.{model}"

    def scorer_transactional_id(self, model: str, instance: str) -> str:
        return f"{self.prefix}.scorer.{model}.{instance}"

    # --- connectors -----------------------------------------------------------------------------------
    def cdc_group(self, connector: str) -> str:
        return f"{self.prefix}.cdc.{connector}"

    def cdc_transactional_id(self, connector: str, instance: str) -> str:
        return f"{self.prefix}.cdc.{connector}.{instance}"

    @staticmethod
    def connector_replica_model(connector: str) -> str:
        """What a connector's replicas are placed under (``cdc:<name>``): ``:`` never occurs in a model name,
        so a connector and a model never share replica ids (``cdc:orders-0``) or statuses."""
        return f"cdc:{connector}"

    @staticmethod
    def connector_of_replica_model(model: str) -> str | None:
        """The connector name of a ``connector_replica_model`` value, None for a model's."""
        return model[len("cdc:"):] if model.startswith("cdc:") else None

    # --- artifacts ------------------------------------------------------------------------------------
    @staticmethod
    def artifact_key(sha256: str) -> str:
        """Key of an artifact's manifest on ``<p>.artifacts`` (content address)."""
        return f"sha256:{sha256}"

    @staticmethod
    def artifact_chunk_key(sha256: str, index: int) -> str:
        """Key of chunk ``index`` of an artifact on ``<p>.artifact-chunks``."""
        return f"sha256:{sha256}/{index}"

    def artifact_client_id(self, role: str) -> str:
        """An artifact uploader's or fetcher's client id (``role``: ``upload``, ``fetch``, ``lookup``)."""
        return f"{self.prefix}.artifacts.{role}"

    def backfill_group(self, job_id: str) -> str:
        return f"{self.prefix}.backfill.{job_id}"

    def backfill_transactional_id(self, job_id: str) -> str:
        return f"{self.prefix}.backfill.{job_id}"

    def backfill_client_id(self, job_id: str, role: str) -> str:
        """``role``: which of the job's clients (``consumer``, ``probe``, ``plan-reader``, ``plan-writer``)."""
        return f"{self.prefix}.backfill.{job_id}.{role}"

    def redrive_group(self, model: str, reason: str) -> str:
        """The committed offsets of this group on a model's dead-letter topic are the redrive mark: every
        dead letter of ``reason`` before them was sent back once, exactly once."""
        return f"{self.prefix}.redrive.{model}.{reason}"

    def redrive_transactional_id(self, model: str, reason: str) -> str:
        return f"{self.prefix}.redrive.{model}.{reason}"

    @staticmethod
    def stage_client_id(transactional_id: str, role: str) -> str:
        """A consume-transform-produce stage's client ids, from its transactional id (or group): ``<id>.consumer``,
        ``<id>.producer`` (``role``)."""
        return f"{transactional_id}.{role}"

    def cli_client_id(self, command: str) -> str:
        return f"{self.prefix}.cli.{command}"

    def reader_group(self, purpose: str, unique: str) -> str:
        """A throwaway group of a one-off reader that assign()s and never commits (CLI reads, probes)."""
        return f"{self.prefix}.reader.{purpose}.{unique}"

    def reader_client_id(self, purpose: str) -> str:
        """The client id of a one-off reader (``reader_group``) of ``purpose``."""
        return f"{self.prefix}.reader.{purpose}"

    def writer_client_id(self, purpose: str) -> str:
        """The client id of a one-off writer (``sie apply``'s spec records, ``sie cdc`` test records, ...)."""
        return f"{self.prefix}.writer.{purpose}"

    def reader_group_prefix(self, purpose: str | None = None) -> str:
        """What every reader group (or those of one purpose) starts with: PREFIXED ACLs."""
        return f"{self.prefix}.reader." + (f"{purpose}." if purpose else "")

    # --- control plane and agents ---------------------------------------------------------------------
    @property
    def control_group(self) -> str:
        """Every control-plane instance of the cluster joins it; the member given partition 0 leads."""
        return f"{self.prefix}.control"

    @property
    def control_transactional_id(self) -> str:
        """Shared by every control-plane instance: a new leader's init_transactions() fences the old one."""
        return f"{self.prefix}.control"

    @property
    def control_state_group(self) -> str:
        return f"{self.prefix}.control.state"

    @property
    def control_state_client_id(self) -> str:
        return f"{self.prefix}.control.state.reader"

    @property
    def control_state_ends_client_id(self) -> str:
        """The state reader's short-lived consumer that takes a read barrier's end offsets."""
        return f"{self.prefix}.control.state.ends"

    def control_client_id(self, instance: str, role: str | None = None) -> str:
        """A control-plane instance's client id, or that of one of its clients (``role``, e.g. ``specs``)."""
        return f"{self.prefix}.control.{instance}" + (f".{role}" if role else "")

    @property
    def control_audit_client_id(self) -> str:
        """The API's audit writer (``sie.control.api.audit.AuditLog``), shared by every instance."""
        return f"{self.control_group}.audit"

    def agent_group(self, node: str) -> str:
        return f"{self.prefix}.agent.{node}"

    def agent_client_id(self, node: str, role: str | None = None) -> str:
        """The agent's own client id, or that of one of its clients (``role``, e.g. ``assignments``)."""
        return f"{self.prefix}.agent.{node}" + (f".{role}" if role else "")

    # --- prefixes: what one PREFIXED ACL covers (sie.kernel.acls); each derives from the name it covers ---
    @property
    def model_topic_prefix(self) -> str:
        """Every model's default data-path topics (``<p>.model.``)."""
        return self.model_topics("").requests[: -len(".requests")]

    def scorer_transactional_id_prefix(self, model: str) -> str:
        """Every replica's transactional id of one model's scorer (``<p>.scorer.<model>.``)."""
        return self.scorer_transactional_id(model, "")

    @property
    def scorer_prefix(self) -> str:
        """Every scorer group and transactional id (``<p>.scorer.``)."""
        return self.scorer_group("")

    @property
    def agent_group_prefix(self) -> str:
        return self.agent_group("")

    def cdc_transactional_id_prefix(self, connector: str) -> str:
        return self.cdc_transactional_id(connector, "")

    @property
    def cdc_prefix(self) -> str:
        """Every CDC stage group, transactional id and CDC dead-letter topic (``<p>.cdc.``)."""
        return self.cdc_group("")

    @property
    def backfill_prefix(self) -> str:
        """Every backfill job's group and transactional id (``<p>.backfill.``)."""
        return self.backfill_group("")
