"""The one place where domain errors become HTTP answers in the contract's error shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from parley import errors

STATUS_FOR: dict[type[errors.ParleyError], int] = {
    errors.NotFound: 404,
    errors.Unauthenticated: 401,
    errors.Conflict: 409,
    errors.IdempotencyKeyReused: 422,
    errors.InvalidRequest: 422,
    errors.AgentPaused: 403,
    errors.Forbidden: 403,
    errors.RateLimited: 429,
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _status(exc: errors.ParleyError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]
    return 500


async def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.ParleyError)
    headers: dict[str, str] | None = None
    if isinstance(exc, errors.Unauthenticated):
        headers = {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, errors.RateLimited):
        headers = {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(
        error_body(exc.code, exc.message, **exc.extra), status_code=_status(exc), headers=headers
    )


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
    field = ".".join(location) or None
    message = f"{field}: {first.get('msg', 'invalid')}" if field else "invalid request"
    return JSONResponse(error_body("invalid_request", message, field=field), status_code=422)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.ParleyError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
