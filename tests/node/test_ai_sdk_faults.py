"""A model provider that misbehaves (answers in the wrong format, or says nothing) during an
AI SDK chat: the `ai` package's own client sees the answer end with the protocol's error part,
not a stream left hanging (tests/node/faults.test.mjs). The stack's model is the real
OpenAI-compatible adapter against the fake provider, scripted by the script."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.store.db import Database
from parley.workflows.options import MODEL
from tests.support.ai_client import ChatTarget, passed, run_chat_client
from tests.support.stack import serve
from tests.support.toolkit import own_stack

# Short, so that a silent provider's five attempts take seconds.
TIMEOUTS = Timeouts(connect_s=1.0, first_token_s=0.5, total_s=10.0)


@pytest_asyncio.fixture(scope="module")
async def faulty(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[tuple[str, str]]:
    """The stack's URL and the fake provider's."""
    fake = FakeProvider()
    async with serve(fake.app) as fake_url:
        provider = OpenAICompatProvider(
            base_url=f"{fake_url}/v1", api_key="test-key", timeouts=TIMEOUTS
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix="aisdkfault",
            model_provider="openai",
            model="openai-test-model",
            fallback_model_provider="",  # no fallback model: the provider's failure shows
            summary_min_new_tokens=1_000_000,  # no rolling summary to take a scripted reply
        ) as stack:
            yield stack.url, fake_url
        await provider.aclose()


async def test_a_misbehaving_provider_ends_the_chat_stream_with_an_error(
    faulty: tuple[str, str], node_folder: Path, tokens: dict[str, str]
) -> None:
    url, fake_url = faulty
    target = ChatTarget(
        url,
        tokens["priya"],
        extra={"FAKE_URL": fake_url, "MODEL_ATTEMPTS": str(MODEL.retry.maximum_attempts)},
    )
    report = await run_chat_client(node_folder, target, script="faults.test.mjs")
    assert passed(report) == 2, report
