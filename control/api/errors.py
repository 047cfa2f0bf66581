"""The control API's one error shape: ``{"error": ..., "errors": [{"field", "reason"}]}``, never internals.

A route raises ``ApiError``; ``install_error_handlers`` answers it, Starlette's 404/405 and FastAPI's request
validation errors in that shape.  A 500 is ``guard.RequestGuard``'s (a reference, the traceback in the log).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class FieldError(BaseModel):
    """One thing wrong with a request: where (``spec.resources.gpuMemoryMb``, ``limit``, ``body``) and why."""

    field: str
    reason: str


class ErrorBody(BaseModel):
    """Every error answer of the API."""

    error: str
    errors: list[FieldError]


_MEANINGS = {400: "an empty or unreadable body", 401: "no token, or an unknown one",
             403: "the token's role may not do this", 404: "not found (the message names it)",
             409: "a conflict with the applied state (the message says which)",
             422: "an invalid request, naming the fields", 503: "try again, or ask the leader"}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entries of the error answers a route may give (``ErrorBody``)."""
    return {code: {"model": ErrorBody, "description": _MEANINGS[code]} for code in codes}


class ApiError(Exception):
    """An answer other than success: the status, the message and the fields it is about."""

    def __init__(self, status: int, error: str, errors: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.errors, self.headers = status, error, errors or [], headers


def problem_to_error(problem: str) -> dict[str, str]:
    """``spec.resources.gpuMemoryMb: must be >= 0 (got -5)`` -> field + reason."""
    field, sep, reason = problem.partition(": ")
    return {"field": field, "reason": reason} if sep else {"field": "", "reason": problem}


def install_error_handlers(app: Any) -> None:
    """Answer ``ApiError``, unknown routes and methods (404/405) and invalid parameters (422) in the one shape."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return JSONResponse({"error": exc.error, "errors": exc.errors}, status_code=exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        text = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse({"error": text, "errors": []}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [{"field": ".".join(map(str, e.get("loc", ()))), "reason": str(e.get("msg", ""))} for e in exc.errors()]
        said = "; ".join(f"{e['field']}: {e['reason']}" for e in errors[:3])  # the parameter and what it allows
        return JSONResponse({"error": f"invalid request: {said}" if said else "invalid request", "errors": errors},
                            status_code=422)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
