"""The chat page: its HTML, its static files, the settings it reads before sign-in, and the
dev-only sign-in as a seeded demo user.

The page runs under a strict Content-Security-Policy: scripts and styles come only from the
files under `api/web/`, so neither inline script nor a `style` attribute (nor anything model
text might smuggle into the page) runs. Model text is rendered as Markdown by a vendored
library and sanitised again before it is inserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from parley.api.deps import AppSettings, DbSession
from parley.api.errors import answers
from parley.api.schemas import DemoUser, DevSignIn, WebConfig
from parley.config import Settings
from parley.errors import NotFound
from parley.store import identity

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
STATIC_PREFIX = "/static"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # blob:: a skill's image, fetched with the bearer token from the owner-only files
        # route, is shown from an object URL the page made (api/web/js/transcript.js).
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# A demo id is a stored user id (64 characters at most).
DemoId = Annotated[str, PathParam(min_length=1, max_length=64)]

# The sign-in hands a token out, so it never asks for one: no 401.
DEV_ANSWERS = {status: entry for status, entry in answers(NotFound).items() if status != 401}

router = APIRouter(tags=["web"])


@router.get("/", include_in_schema=False)
async def web_page() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html", media_type="text/html", headers=SECURITY_HEADERS)


@router.get("/inbox", include_in_schema=False)
async def inbox_page() -> FileResponse:
    """The support agents' inbox (role `agent`, docs/features/handoff.md)."""
    return FileResponse(WEB_DIR / "inbox.html", media_type="text/html", headers=SECURITY_HEADERS)


@router.get("/examples/use-chat", include_in_schema=False)
async def use_chat_example() -> FileResponse:
    """The example page on @ai-sdk/react's useChat (docs/features/ai-sdk.md)."""
    page = WEB_DIR / "examples" / "use-chat.html"
    return FileResponse(page, media_type="text/html", headers=SECURITY_HEADERS)


@router.get("/web/config")
async def web_config(db: DbSession, settings: AppSettings) -> WebConfig:
    """What the page offers before sign-in: the demo users (dev only) and the turn links."""
    users = await identity.demo_customers(db) if _is_dev(settings) else []
    return WebConfig(
        demo_users=[_demo_user(user) for user in users],
        turn_link_template=settings.turn_workflow_url("{turn_id}"),
    )


@router.post("/dev/sign-in/{tenant_id}/{user_id}", status_code=201, responses=DEV_ANSWERS)
async def dev_sign_in(
    tenant_id: DemoId, user_id: DemoId, db: DbSession, settings: AppSettings
) -> DevSignIn:
    """Dev only: a fresh token for a seeded demo customer. 404 outside dev or for anyone else."""
    if not _is_dev(settings):
        raise NotFound("not found")
    users = {(u.tenant_id, u.id): u for u in await identity.demo_customers(db)}
    user = users.get((tenant_id, user_id))
    if user is None:
        raise NotFound("no such demo user")
    token = await identity.create_token(db, tenant_id=tenant_id, user_id=user_id)
    await db.commit()
    return DevSignIn(token=token, user=_demo_user(user))


class WebFiles(StaticFiles):
    """The page's scripts, styles and vendored libraries, under the same headers as the page."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await super().__call__(scope, receive, send_with_headers)


def web_files() -> WebFiles:
    return WebFiles(directory=WEB_DIR)


def _is_dev(settings: Settings) -> bool:
    return settings.env == "dev"


def _demo_user(user: identity.UserRow) -> DemoUser:
    return DemoUser(tenant_id=user.tenant_id, user_id=user.id, display_name=user.display_name)
