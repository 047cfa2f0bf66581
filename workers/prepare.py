"""Prepare one model version for this node: the ONE code path, whoever asks.

A version runs on a node in two ways: as a replica's own version (the agent launches a worker for it) and,
during a rollout, as a *companion* next to a replica of the other version (``sie.workers.versions``).  Both
are prepared here, identically, before any of the version's code is imported::

    check    the node's spec policy on the document as it came over Kafka (refused: the field is named)
    localize each artifact named by content (``artifactRef``, ``modules``) fetched and verified by the
             node's ``ArtifactFetcher`` (deferred while it is fetched); the document then names the
             verified copies in the node's artifact cache (``artifact``, ``modulesPath``)
    bundle   a module archive is checked against the node's allowed modules (``check_bundle``)
    check    the policy again on the localized document (its local copies lie under the artifact cache,
             a model root)

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

from pathlib import Path
from typing import Any

from sie.workers.process import LaunchDeferred, LaunchRefused

__all__ = ["check_document", "localize", "prepare_spec"]


def check_document(spec_doc: Any, policy: Any) -> None:
    """The node's spec policy on a ModelService document, exactly as the API applies it (``LaunchRefused``
    names the field)."""
    from sie.schemas.spec_models import ModelService

    if policy is None:
        return
    try:
        spec = ModelService.from_document(spec_doc)
    except (ValueError, TypeError) as exc:  # pydantic ValidationError is a ValueError
        raise LaunchRefused(f"spec refused: not a ModelService document: {str(exc).splitlines()[0]}") from None
    problems = policy.check(spec)
    if problems:
        raise LaunchRefused("spec refused: " + "; ".join(problems))


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


def prepare_spec(spec_doc: dict[str, Any], policy: Any, artifacts: Any) -> dict[str, Any]:
    """Check, localize, check again (module docstring): the document a worker of this version may load."""
    check_document(spec_doc, policy)  # before anything of the version touches the disk
    localized = localize(spec_doc, policy, artifacts)
    if localized is not spec_doc:
        check_document(localized, policy)  # the local copies are under the artifact cache, a model root
    return localized
