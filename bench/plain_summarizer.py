"""Section (c)'s row with a summarizer that fails: the 50-turn scripted conversation through
the real stack, its gateway speaking OpenAI's wire format to a local server
(`gateway.fake_provider --brain --summarizer plain`) that answers turns as the demo model
does and every summary request with prose instead of the JSON asked for.

Each summary run then asks once, repairs once, and writes the code summary
(`written_by: fallback`); the input tokens of both requests are on the version written, and so
in the row's input. The row waits for the session's last summary run to finish before it
counts, and sets beside the stored figure what the server itself was asked (its recorded
requests, counted by the same counter), so a summarizer request that wrote no version cannot
go uncounted unseen.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from bench.memory import token_table
from bench.stack import ProviderStack, Stack, provider_stack
from parley.gateway.fake_provider.server import prompt_tokens
from parley.gateway.fake_provider.wire import request_from_openai
from parley.ids import summary_workflow_id, workflow_id_for_turn
from parley.memory import is_summary_request
from parley.store.db import Database
from tests.support.client import ParleyClient

# A bound, not a figure: on a loaded machine (2 cores, load 10) the summary run of (n)'s 271
# turns, embedding every message, took more than 300 s to close.
SETTLE_TIMEOUT_S = 900.0


async def settled(temporal: Client, session_id: str, turn_ids: list[str]) -> None:
    """Every turn's workflow closed, then the session's summary run (one per session at a
    time) closed too, whether it folded, failed or never started."""
    for turn_id in turn_ids:
        await temporal.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
    handle = temporal.get_workflow_handle(summary_workflow_id(session_id=session_id))
    try:
        await asyncio.wait_for(handle.result(), SETTLE_TIMEOUT_S)
    except RPCError:
        pass  # never started: nothing was due
    except WorkflowFailureError:
        pass  # it ran and failed: what it wrote before is counted


async def asked_for_summaries(provider_url: str) -> dict[str, int]:
    """What the local server was asked for summaries since its last reset: requests and their
    prompt tokens (messages and the response format's schema, as `prompt_tokens` bills)."""
    async with httpx.AsyncClient(timeout=60) as http:
        recorded = (await http.get(provider_url + "/_fake/requests")).json()
    asked = [request_from_openai(r["body"]) for r in recorded]
    summary = [
        (request, r["body"])
        for request, r in zip(asked, recorded, strict=True)
        if is_summary_request(request.messages)
    ]
    return {
        "requests": len(summary),
        "input_tokens": sum(prompt_tokens(request, body) for request, body in summary),
    }


async def reset(provider: ProviderStack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        (await http.post(provider.provider_url + "/_fake/reset")).raise_for_status()


async def failing_summarizer_row(
    stack: Stack, db_sessions: Database, turns: int = 50
) -> dict[str, Any]:
    """The token table's row for `turns` scripted turns with the summarizer failing."""
    temporal = await Client.connect(stack.settings.temporal_address)
    async with provider_stack(stack, summarizer="plain") as provider:
        await reset(provider)
        client = ParleyClient(provider.parley_url, stack.token)
        try:
            row = await token_table(
                client,
                db_sessions,
                turns,
                settle=lambda sid, turn_ids: settled(temporal, sid, turn_ids),
            )
        finally:
            await client.aclose()
        asked = await asked_for_summaries(provider.provider_url)
    return {
        **row,
        "summarizer": "plain text (fails)",
        "model": provider.model,
        "provider_summary_requests": asked["requests"],
        "provider_summarizer_input_tokens": asked["input_tokens"],
    }
