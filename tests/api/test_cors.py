"""CORS per tenant (api/cors.py): a preflight from an origin a tenant lists gets the allow
headers a browser needs; any other origin gets none; an answer is readable cross-origin only
by the origins of the tenant whose token it answered."""

from __future__ import annotations

import uuid

import httpx
import pytest

from parley.store.db import Database
from tests.support.tenants import AdminTenant, new_admin_tenant

APP_A = "https://chat.tenant-a.example"
APP_B = "https://help.tenant-b.example:8443"
STRANGER = "https://evil.example"
ALLOW = "access-control-allow-origin"


async def listing(api_url: str, tenant: AdminTenant, origins: list[str]) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        saved = await http.put(
            f"/v1/admin/tenants/{tenant.tenant_id}/config",
            json={"cors_origins": origins},
            headers={"Authorization": f"Bearer {tenant.token}"},
        )
        assert saved.status_code == 200, saved.text


@pytest.fixture
async def two_tenants(api_url: str, sessions: Database) -> tuple[AdminTenant, AdminTenant]:
    a = await new_admin_tenant(sessions, prefix="cors")
    b = await new_admin_tenant(sessions, prefix="cors")
    await listing(api_url, a, [APP_A])
    await listing(api_url, b, [APP_B])
    return a, b


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type",
    }


async def test_a_preflight_from_a_listed_origin_gets_the_allow_headers_and_no_other_does(
    api_url: str, two_tenants: tuple[AdminTenant, AdminTenant]
) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        for origin in (APP_A, APP_B):
            answer = await http.options("/v1/sessions", headers=preflight(origin))
            assert answer.status_code == 204, answer.text
            assert answer.headers[ALLOW] == origin
            methods = answer.headers["access-control-allow-methods"]
            assert {"GET", "POST", "PUT", "DELETE"} <= set(methods.replace(" ", "").split(","))
            allowed = answer.headers["access-control-allow-headers"].lower()
            assert {"authorization", "content-type", "last-event-id"} <= {
                h.strip() for h in allowed.split(",")
            }
            assert "Origin" in answer.headers["vary"]
            assert "access-control-allow-credentials" not in answer.headers
        # An event stream's resume, from the page of tenant A.
        stream = "/v1/sessions/ses_x/turns/trn_x/events"
        answer = await http.options(stream, headers=preflight(APP_A, "GET"))
        assert answer.headers[ALLOW] == APP_A
        for origin in (STRANGER, "https://chat.tenant-a.example.evil.example", "null"):
            refused = await http.options("/v1/sessions", headers=preflight(origin))
            assert not [h for h in refused.headers if h.startswith("access-control-")], origin


async def test_an_answer_is_readable_only_by_the_origins_of_the_tokens_tenant(
    api_url: str, two_tenants: tuple[AdminTenant, AdminTenant]
) -> None:
    a, _ = two_tenants
    token = {"Authorization": f"Bearer {a.token}"}
    async with httpx.AsyncClient(base_url=api_url) as http:
        own = await http.get("/v1/sessions", headers=token | {"Origin": APP_A})
        assert own.status_code == 200 and own.headers[ALLOW] == APP_A
        exposed = own.headers["access-control-expose-headers"]
        assert "Retry-After" in exposed and "WWW-Authenticate" in exposed
        # Tenant B's page with tenant A's token: the browser may not read the answer.
        theirs = await http.get("/v1/sessions", headers=token | {"Origin": APP_B})
        assert theirs.status_code == 200 and ALLOW not in theirs.headers
        assert (
            ALLOW
            not in (await http.get("/v1/sessions", headers=token | {"Origin": STRANGER})).headers
        )
        # No token: the 401 names no tenant, so a listed page may read why.
        refused = await http.get("/v1/sessions", headers={"Origin": APP_B})
        assert refused.status_code == 401 and refused.headers[ALLOW] == APP_B
        refused = await http.get("/v1/sessions", headers={"Origin": STRANGER})
        assert refused.status_code == 401 and ALLOW not in refused.headers


async def test_a_listing_is_an_exact_origin_and_taking_it_off_refuses_the_origin(
    api_url: str, sessions: Database
) -> None:
    a = await new_admin_tenant(sessions, prefix="cors")
    own = f"https://{uuid.uuid4().hex[:12]}.tenant-a.example"  # listed by this tenant alone
    async with httpx.AsyncClient(base_url=api_url) as http:
        path = f"/v1/admin/tenants/{a.tenant_id}/config"
        token = {"Authorization": f"Bearer {a.token}"}
        for wrong in ("*", f"{own}/", f"{own}/app", own.upper(), "chat.tenant-a.example"):
            refused = await http.put(path, json={"cors_origins": [wrong]}, headers=token)
            assert refused.status_code == 422, (wrong, refused.text)
            assert refused.json()["error"]["field"].startswith("cors_origins"), refused.text
        await listing(api_url, a, [own])
        answer = await http.options("/v1/sessions", headers=preflight(own))
        assert answer.headers[ALLOW] == own
        await listing(api_url, a, [])
        answer = await http.options("/v1/sessions", headers=preflight(own))
        assert ALLOW not in answer.headers
