"""What the web page needs from the API: the session list's titles and times, deleting a
session, the page's settings, the dev-only sign-in, and the page's security headers."""

from __future__ import annotations

import re

import httpx
from temporalio.client import Client

from parley.api.routes.web import CONTENT_SECURITY_POLICY
from parley.config import Settings
from tests.support.client import ParleyClient
from tests.support.stack import serve_api


async def test_the_list_titles_sessions_by_their_first_message_and_dates_their_activity(
    marco: ParleyClient,
) -> None:
    empty = await marco.new_session()
    chatted = await marco.new_session()
    await marco.turn(chatted, "Where is my order?")
    listed = {s["id"]: s for s in (await marco.http.get("/v1/sessions")).json()["sessions"]}
    assert listed[empty]["title"] is None
    assert listed[empty]["last_activity_at"] == listed[empty]["created_at"]
    assert listed[chatted]["title"] == "Where is my order?"
    assert listed[chatted]["last_activity_at"] > listed[chatted]["created_at"]
    assert listed[chatted]["last_seq"] >= 2


async def test_delete_hides_the_session_from_its_owner_and_only_the_owner_can(
    priya: ParleyClient, marco: ParleyClient
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    assert (await marco.http.delete(f"/v1/sessions/{sid}")).status_code == 404
    assert (await priya.http.delete("/v1/sessions/ses_missing")).status_code == 404

    deleted = await priya.http.delete(f"/v1/sessions/{sid}")
    assert deleted.status_code == 204 and deleted.content == b""
    for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/messages"):
        gone = await priya.http.get(path)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert (await priya.post(sid, "Hello again")).status_code == 404
    listed = (await priya.http.get("/v1/sessions")).json()["sessions"]
    assert sid not in {s["id"] for s in listed}
    assert (await priya.http.delete(f"/v1/sessions/{sid}")).status_code == 404


async def test_the_page_settings_offer_demo_users_in_dev(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        config = (await http.get("/web/config")).json()
        signed = await http.post("/dev/sign-in/northwind/cust_2291")
        refused = [
            await http.post("/dev/sign-in/northwind/ops_admin"),  # not a customer
            await http.post("/dev/sign-in/northwind/cust_9001"),  # another tenant's user
            await http.post("/dev/sign-in/nowhere/cust_2291"),
        ]
    users = [(u["tenant_id"], u["user_id"], u["display_name"]) for u in config["demo_users"]]
    assert ("northwind", "cust_2291", "Priya") in users
    assert ("northwind", "cust_3301", "Marco") in users
    assert ("northwind", "cust_4410", "Dana") in users
    assert all(user != "ops_admin" for _, user, _ in users)
    assert config["turn_link_template"] is None  # no Temporal UI advertised
    assert signed.status_code == 201
    assert signed.json()["user"] == {
        "tenant_id": "northwind",
        "user_id": "cust_2291",
        "display_name": "Priya",
    }
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {signed.json()['token']}"}
    ) as priya:
        assert (await priya.get("/v1/sessions")).status_code == 200
    assert [r.status_code for r in refused] == [404, 404, 404]


async def test_outside_dev_there_is_no_sign_in_and_no_demo_users(
    settings: Settings, temporal_client: Client
) -> None:
    production = settings.model_copy(
        update={"env": "production", "temporal_ui_url": "https://temporal.example/"}
    )
    async with serve_api(production) as url, httpx.AsyncClient(base_url=url) as http:
        config = (await http.get("/web/config")).json()
        sign_in = await http.post("/dev/sign-in/northwind/cust_2291")
    assert config == {
        "demo_users": [],
        "turn_link_template": (
            "https://temporal.example/namespaces/default/workflows/turn-{turn_id}"
        ),
    }
    assert sign_in.status_code == 404
    assert sign_in.json()["error"]["code"] == "not_found"


async def test_the_page_and_its_files_carry_a_strict_content_security_policy(
    api_url: str,
) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        page = await http.get("/")
        script = await http.get("/static/js/app.js")
        vendored = await http.get("/static/vendor/dompurify/purify.es.mjs")
    for response in (page, script, vendored):
        assert response.status_code == 200
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
    policy = dict(p.split(" ", 1) for p in CONTENT_SECURITY_POLICY.split("; "))
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    # A skill's image is shown from an object URL the page made; nothing is unsafe.
    assert policy["img-src"] == "'self' data: blob:"
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    # The page itself holds no inline script or style for the policy to refuse.
    html = page.text
    assert "<script>" not in html and "<style" not in html and " style=" not in html
    assert re.search(r"\son[a-z]+=", html) is None  # no inline event handlers
