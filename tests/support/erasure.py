"""Helpers for the erasure tests: fresh customers (a user row, a token, and orders in a
backend of the test's own), a conversation that plants canaries everywhere Parley copies a
user's words, and waiting for an erasure's receipt."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from parley.demo_backend.app import Backend
from parley.demo_backend.app import create_app as create_backend
from parley.demo_backend.data import DEMO_TODAY, SEED, Catalog, Customer
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import User
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import eventually

TENANT = "northwind"


@dataclass(frozen=True)
class Customer_:
    """A customer made for one test: unique ids, an order of their own, canary words."""

    user_id: str
    order_id: str
    canaries: dict[str, str]

    @classmethod
    def new(cls, order_id: str) -> Customer_:
        tag = uuid.uuid4().hex[:6]
        kinds = ("nick", "msg", "paste", "file", "pref", "email")
        # Lowercase letters and digits: full-text vectors keep them whole (canary.py).
        return cls(f"cust_{tag}", order_id, {k: f"canary{k}{tag}" for k in kinds})


def new_customers(count: int) -> list[Customer_]:
    taken = {order.order_id for order in SEED.orders}
    ids = [str(n) for n in range(61000, 69999) if str(n) not in taken]
    return [Customer_.new(ids[i]) for i in range(count)]


@asynccontextmanager
async def backend_with(customers: list[Customer_]) -> AsyncIterator[str]:
    """The demo backend, with these customers added (each owning a copy of Priya's shipped
    order under their own order id)."""
    app = create_backend()
    template = next(o for o in SEED.orders if o.customer_id == "cust_2291")
    catalog = Catalog(
        customers=SEED.customers
        + tuple(
            Customer(TENANT, c.user_id, "Canary", f"{c.user_id}@example.com") for c in customers
        ),
        orders=tuple(
            replace(template, customer_id=c.user_id, order_id=c.order_id) for c in customers
        )
        + SEED.orders,
        refunds=SEED.refunds,
    )
    app.state.backend = Backend(catalog, today=DEMO_TODAY, seed=0)
    async with serve(app) as url:
        yield url


async def add_user(sessions: Database, customer: Customer_) -> str:
    """Store the customer as a Parley user; a token of theirs."""
    async with orm(sessions) as db:
        db.add(
            User(
                tenant_id=TENANT,
                id=customer.user_id,
                display_name="Canary",
                email=f"{customer.user_id}@example.com",
            )
        )
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id=TENANT, user_id=customer.user_id)
        await db.commit()
    return token


async def done_turn(client: ParleyClient, sid: str, text: str, **body: Any) -> str:
    """Post and read the turn to its end; the turn's id."""
    response = await client.http.post(
        f"/v1/sessions/{sid}/messages",
        json={"client_message_id": uuid.uuid4().hex, "text": text, **body},
    )
    assert response.status_code == 202, response.text
    turn_id = str(response.json()["turn_id"])
    events = await client.events(sid, turn_id)
    if events[-1].type == "confirmation_required":
        action = events[-1].data["action"]
        confirmed = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
        assert confirmed.status_code in (200, 202), confirmed.text
        events = await client.events(sid, turn_id, last_event_id=events[-1].id)
    assert events[-1].type == "done", [e.type for e in events]
    return turn_id


async def converse(client: ParleyClient, customer: Customer_, *, turns: int = 3) -> str:
    """One session in which the customer's canaries reach every copy Parley makes: stated
    facts and a consented preference, messages, a pasted document, an uploaded file, a
    confirmed email, and enough turns after them for the summary to fold them. Its id."""
    c, order = customer.canaries, customer.order_id
    consent = await client.http.put("/v1/memory/consent", json={"consent": True})
    assert consent.status_code == 200, consent.text
    sid = await client.new_session()
    await done_turn(client, sid, f"My nickname is {c['nick']}. Please contact me by phone.")
    await done_turn(client, sid, f"I prefer phone, say {c['pref']} when you call.")
    await done_turn(client, sid, f"Where is my order {order}? My reference is {c['msg']}.")
    paste = " ".join(f"Line {n} of the delivery note mentions {c['paste']}." for n in range(40))
    await done_turn(client, sid, f"Here is the note I pasted:\n{paste}")
    upload = await client.http.post(
        f"/v1/sessions/{sid}/files",
        files={
            "file": ("note.txt", f"A note about {c['file']} and my order.".encode(), "text/plain")
        },
    )
    assert upload.status_code == 201, upload.text
    file_id = upload.json()["file_id"]
    await done_turn(client, sid, "What does the file say?", file_ids=[file_id])
    await done_turn(client, sid, f"Can you email me about order {order}? Mention {c['email']}.")
    for n in range(turns):
        await done_turn(client, sid, f"Question {n} about order {order} and {c['msg']}, thanks.")
    return sid


async def receipt(client: ParleyClient, status_url: str, *, timeout: float) -> dict[str, Any]:
    """The erasure's view once it is done (the route asks for no token: the client's is
    revoked by then)."""

    async def done() -> dict[str, Any] | None:
        response = await client.http.get(status_url)
        assert response.status_code == 200, response.text
        body = dict(response.json())
        return body if body["status"] == "done" else None

    return await eventually(done, timeout=timeout, what="the erasure is done", every=0.2)
