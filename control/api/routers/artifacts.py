"""``/v1/artifacts/sha256:<hex>``: an uploaded artifact's manifest, and uploading one.

  upload: digest and file name checked -> already on the cluster? 200 -> chunks onto the artifacts topics as the body
          streams in (1 MiB at a time, in a worker thread) -> the bytes' digest checked -> manifest -> 201

| failure                                          | answer |
|--------------------------------------------------|--------|
| not ``sha256:<64 lowercase hex>``, a bad name      | 422 |
| the bytes hash to another digest (nothing published) | 422 |
| Kafka did not acknowledge                        | 503, try again |
| a body over ``SIE_MAX_ARTIFACT_BYTES``             | 413 (``guard.RequestGuard``) |
"""

# No ``from __future__ import annotations``: FastAPI reads the route functions' annotations as objects.
import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sie.control.api.deps import Service, Viewer, Writer
from sie.control.api.errors import ApiError, error_responses
from sie.control.api.routers.models import ARTIFACT_PATH
from sie.control.api.views import ArtifactManifest, ArtifactUploaded

router = APIRouter(prefix="/v1/artifacts", responses=error_responses(401, 422))

#: seconds an artifact upload waits for Kafka's acknowledgements (of all its chunks, then its manifest)
UPLOAD_TIMEOUT_S = 120.0


def _parse_artifact_ref(ref: str) -> str:
    match = re.fullmatch(r"sha256:([0-9a-f]{64})", ref)
    if match is None:
        raise ApiError(422, "the artifact is named 'sha256:<64 lowercase hex digits>' (sha256sum FILE)",
                       [{"field": "path", "reason": f"not sha256:<hex> (got {ref[:80]!r})"}])
    return match.group(1)


@router.get("/{ref}", summary="An uploaded artifact's manifest (size, chunks)", response_model=ArtifactManifest,
            responses=error_responses(404))
def get_artifact(ref: str, service: Service, _: Viewer) -> dict[str, Any]:
    sha = _parse_artifact_ref(ref)
    manifest = service.artifacts.known(sha)
    if manifest is None:
        raise ApiError(404, f"artifact sha256:{sha} is not on the cluster; upload it (PUT {ARTIFACT_PATH}"
                            f"sha256:{sha[:12]}..., or sie apply)")
    return dict(manifest.to_json())


@router.put("/{ref}", summary="Upload an artifact (raw bytes; checked against the sha256 in the path)",
            response_model=ArtifactUploaded, responses=error_responses(403, 503),
            openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
async def put_artifact(ref: str, request: Request, service: Service, write: Writer,
                       name: str = "artifact") -> JSONResponse:
    from pydantic import ValidationError

    from sie.schemas.artifact_cache import ArtifactRefused, ArtifactUnavailable
    from sie.schemas.spec_models import ArtifactRef

    sha = _parse_artifact_ref(ref)
    try:
        ArtifactRef(sha256=sha, name=name)
    except ValidationError:
        raise ApiError(422, "name: a file name of letters, digits, '.', '_', '+' or '-' (its suffix tells "
                            "the format)", [{"field": "query.name", "reason": f"got {name[:80]!r}"}]) from None
    action = f"upload artifact sha256:{sha[:12]}"
    existing = await run_in_threadpool(service.artifacts.known, sha)
    if existing is not None:
        write.record(action, None, "already on the cluster")
        return JSONResponse({**existing.to_json(), "created": False}, status_code=200)
    try:
        upload = await run_in_threadpool(service.artifacts.store.begin, sha, name, UPLOAD_TIMEOUT_S)
        pending = bytearray()
        async for piece in request.stream():
            pending.extend(piece)
            if len(pending) >= (1 << 20):
                await run_in_threadpool(upload.add, bytes(pending))
                pending.clear()
        if pending:
            await run_in_threadpool(upload.add, bytes(pending))
        manifest = await run_in_threadpool(upload.finish)
    except ArtifactRefused as exc:
        write.record(action, None, f"refused 422: {exc}")
        raise ApiError(422, str(exc), [{"field": "body", "reason": str(exc)}]) from None
    except ArtifactUnavailable as exc:
        write.record(action, None, f"failed 503: {exc}")
        raise ApiError(503, f"{exc}; try again") from None
    service.artifacts.remember(manifest)
    write.record(action, None, f"stored {manifest.size} bytes in {manifest.chunks} chunks")
    return JSONResponse({**manifest.to_json(), "created": True}, status_code=201)
