"""A replica's template: what ONE replica of a model runs, and its hash (the replica's target).

The template is the ModelService document (``to_document()``, canonical JSON) without what only the control plane
reads: how many replicas run (``sla.min_replicas``/``max_replicas``) and how a new version rolls out (``rollout``).
The control plane derives it once per spec record and every ``ReplicaAssignment`` carries it (``spec_json``) with
its hash (``template_hash``); an agent runs the template as it is, and restarts a replica iff its target (the
template's hash and its GPUs, ``sie.workers.replica.DesiredReplica.target_hash``) changes.  So a scale change or
a new rollout policy restarts no worker; a new version, resources or code hand over.

Wire compatibility (docs/contracts.md, ``Assignment`` v3)::

    record has template_hash   -> spec_json IS the template: used as carried
    record without it (v1, v2) -> spec_json is the whole spec of an older control plane:
                                  template_from_json(spec_json) derives the same template (and hash) the
                                  control plane of this release would have sent

A document that is not a model's (a connector replica's) has nothing to leave out: its template is its text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: ``sla`` keys that say how many replicas run (not how one runs)
COUNT_KEYS = ("min_replicas", "max_replicas")
#: top-level keys only the control plane reads
CONTROL_KEYS = ("rollout",)


@dataclass(frozen=True)
class ReplicaTemplate:
    """A template (canonical JSON text) and its hash."""

    json: str
    hash: str


def template_hash(template_json: str) -> str:
    """The hash of a template's text (sha256, 16 hex digits)."""
    return hashlib.sha256(template_json.encode()).hexdigest()[:16]


def _control_only(doc: Mapping[str, Any]) -> bool:
    sla = doc.get("sla")
    return any(k in doc for k in CONTROL_KEYS) or (isinstance(sla, Mapping) and any(k in sla for k in COUNT_KEYS))


def _canonical(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def template_from_json(spec_json: str) -> ReplicaTemplate:
    """The template of a spec document's canonical JSON (``_canonical``): a copy without the control plane's
    keys, or the text itself when it has none (or is not a JSON object: the agent's launch reports such a
    document as the replica's failure)."""
    try:
        doc = json.loads(spec_json)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not _control_only(doc):
        return ReplicaTemplate(spec_json, template_hash(spec_json))
    return template_of(doc)


def template_of(spec_doc: Mapping[str, Any]) -> ReplicaTemplate:
    """The template of a spec document (``ModelService.to_document()``): serialised once, without the control
    plane's keys."""
    out = {k: v for k, v in spec_doc.items() if k not in CONTROL_KEYS}
    if isinstance(out.get("sla"), Mapping):
        out["sla"] = {k: v for k, v in out["sla"].items() if k not in COUNT_KEYS}
    text = _canonical(out)
    return ReplicaTemplate(text, template_hash(text))


def read_replica(item: Mapping[str, Any]) -> tuple[ReplicaTemplate, tuple[str, ...]]:
    """The template and the companions' templates of one ``ReplicaAssignment`` record (module docstring: a v3
    record as carried, an older one derived from its whole spec)."""
    text = str(item.get("spec_json") or "")
    companions = tuple(str(c) for c in item.get("companions") or ())
    carried = item.get("template_hash")
    if carried:
        return ReplicaTemplate(text, str(carried)), companions
    return template_from_json(text), tuple(template_from_json(c).json for c in companions)
