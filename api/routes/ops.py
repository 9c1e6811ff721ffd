"""Health, readiness and metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from parley.api.deps import DbSession, Temporal
from parley.api.errors import RETRY_AFTER_S
from parley.api.schemas import Health, Readiness
from parley.store.db import ping

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "The database or Temporal is down; `Retry-After` says when to ask again",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        }
    },
)
async def readyz(db: DbSession, temporal: Temporal) -> JSONResponse:
    """The database and Temporal are reachable."""
    checks: dict[str, str] = {}
    try:
        await ping(db)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        client = await asyncio.wait_for(temporal.get(), 3)
        await asyncio.wait_for(client.service_client.check_health(), 3)
        checks["temporal"] = "ok"
    except Exception as exc:
        checks["temporal"] = f"unreachable: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(ready=ready, checks=checks)
    if ready:
        return JSONResponse(body.model_dump())
    # As every other 503 asks (api/errors.py): a restart takes seconds.
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(body.model_dump(), status_code=503, headers=headers)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
