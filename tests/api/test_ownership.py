"""Ownership matrix: every route the OpenAPI document lists, called on Priya's own
resources by everyone who must not reach them, answers exactly as if they did not exist
(or 401 for a dead token), and nothing in the database changes. The intruders come with
Parley's own tokens and again with tokens of their tenant's identity provider (a local
issuer per demo tenant, parley/oidc.py).

Routes are read from `/openapi.json`, so a route added later joins the matrix by itself;
a route that documents no 401 must be on the short list of public ones.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text, update
from sqlalchemy.dialects.postgresql import insert

from parley.budget_approvals import approval_id
from parley.consented import Remembered
from parley.oidc import OidcConfig
from parley.store import budgets, handoffs, tenants, user_memory
from parley.store.db import Database
from parley.store.identity import create_token, revoke_token
from parley.store.models import ApiToken, User
from parley.tenancy import TenantConfig
from tests.support.client import ParleyClient
from tests.support.issuer import LocalIssuer, local_issuer
from tests.support.orm import orm
from tests.support.toolkit import eventually, propose

PUBLIC = {
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    # The page's own settings (demo users in dev, the Temporal UI link): no user data.
    ("get", "/web/config"),
    # Mints a token for a seeded demo customer in dev only; 404 everywhere else.
    ("post", "/dev/sign-in/{tenant_id}/{user_id}"),
    # An erasure's receipt, by its unguessable id: the erased user's tokens are gone by the
    # time it is read, and it names nobody (tests/system/test_erasure.py).
    ("get", "/v1/erasures/{erasure_id}"),
}
# Routes that act on the caller alone and name nobody else's resource: called by an
# intruder they would erase the intruder. tests/system/test_erasure.py shows another
# user's rows byte-identical across an erasure.
CALLER_ONLY = {("delete", "/v1/me")}
# Routes with no id in their path whose body names the session (the AI SDK's chat id): a
# stranger's call is a 404, as for a path that names it.
NAMED_IN_BODY = {("post", "/v1/ai-sdk/chat")}
MISSING = {
    "session_id": "ses_missing",
    "turn_id": "trn_missing",
    "action_id": "act_missing",
    "tenant_id": "tenant_missing",
    "key": "key_missing",
    "file_id": "file_missing",
    "message_id": "msg_missing",
    "export_id": "exp_missing",
    "import_id": "imp_missing",
    "version": "1",
    "handoff_id": "hof_missing",
}
# Rows that any of the matrix's requests could touch, read as JSON text in a stable order.
SNAPSHOT = {
    "sessions": "SELECT * FROM sessions WHERE id = :sid",
    "messages": "SELECT * FROM messages WHERE session_id = :sid ORDER BY seq",
    "branches": "SELECT * FROM branches WHERE session_id = :sid ORDER BY number",
    "turns": "SELECT * FROM turns WHERE session_id = :sid ORDER BY id",
    "turn_events": "SELECT e.* FROM turn_events e JOIN turns t ON t.id = e.turn_id "
    "WHERE t.session_id = :sid ORDER BY e.turn_id, e.id",
    "actions": "SELECT * FROM actions WHERE session_id = :sid ORDER BY id",
    "slots": "SELECT * FROM slots WHERE session_id = :sid ORDER BY name",
    "tenants": "SELECT * FROM tenants ORDER BY id",
    # Priya's and the tenants' counters (the others' own new sessions count for them).
    "usage_counters": "SELECT * FROM usage_counters WHERE subject IN "
    "('northwind/cust_2291', 'northwind', 'southwind') ORDER BY scope, subject, window_start",
    # Streams of her session held by anyone else (her own leases renew on their own clock,
    # each renewal a new row, so they are left out).
    "stream_leases": "SELECT tenant_id, user_id FROM stream_leases WHERE session_id = :sid "
    "AND NOT (tenant_id = 'northwind' AND user_id = 'cust_2291') ORDER BY tenant_id, user_id",
    # Priya's imports of earlier messages: nobody else may add one to her session.
    "imports": "SELECT * FROM imports WHERE session_id = :sid ORDER BY id",
    # Priya's durable memory: the others' own consent and items are theirs to change.
    "memory_consents": "SELECT * FROM memory_consents WHERE user_id = 'cust_2291'",
    "user_memory": "SELECT * FROM user_memory WHERE user_id = 'cust_2291' ORDER BY key",
    # Priya's uploads and ratings: nobody else may add to or change them.
    "files": "SELECT id, name, bytes, text FROM files WHERE session_id = :sid ORDER BY id",
    "feedback": "SELECT * FROM feedback WHERE session_id = :sid ORDER BY message_id",
    # Priya's exports: nobody else may read, add to or change them.
    "exports": "SELECT id, state, bytes, expires_at FROM exports WHERE user_id = 'cust_2291' "
    "ORDER BY id",
    # Northwind's request to go over its month's budget: only its own operator decides it.
    "budget_approvals": "SELECT * FROM budget_approvals WHERE tenant_id = 'northwind'",
    # Her hand-off to a person: no customer is an agent, so nobody else may work it.
    "handoffs": "SELECT * FROM handoffs WHERE session_id = :sid ORDER BY id",
    "handoff_notes": "SELECT n.* FROM handoff_notes n JOIN handoffs h ON h.id = n.handoff_id "
    "WHERE h.session_id = :sid ORDER BY n.id",
    "handoff_events": "SELECT e.* FROM handoff_events e JOIN handoffs h ON h.id = e.handoff_id "
    "WHERE h.session_id = :sid ORDER BY e.handoff_id, e.id",
}
# The agent inbox: a customer is no agent, of whichever tenant (403 before any lookup).
INBOX = "/v1/handoffs"


async def snapshot(sessions: Database, sid: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    async with orm(sessions) as db:
        for table, query in SNAPSHOT.items():
            result = await db.execute(text(query), {"sid": sid} if ":sid" in query else {})
            rows[table] = [json.dumps(dict(r._mapping), default=str) for r in result]
    return rows


# An imported line's time: well before the test runs.
EARLIER = "2026-01-01T09:00:00+00:00"


def body_for(method: str, path: str, params: dict[str, str]) -> dict[str, Any] | None:
    if (method, path) in NAMED_IN_BODY:
        said = {"type": "text", "text": "Show me their orders"}
        message = {"id": uuid.uuid4().hex, "role": "user", "parts": [said]}
        return {"id": params["session_id"], "messages": [message], "trigger": "submit-message"}
    if path.endswith("/messages") and method == "post":
        return {"client_message_id": uuid.uuid4().hex, "text": "Show me their orders"}
    if path.endswith("/edit") and method == "post":
        return {"client_message_id": uuid.uuid4().hex, "text": "Call me Mallory"}
    if path.endswith("/import") and method == "post":
        line = {"role": "user", "text": "My address is not yours to change.", "created_at": EARLIER}
        return {"client_import_id": uuid.uuid4().hex, "items": [line]}
    if path.endswith("/config") and method == "put":
        return {"persona": "Answer in pirate speak."}
    if path == "/v1/memory/consent":
        return {"consent": False}
    if path.endswith("/notes") and method == "post":
        return {"text": "an agent's note"}
    if path.endswith("/feedback") and method == "post":
        return {"rating": "down", "comment": "not mine to rate"}
    return None


def upload_for(method: str, path: str) -> dict[str, Any] | None:
    """A multipart upload for the files route (its body is a form, not JSON)."""
    if path.endswith("/files") and method == "post":
        return {"file": ("intruder.txt", b"a file from someone else", "text/plain")}
    return None


async def call(
    http: httpx.AsyncClient, token: str, method: str, template: str, params: dict[str, str]
) -> httpx.Response:
    return await http.request(
        method.upper(),
        template.format(**params),
        json=body_for(method, template, params),
        files=upload_for(method, template),
        headers={"Authorization": f"Bearer {token}"},
    )


async def handed_off(sessions: Database, session_id: str, turn_id: str) -> str:
    """A case of Priya's session, opened as the model's `handoff_to_human` opens one (no
    workflow: nothing in the matrix needs it to move)."""
    async with sessions() as db:
        case, _ = await handoffs.open_handoff(
            db,
            handoff_id=f"hof_{uuid.uuid4().hex[:12]}",
            session_id=session_id,
            turn_id=turn_id,
            reason="a person, please",
        )
        await db.commit()
    return case.id


async def budget_asked(sessions: Database) -> None:
    """Northwind's operator asked to approve going over this month's budget, as a refused turn
    asks (marked started, so no sweep starts its workflow: nothing here needs it to wait)."""
    month = datetime.now(UTC).date().replace(day=1)
    async with sessions() as db:
        await budgets.ask_approval(
            db,
            approval_id=approval_id(tenant_id="northwind", period_start=month),
            tenant_id="northwind",
            period_start=month,
            timeout_s=86400,
        )
        await budgets.mark_approval_started(
            db, approval_id=approval_id(tenant_id="northwind", period_start=month)
        )
        await db.commit()


async def agent_token(sessions: Database) -> str:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="agent_sam")
        await db.commit()
    return token


async def dead_tokens(sessions: Database, user: str) -> dict[str, str]:
    """Two tokens of the owner that worked once: one revoked, one past its expiry."""
    async with sessions() as db:
        revoked = await create_token(db, tenant_id="northwind", user_id=user)
        expired = await create_token(
            db, tenant_id="northwind", user_id=user, ttl=timedelta(hours=1)
        )
        await db.commit()
    async with sessions() as db:
        assert await revoke_token(db, token=revoked)
        await db.commit()
    async with orm(sessions) as db:
        # An hour passes for this token: its expiry moves into the past.
        await db.execute(
            update(ApiToken)
            .where(ApiToken.expires_at.is_not(None), ApiToken.user_id == user)
            .values(expires_at=ApiToken.expires_at - timedelta(hours=2))
        )
        await db.commit()
    return {"revoked token": revoked, "expired token": expired}


@pytest.fixture
async def southwind_admin(sessions: Database) -> str:
    """An admin of another tenant (the demo seeds none)."""
    async with orm(sessions) as db:
        await db.execute(
            insert(User)
            .values(
                tenant_id="southwind",
                id="ops_south",
                display_name="Southwind operator",
                roles=["admin"],
            )
            .on_conflict_do_nothing()
        )
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id="southwind", user_id="ops_south")
        await db.commit()
    return token


@pytest.fixture
async def idp_users(sessions: Database) -> AsyncIterator[dict[str, dict[str, str]]]:
    """Callers signed in through each demo tenant's own identity provider (a local issuer
    per tenant, named in its config for this test): a northwind customer, a southwind
    customer and admin, and one whose token has expired."""
    async with local_issuer() as north, local_issuer() as south:
        saved = {tid: await with_issuer(sessions, tid, idp) for tid, idp in _pair(north, south)}
        try:
            yield {
                "same tenant (its IdP)": dict.fromkeys(
                    ("session", "admin"), north.token("idp_mallory")
                ),
                "other tenant (its IdP)": {
                    "session": south.token("idp_eve"),
                    "admin": south.token("idp_eve", roles=["admin"]),
                },
                "expired IdP token": dict.fromkeys(
                    ("session", "admin"), north.token("cust_idp", exp=1_700_000_000)
                ),
            }
        finally:
            for tenant_id, config in saved.items():
                async with sessions() as db:
                    await tenants.set_config(db, tenant_id=tenant_id, config=config)
                    await db.commit()


def _pair(north: LocalIssuer, south: LocalIssuer) -> list[tuple[str, LocalIssuer]]:
    return [("northwind", north), ("southwind", south)]


async def with_issuer(sessions: Database, tenant_id: str, idp: LocalIssuer) -> TenantConfig:
    """Name the issuer in the tenant's config (over what it holds); the config before."""
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id=tenant_id)
        oidc = OidcConfig.model_validate(idp.config())
        await tenants.set_config(
            db, tenant_id=tenant_id, config=before.model_copy(update={"oidc": oidc})
        )
        await db.commit()
    return before


