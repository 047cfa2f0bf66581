"""Prepare one model version for this node: the ONE code path, whoever asks.

A version runs on a node in two ways: as a replica's own version (the agent launches a worker for it) and,
during a rollout, as a *companion* next to a replica of the other version (``sie.workers.versions``).  Both
are prepared here, identically, before any of the version's code is imported::

    decode   the document as it came over Kafka, once (``spec_of``; the agent hands the ModelService in)
    check    the node's spec policy on it (refused: the field is named)
    localize each artifact named by content (``artifactRef``, ``modules``) fetched and verified by the
             node's ``ArtifactFetcher`` (deferred while it is fetched); the document then names the
             verified copies in the node's artifact cache (``artifact``, ``modulesPath``)
    bundle   a module archive is checked against the node's allowed modules (``check_bundle``)
    check    the policy again on the localized document, decoded once (its local copies lie under the
             artifact cache, a model root): the document the version's worker loads

Outcomes:

| what happens                                  | raised             | the caller does                          |
|-----------------------------------------------|--------------------|------------------------------------------|
| the document is not a ModelService            | ``LaunchRefused``  | FAILED with the reason, no retry          |
| the policy refuses it                         | ``LaunchRefused``  | FAILED, the field named                   |
| an artifact is being fetched / retried        | ``LaunchDeferred`` | asks again shortly (nothing crashes)      |
| an artifact's bytes are refused               | ``LaunchRefused``  | FAILED with the digest / source reason    |
| the module archive holds modules not allowed  | ``LaunchRefused``  | FAILED, the module named                  |

The worker of the version then checks the localized document once more (``worker_main.check_spec``) and
loads it, proving it with a real inference (``load_proven``) before it serves anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sie.workers.process import LaunchDeferred, LaunchRefused

if TYPE_CHECKING:
    from sie.schemas.spec_models import ModelService

__all__ = ["Prepared", "check_spec", "localize", "prepare", "prepare_spec", "spec_of"]


def spec_of(spec_doc: Any) -> ModelService:
    """A replica's template or a companion version's document, as it came over Kafka (a stored spec, validated
    when it was applied), decoded into the ModelService it describes: once, where the node reads it.
    ``LaunchRefused`` when it is not one."""
    from sie.schemas.spec_models import ModelService

    try:
        return ModelService.from_document(spec_doc)
    except (ValueError, TypeError) as exc:  # pydantic ValidationError is a ValueError
        raise LaunchRefused(f"spec refused: not a ModelService document: {str(exc).splitlines()[0]}") from None


def check_spec(spec: ModelService, policy: Any) -> None:
    """The node's spec policy on a ModelService, exactly as the API applies it (``LaunchRefused`` names the
    field)."""
    problems = policy.check(spec)
    if problems:
        raise LaunchRefused("spec refused: " + "; ".join(problems))


@dataclass(frozen=True)
class Prepared:
    """A version prepared for this node."""

    #: what the version's worker loads: the document with its artifacts' verified copies named
    document: dict[str, Any]
    #: ``document`` decoded; None when nobody needed it (no policy, and the caller did not decode it)
    spec: ModelService | None


def localize(spec_doc: dict[str, Any], policy: Any, artifacts: Any) -> dict[str, Any]:
    """The document with its content-named artifacts replaced by their verified copies on this node (the same
    object when it names none); ``LaunchDeferred`` while they are fetched, ``LaunchRefused`` when refused."""
    from sie.schemas.module_bundle import check_bundle
    from sie.schemas.spec_models import ArtifactRef

    backend = dict(spec_doc.get("backend") or {})
    refs = {field: backend.get(field) for field in ("artifact_ref", "modules")}
    if not any(isinstance(r, dict) for r in refs.values()):
        return spec_doc
    if artifacts is None:
        raise LaunchRefused("spec names artifacts by sha256 but this process cannot fetch artifacts")
    paths: dict[str, Path] = {}
    waiting: list[LaunchDeferred] = []
    for field, ref in refs.items():
        if isinstance(ref, dict):
            try:
                paths[field] = artifacts.resolve(ArtifactRef.model_validate(ref))
            except LaunchDeferred as exc:  # start every fetch before waiting for any
                waiting.append(exc)
    if waiting:
        raise LaunchDeferred("; ".join(str(w) for w in waiting))
    if "artifact_ref" in paths:
        backend["artifact"] = str(paths["artifact_ref"])
    if "modules" in paths:
        allowed = policy.allowed_modules if policy is not None else ()
        problems = check_bundle(paths["modules"], allowed)
        if problems:
            raise LaunchRefused("spec refused: " + "; ".join(problems))
        backend["modules_path"] = str(paths["modules"])
    return {**spec_doc, "backend": backend}


def prepare(spec_doc: dict[str, Any], spec: ModelService | None, policy: Any, artifacts: Any) -> Prepared:
    """Check, localize, check again (module docstring).  ``spec``: ``spec_doc`` decoded by the caller (None: it
    is decoded here when a policy needs it)."""
    if policy is not None:
        spec = spec if spec is not None else spec_of(spec_doc)
        check_spec(spec, policy)  # before anything of the version touches the disk
    localized = localize(spec_doc, policy, artifacts)
    if localized is spec_doc:
        return Prepared(spec_doc, spec)
    if policy is None:
        return Prepared(localized, None)
    local = spec_of(localized)  # a new document: the local copies are under the artifact cache, a model root
    check_spec(local, policy)
    return Prepared(localized, local)


def prepare_spec(spec_doc: dict[str, Any], policy: Any, artifacts: Any) -> dict[str, Any]:
    """The document a worker of this version may load (``prepare`` of a document nobody decoded yet)."""
    return prepare(spec_doc, None, policy, artifacts).document
