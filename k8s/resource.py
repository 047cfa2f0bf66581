"""A normalised ``ModelService`` as a Kubernetes resource (``kind: ModelService``), the inverse of the parser.

WHY: a team moving to Kubernetes has specs in either document style (the article's flat model-spec or the
Kubernetes style) with local artifact paths.  ``sie operator resource -f spec.yaml`` uploads what the spec
needs (as ``sie apply`` does) and prints the resource to ``kubectl apply``.  The contract, tested on the
real API server: ``parse(resource(parse(doc))) == parse(doc)`` for every spec the parser accepts (minus
``source`` and ``warnings``: what SIE cannot honour is dropped, so it is not written back).

Only what differs from the parser's defaults is written (a resource stays as short as a hand-written one);
the model's default topics and consumer group are left out, so the resource does not pin a topic prefix.
"""

from __future__ import annotations

import re
from typing import Any

from sie.k8s.crd import API_VERSION, KIND
from sie.kernel.names import ModelTopics, Names

_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _fields(schema: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "json"}
    if schema.unknown_fields != "reject":
        out["unknownFields"] = schema.unknown_fields
    fields = []
    for f in schema.fields:
        item: dict[str, Any] = {"name": f.name, "type": f.type}
        if not f.required:
            item["required"] = False
        if f.nullable:
            item["nullable"] = True
        if f.max_length is not None:
            item["maxLength"] = f.max_length
        if f.range is not None:
            item["range"] = [f.range[0], f.range[1]]
        if f.description:
            item["description"] = f.description
        fields.append(item)
    out["fields"] = fields
    return out


def _ref(ref: Any) -> dict[str, Any]:
    return ref.model_dump(mode="json", exclude_none=True)


def to_resource(spec: Any, namespace: str | None = None, topic_prefix: str = "sie") -> dict[str, Any]:
    """The ``sie.lmsys.org/v1`` ModelService that parses back to ``spec``."""
    b = spec.backend
    backend: dict[str, Any] = {"type": b.type}
    if b.artifact_ref is not None:
        backend["artifact"] = _ref(b.artifact_ref)
    elif b.artifact is not None:
        backend["artifact"] = str(b.artifact)
    if b.modules is not None:
        backend["modules"] = _ref(b.modules)
    if b.type == "torch" and b.format is not None:
        backend["format"] = b.format
    for key, value in (("moduleClass", b.module_class), ("callable", b.callable), ("modelPath", b.model_path)):
        if value is not None:
            backend[key] = value
    if b.module_kwargs:
        backend["moduleKwargs"] = dict(b.module_kwargs)
    if b.config:
        backend["config"] = dict(b.config)
    if b.device != "auto":
        backend["device"] = b.device
    r = spec.resources
    resources = {"gpuMemoryMb": r.gpu_memory_mb, "gpus": r.gpus, "cpu": r.cpu, "memoryMb": r.memory_mb}
    sla: dict[str, Any] = {"min_replicas": spec.sla.min_replicas, "max_replicas": spec.sla.max_replicas}
    for key in ("p99_latency_ms", "max_queue_time_ms", "min_qps"):
        if getattr(spec.sla, key) is not None:
            sla[key] = getattr(spec.sla, key)
    body: dict[str, Any] = {"model": {"name": spec.name, "version": spec.version}}
    if spec.priority_level != "P1":
        body["priorityLevel"] = spec.priority_level
    if spec.service_type != "scoring":
        body["serviceType"] = spec.service_type
    body["backend"] = backend
    body["resources"] = resources
    if spec.scheduling.node_selector or spec.scheduling.tier:
        body["scheduling"] = {k: v for k, v in (("nodeSelector", dict(spec.scheduling.node_selector)),
                                                 ("tier", spec.scheduling.tier)) if v}
    body["sla"] = sla
    if spec.max_concurrent_requests is not None:
        body["maxConcurrentRequests"] = spec.max_concurrent_requests
    # an absent schema parses to "allow everything": say so explicitly, or the parser would warn again
    body["inputSchema"] = _fields(spec.input_schema)
    body["outputSchema"] = _fields(spec.output_schema)
    if spec.example_input is not None:
        body["exampleInput"] = dict(spec.example_input)
    defaults = ModelTopics.default_for(spec.name, prefix=topic_prefix)
    ki = spec.kafka_input
    if ki is not None:
        body["kafka_input"] = {k: v for k, v in ki.model_dump(mode="json").items() if v is not None}
    topics = {k: v for k, v in (("requests", spec.topics.requests), ("results", spec.topics.results),
                                ("deadLetters", spec.topics.dead_letters), ("backfill", spec.topics.backfill))
              if v != getattr(defaults, {"deadLetters": "dead_letters", "backfill": "backfill_results"}.get(k, k))
              and not (k == "requests" and ki is not None and ki.topic == v)}
    if topics:
        body["topics"] = topics
    if ki is None or not ki.group_id:
        if spec.group_id != Names(topic_prefix).scorer_group(spec.name):
            raise ValueError(f"{spec.name}: consumer group {spec.group_id!r} is not expressible without kafka_input")
    if spec.rollout is not None:
        body["rollout"] = dict(spec.rollout)
    if spec.description:
        body["description"] = spec.description
    metadata: dict[str, Any] = {"name": spec.name}
    if namespace:
        metadata["namespace"] = namespace
    if spec.labels:
        # Kubernetes label syntax: as metadata.labels (the parser merges them); anything else in spec.labels
        valid = all(_LABEL.fullmatch(k) and len(k) <= 63 and _LABEL_VALUE.fullmatch(v) for k, v in spec.labels.items())
        (metadata if valid else body)["labels"] = dict(spec.labels)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}