@pytest.fixture
async def priya_remembers(priya: ParleyClient, sessions: Database) -> AsyncIterator[str]:
    """Priya consents to durable memory and has one item (its key); both gone afterwards."""
    assert (await priya.http.put("/v1/memory/consent", json={"consent": True})).is_success
    async with sessions() as db:
        written = await user_memory.remember(
            db,
            tenant_id="northwind",
            user_id="cust_2291",
            remembered=[Remembered("contact_channel", "email", "message:seeded")],
            ttl_days=30,
        )
        await db.commit()
    assert written == ["contact_channel"]
    yield "contact_channel"
    await priya.http.put("/v1/memory/consent", json={"consent": False})


async def exported(priya: ParleyClient) -> str:
    """An export of Priya's data, written (so nothing changes it while the matrix runs)."""
    asked = await priya.http.get("/v1/me/export")
    assert asked.status_code == 202, asked.text

    async def ready() -> bool:
        status = await priya.http.get(asked.json()["status_url"])
        return bool(status.json()["state"] == "ready")

    await eventually(ready, timeout=60, what="Priya's export is written")
    return str(asked.json()["id"])


async def export_exists(sessions: Database, export_id: str) -> bool:
    async with orm(sessions) as db:
        found = await db.scalar(text("SELECT 1 FROM exports WHERE id = :id"), {"id": export_id})
    return found is not None


