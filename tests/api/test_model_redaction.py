"""Model-facing redaction (issue 28): a tenant that sets `redact_model_input` sends no card
number and no email address to a provider, in a turn's prompt or the summarizer's, while the
stored messages keep the user's words; a tenant that does not sends the text unchanged. With
the real PostgreSQL and Temporal; the mask itself is tested at the end, as pure code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.contracts import SummarizeInput
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.registry import ProviderPool
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.toolkit import model_calls, store_history

CARD = "4111 1111 1111 1111"  # a test number that passes the Luhn check
ADDRESS = "priya.alt@example.org"
SAID_BEFORE = [
    ("user", f"My card is {CARD} and my other address is {ADDRESS}, for the record."),
    ("assistant", "Thanks, noted. I will not need your card for an order question."),
]
BASE = "/v1/admin/tenants/northwind/config"


@pytest_asyncio.fixture
async def admin(api_url: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(api_url, tokens["admin"])
    yield client
    await client.http.put(BASE, json={})  # the shared tenant as the other tests expect it
    await client.aclose()


async def configure(admin: ParleyClient, config: dict[str, Any]) -> None:
    response = await admin.http.put(BASE, json=config)
    assert response.status_code == 200, response.text


async def seeded(sessions: Database, client: ParleyClient, *, exchanges: int = 0) -> str:
    """A session whose earlier exchange (stored before a screen refused card numbers) holds a
    card number and an address: the next turn's window shows them to the model. `exchanges`
    more after it, so a summary has something to fold."""
    sid = await client.new_session()
    said = list(SAID_BEFORE)
    for n in range(exchanges):
        said += [
            ("user", f"Question {n} about the delivery of order 8472, in a few more words."),
            ("assistant", f"Answer {n}: order 8472 is on its way and nothing has changed."),
        ]
    await store_history(sessions, sid, said)
    return sid


async def sent_prompt(client: ParleyClient, sessions: Database, sid: str) -> str:
    """The prompts a turn sent its provider (as `call_model` reads them back), as JSON."""
    turn_id, events = await client.turn(sid, "Where is order 8472?")
    assert events[-1].type == "done"
    calls = [c for c in await model_calls(sessions, turn_id) if c.provider != "resolver"]
    assert calls
    return json.dumps([c.request["messages"] for c in calls])


async def test_a_tenant_that_asks_sends_no_card_number_or_address_to_the_model(
    admin: ParleyClient, priya: ParleyClient, sessions: Database
) -> None:
    await configure(admin, {"redact_model_input": True})
    sid = await seeded(sessions, priya)
    prompt = await sent_prompt(priya, sessions, sid)
    assert "Thanks, noted" in prompt  # the earlier exchange was in the window
    assert CARD not in prompt and CARD.replace(" ", "") not in prompt
    assert ADDRESS not in prompt
    assert "[card]" in prompt and "[email]" in prompt
    # Only what leaves is masked: the stored message keeps the user's words.
    assert CARD in (await priya.messages(sid))[0]["text"]

    await configure(admin, {})
    unchanged = await sent_prompt(priya, sessions, await seeded(sessions, priya))
    assert CARD in unchanged and ADDRESS in unchanged


class Recording:
    """A summarizer that records what it is sent and answers with no lines."""

    name = "recording"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        yield TextDelta(json.dumps({"lines": [], "facts": []}))
        yield Finish("stop", {"input_tokens": 10, "output_tokens": 5})


async def summarizer_was_sent(settings: Settings, sessions: Database, sid: str) -> str:
    tight = settings.model_copy(
        update={
            "context_conversation_tokens": 300,
            "summary_min_new_tokens": 1,
            "model_provider": "recording",
            "model": "recording-model",
        }
    )
    model = Recording()
    memory = MemoryActivities(
        sessions=sessions, providers=ProviderPool(tight, primary=model), settings=tight
    )
    await memory.summarize(SummarizeInput(sid, "trn_redaction"))
    assert model.requests, "the summarizer was asked"
    return json.dumps([r.messages for r in model.requests])


async def test_the_summarizer_is_sent_masked_text_too(
    admin: ParleyClient,
    priya: ParleyClient,
    sessions: Database,
    settings: Settings,
) -> None:
    await configure(admin, {"redact_model_input": True})
    sid = await seeded(sessions, priya, exchanges=6)
    sent = await summarizer_was_sent(settings, sessions, sid)
    assert "[card]" in sent and CARD not in sent and ADDRESS not in sent
