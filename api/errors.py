"""The one place where domain errors become HTTP answers in the contract's error shape.

A dependency that is down is not an error of the request: while the database cannot be
reached (`store.db.is_unreachable` tells that from a statement it refused), every route
answers 503 `service_unavailable` with `Retry-After`, naming the dependency, so a client
waits and tries again. Nothing was stored by the refused request (its transaction never
committed), so sending it again is safe; a POST's `client_message_id` makes it so even if
the commit went through and only the answer was lost.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from parley import errors
from parley.api.schemas import ErrorOut
from parley.store.db import StoreError, is_unreachable

STATUS_FOR: dict[type[errors.ParleyError], int] = {
    errors.NotFound: 404,
    errors.Unauthenticated: 401,
    errors.Conflict: 409,
    errors.IdempotencyKeyReused: 422,
    errors.InvalidRequest: 422,
    errors.AgentPaused: 403,
    errors.Forbidden: 403,
    errors.RateLimited: 429,
    errors.ExportExpired: 410,
}


# Answers that are not domain errors but can come from any route (see the handlers below).
_VALIDATION = (422, "invalid_request")
UNAVAILABLE = (503, "service_unavailable")
# What a 503 asks a client to wait: a database restart or failover takes seconds to tens of
# seconds, and a client polling every couple of seconds costs the API next to nothing.
RETRY_AFTER_S = 2
_DESCRIPTION = {
    401: "Missing, unknown or revoked bearer token",
    403: "Not allowed",
    404: "Not found, or not the caller's",
    409: "Conflicts with the resource's current state",
    410: "The link has expired",
    413: "The request body is over the deployment's limit (`api/body_limit.py`)",
    422: "A field breaks the contract",
    429: "A limit is reached; `Retry-After` says when to try again",
    503: "A dependency (the database) is down for now; `Retry-After` says when to try again",
}


def answers(
    *raised: type[errors.ParleyError], authenticated: bool = True
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for the domain errors a route can raise, in the error shape.

    413 and 422 come with every route (the body's size and the request's fields are checked
    before any handler runs), and 401 with every route that takes a token, so they are
    always listed; a route that takes no token says `authenticated=False`.
    """
    codes: dict[int, list[str]] = {
        413: ["payload_too_large"],
        _VALIDATION[0]: [_VALIDATION[1]],
    }
    if authenticated:
        codes[401] = ["unauthenticated"]
    for cls in raised:
        codes.setdefault(_status_of_class(cls), []).append(cls.code)
    out: dict[int | str, dict[str, Any]] = {}
    for status, names in sorted(codes.items()):
        listed = ", ".join(f"`{name}`" for name in dict.fromkeys(names))
        entry: dict[str, Any] = {
            "model": ErrorOut,
            "description": f"{_DESCRIPTION.get(status, 'Error')} (code {listed})",
        }
        if status in (429, UNAVAILABLE[0]):
            entry["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
        out[status] = entry
    return out


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _status_of_class(kind: type[errors.ParleyError]) -> int:
    for cls in kind.__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]
    return 500


def _status(exc: errors.ParleyError) -> int:
    return _status_of_class(type(exc))


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


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # A body that is not JSON at all breaks the contract like any other field does.
        return JSONResponse(
            error_body("invalid_request", f"body: {exc.detail}", field="body"), status_code=422
        )
    headers = exc.headers
    if exc.status_code == 405:
        # Starlette names only the methods of the one route it tried; list the path's all.
        headers = {**(headers or {}), "Allow": ", ".join(_methods_at(request))}
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers
    )


def _methods_at(request: Request) -> list[str]:
    """The methods the OpenAPI document lists for the request's path."""
    path = request.url.path
    for template, operations in request.app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\{[^/}]+\}", "[^/]+", template), path):
            return sorted(method.upper() for method in operations)
    return []


def unavailable_answer() -> dict[str, Any]:
    """The OpenAPI entry of the 503 every route that reads the database may answer."""
    status, code = UNAVAILABLE
    return {
        "description": f"{_DESCRIPTION[status]} (code `{code}`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }


def unavailable_response(dependency: str) -> JSONResponse:
    message = f"the {dependency} is unreachable for now; try again shortly"
    return JSONResponse(
        error_body(UNAVAILABLE[1], message, dependency=dependency),
        status_code=UNAVAILABLE[0],
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _store_error(_: Request, exc: Exception) -> JSONResponse:
    """The database is down (503, a delay); a statement it refused stays a 500 (a bug)."""
    if is_unreachable(exc):
        return unavailable_response("database")
    raise exc


def install(app: FastAPI) -> None:
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(errors.ParleyError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