async def test_every_route_refuses_everyone_but_the_owner_and_changes_nothing(
    api_url: str,
    priya: ParleyClient,
    priya_remembers: str,
    tokens: dict[str, str],
    southwind_admin: str,
    idp_users: dict[str, dict[str, str]],
    sessions: Database,
) -> None:
    sid = await priya.new_session()
    line = {"role": "user", "text": "I moved house last spring.", "created_at": EARLIER}
    imported = await priya.http.post(
        f"/v1/sessions/{sid}/import", json={"client_import_id": "priyas", "items": [line]}
    )
    assert imported.status_code == 202, imported.text
    turn_id, _, action = await propose(priya, sid)  # rests awaiting confirmation
    upload = await priya.http.post(
        f"/v1/sessions/{sid}/files", files={"file": ("mine.txt", b"Priya's notes", "text/plain")}
    )
    assert upload.status_code == 201, upload.text
    answer = next(m for m in await priya.messages(sid) if m["role"] == "assistant")
    export_id = await exported(priya)
    handoff_id = await handed_off(sessions, sid, turn_id)
    await budget_asked(sessions)
    owned = {
        "session_id": sid,
        "turn_id": turn_id,
        "action_id": action["id"],
        "tenant_id": "northwind",
        "key": priya_remembers,
        "file_id": upload.json()["file_id"],
        "message_id": answer["id"],
        "export_id": export_id,
        "import_id": imported.json()["id"],
        "version": "1",  # the answer's first version: another user may not switch to it
        "handoff_id": handoff_id,
    }
    intruders = {
        "same tenant": {"session": tokens["marco"], "admin": tokens["marco"]},
        "other tenant": {"session": tokens["ines"], "admin": southwind_admin},
    }
    for name, token in (await dead_tokens(sessions, "cust_2291")).items():
        intruders[name] = {"session": token, "admin": token}
    for name, token in (await dead_tokens(sessions, "ops_admin")).items():
        intruders[name]["admin"] = token
    # The same callers again, signed in through their tenant's identity provider.
    intruders |= idp_users

    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        spec = (await http.get("/openapi.json")).json()
        routes = [
            (method, path)
            for path, operations in spec["paths"].items()
            for method, operation in operations.items()
            if (method, path) not in PUBLIC | CALLER_ONLY
        ]
        for method, path in routes:
            assert "401" in spec["paths"][path][method]["responses"], (
                f"{method} {path} documents no 401: is it meant to be public?"
            )
        for method, path in PUBLIC:
            assert "401" not in spec["paths"][path][method]["responses"], (
                f"{method} {path} takes no token but documents a 401"
            )
        before = await snapshot(sessions, sid)
        checked = 0
        for who, by_kind in intruders.items():
            for method, path in routes:
                token = by_kind["admin" if path.startswith("/v1/admin/") else "session"]
                theirs = await call(http, token, method, path, owned)
                where = f"{who}: {method.upper()} {path}"
                checked += 1
                if path.startswith(INBOX) and not who.endswith("token"):
                    assert theirs.status_code == 403, where
                    continue
                if (
                    "{" not in path
                    and (method, path) not in NAMED_IN_BODY
                    and not who.endswith("token")
                ):
                    # The caller's own collection (list, create): never Priya's session.
                    assert theirs.status_code < 300 and sid not in theirs.text, where
                    continue
                missing = await call(http, token, method, path, MISSING)
                allowed = {401} if who.endswith("token") else {404}
                if path.startswith("/v1/admin/") and who.startswith("same tenant"):
                    allowed = {403}  # a customer is no admin, whichever tenant is named
                assert theirs.status_code in allowed, (where, theirs.status_code, theirs.text)
                assert theirs.status_code == missing.status_code, where
                assert theirs.json() == missing.json(), where
        after = await snapshot(sessions, sid)
        # Her export archives may only go: a session of hers another test deleted is erased
        # when its grace ends, on its own clock, and takes her archives with it
        # (store/lifecycle/erasure_catalogue.py). No route deletes an archive, and a session
        # deleted by an intruder would show in `sessions`; none may be added or changed.
        assert set(after.pop("exports")) <= set(before.pop("exports"))
        assert after == before, [t for t in before if before[t] != after[t]]
        # The owner still reaches everything that was refused to the others (GETs only,
        # to leave the state as it is).
        admin = tokens["admin"]
        agent = await agent_token(sessions)
        for method, path in routes:
            if method == "get":
                token = admin if path.startswith("/v1/admin/") else tokens["priya"]
                token = agent if path.startswith(INBOX) else token
                if path.endswith("/events"):
                    continue  # a resting turn's stream is read by `propose` already
                if path.endswith("/stream"):
                    continue  # it never ends: tests/api/test_session_stream.py reads it
                response = await call(http, token, method, path, owned)
                if response.status_code == 404 and "{export_id}" in path:
                    # Erased meanwhile with a deleted session of hers (above): gone, not hidden.
                    assert not await export_exists(sessions, export_id), (path, response.text)
                    continue
                ok = 202 if path == "/v1/me/export" else 200  # asking for an export
                assert response.status_code == ok, (path, response.text)
    print(f"\nownership matrix: {len(routes)} routes x {len(intruders)} callers = {checked} cases")
    assert checked == len(routes) * len(intruders)


async def test_revocation_takes_effect_on_the_next_request(
    api_url: str, sessions: Database
) -> None:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="cust_3301")
        await db.commit()
    client = ParleyClient(api_url, token)
    try:
        sid = await client.new_session()
        async with sessions() as db:
            assert await revoke_token(db, token=token)
            await db.commit()
        refused = await client.http.get(f"/v1/sessions/{sid}")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthenticated"
    finally:
        await client.aclose()
