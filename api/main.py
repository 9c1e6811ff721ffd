"""Assembles the FastAPI application."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from temporalio.client import Interceptor

from parley.api import errors
from parley.api.body_limit import BodyLimit
from parley.api.cors import AllowedOrigins, TenantCors
from parley.api.deps import TemporalConnector
from parley.api.logcontext import RequestLogContext
from parley.api.metrics import count_database_work
from parley.api.routes import (
    actions,
    admin,
    ai_sdk,
    branches,
    budgets,
    costs,
    erasure,
    exports,
    feedback,
    files,
    handoffs,
    imports,
    live,
    memory,
    ops,
    sessions,
    turns,
    web,
)
from parley.api.streaming import EventHub, StreamRegistry
from parley.config import Settings, get_settings
from parley.dispatch.control import cancel_turn_workflow
from parley.dispatch.telemetry import telemetry_for
from parley.errors import TurnFinished
from parley.jwks import KeySets
from parley.store.db import (
    Database,
    create_socket_checked_engine,
    libpq_url,
)


def create_app(
    settings: Settings | None = None, *, temporal_interceptors: Sequence[Interceptor] = ()
) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.database_url is None:
            raise RuntimeError("DATABASE_URL is not set (use `parley dev` to run everything)")
        _open_database(app, settings.database_url)
        app.state.settings = settings
        app.state.temporal = TemporalConnector(settings, _interceptors(app, temporal_interceptors))
        app.state.hub = EventHub(libpq_url(settings.listen_database_url or settings.database_url))
        temporal = app.state.temporal
        sessions = app.state.sessions

        async def cancel_abandoned(turn_id: str) -> None:
            try:
                await cancel_turn_workflow(await temporal.get(), sessions, turn_id=turn_id)
            except TurnFinished:
                pass  # it ended while nobody watched; its ending stands

        app.state.streams = StreamRegistry(
            sessions=app.state.autocommit_sessions,
            cancel_turn=cancel_abandoned,
            max_per_user=settings.max_streams_per_user,
            lease_s=settings.stream_lease_s,
            grace_s=settings.stream_grace_s,
        )
        await app.state.hub.start()
        try:
            async with AsyncExitStack() as stack:
                app.state.key_sets = await stack.enter_async_context(KeySets())  # parley/jwks.py
                if settings.api_worker:
                    # Eager starts need the worker on the very client that starts the turns.
                    from parley.worker import embedded_worker

                    await stack.enter_async_context(embedded_worker(await temporal.get(), settings))
                yield
        finally:
            await app.state.streams.close()
            await app.state.hub.stop()
            for each in app.state.engines:
                await each.dispose()
            await _stop_tracing(app)

    app = FastAPI(
        title="Parley session API",
        version="1",
        summary="Durable chat turns: sessions, messages, streamed turn events.",
        lifespan=lifespan,
    )
    errors.install(app)
    _add_middleware(app, settings)
    _add_routes(app)
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    _trace(app, settings)
    return app


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    app.add_middleware(RequestLogContext)
    # A body is refused before routing, authentication or parsing.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, larger=_larger(settings))
    # Outermost of ours: a preflight is answered before anything else, and every answer,
    # a refused body's too, carries the tenant's CORS headers.
    app.state.cors_origins = AllowedOrigins()
    app.add_middleware(TenantCors, origins=app.state.cors_origins)


def _larger(settings: Settings) -> dict[str, int]:
    """The routes whose bodies have limits of their own: an upload's, an import's."""
    return {
        files.UPLOAD_PATH: settings.max_file_bytes,
        imports.IMPORT_PATH: settings.max_import_bytes,
    }


def _add_routes(app: FastAPI) -> None:
    for routes in (
        sessions,
        turns,
        branches,
        live,
        imports,
        actions,
        ai_sdk,
        memory,
        files,
        feedback,
        exports,
        erasure,
        handoffs,
        admin,
        costs,
        budgets,
        ops,
        web,
    ):
        app.include_router(routes.router)
    app.mount(web.STATIC_PREFIX, web.web_files(), name="static")


def _trace(app: FastAPI, settings: Settings) -> None:
    """Traces (PARLEY_OTLP_ENDPOINT): a span for each request, outermost, and the Temporal
    client's interceptor that carries a request's trace into the turn it starts. Off,
    `app.state.telemetry` is None and nothing is installed."""
    app.state.telemetry = telemetry_for(settings, "parley-api")
    if app.state.telemetry is not None:
        app.state.telemetry.instrument(app)


def _interceptors(app: FastAPI, given: Sequence[Interceptor]) -> Sequence[Interceptor]:
    telemetry = app.state.telemetry
    return given if telemetry is None else [telemetry.interceptor, *given]


async def _stop_tracing(app: FastAPI) -> None:
    """Export what is still batched (in a thread: the export may be slow), then stop."""
    if app.state.telemetry is not None:
        await asyncio.to_thread(app.state.telemetry.shutdown)


def _open_database(app: FastAPI, url: str) -> None:
    """The API's engines, each counted on /metrics, and their session factories."""
    engine = create_socket_checked_engine(url)
    # For work that is one statement (a stream's reads, its end, marking a turn started):
    # a pool of its own, whose connections stay in autocommit mode.
    one_statement = create_socket_checked_engine(url, pool_size=5, max_overflow=10, autocommit=True)
    app.state.engines = (engine, one_statement)
    for each in app.state.engines:
        count_database_work(each)
    app.state.sessions = Database(engine)
    app.state.autocommit_sessions = Database(one_statement, autocommit=True)


# The routes that answer without the database; every other one may answer 503 while it is
# down (api/errors.py).
WITHOUT_DATABASE = {"/healthz", "/metrics"}


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's document, with this deployment's message size limit, a 503 on each route
    that reads the database, and with each event stream's frame model under
    `text/event-stream`.

    sse-starlette's response class names no media type, so FastAPI files the frame model of
    `responses={200: {"model": ..., "content": {"text/event-stream": {}}}}` under
    `application/json`; clients must see only the stream's own type, with the model as the
    schema of each frame (`itemSchema`).
    """
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                if path not in WITHOUT_DATABASE:
                    operation["responses"].setdefault("503", errors.unavailable_answer())
                for answer in operation["responses"].values():
                    content = answer.get("content", {})
                    if "text/event-stream" in content and "application/json" in content:
                        frame = content.pop("application/json")["schema"]
                        content["text/event-stream"] = {"itemSchema": frame}
        post = schema["components"]["schemas"]["PostMessageIn"]
        post["properties"]["text"]["maxLength"] = settings.max_message_chars
        bodies = schema["components"]["schemas"]
        bodies["ImportItemIn"]["properties"]["text"]["maxLength"] = settings.max_message_chars
        bodies["EditMessageIn"]["properties"]["text"]["maxLength"] = settings.max_message_chars
        bodies["ImportIn"]["properties"]["items"]["maxItems"] = settings.max_import_messages
        app.openapi_schema = schema
    return app.openapi_schema
