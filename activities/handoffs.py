"""The hand-off workflow's steps (workflows/handoff.py) and the start of a case's run.

`write_case_summary` asks the tenant's model for the case summary and checks the answer
(parley/handoffs.py): a provider that fails, is slow, or answers something other than the
JSON asked for (or loses the order in play) gives way to the summary written by code, so the
person always gets one naming the order and the reason. The other steps only ask the store.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio import activity
from temporalio.client import Client

from parley.config import Settings
from parley.dispatch.handoffs import start_handoff
from parley.gateway.base import ModelRequest, TextDelta
from parley.gateway.registry import ProviderPool
from parley.handoffs import (
    CaseFacts,
    HandoffInput,
    HandoffOutcome,
    code_summary,
    parse_summary,
    summary_request,
)
from parley.redaction import redact_messages
from parley.store import handoffs as store
from parley.store import sessions as session_store
from parley.store.db import Database
from parley.tenancy import TenantConfig

log = logging.getLogger(__name__)

# The model's time to write a summary before code writes it instead.
SUMMARY_TIMEOUT_S = 30.0


class HandoffActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        providers: ProviderPool,
        settings: Settings,
        client: Client | None = None,  # the worker's: starts a case's run (`start_case`)
        summary_timeout_s: float = SUMMARY_TIMEOUT_S,
    ) -> None:
        self._summary_timeout_s = summary_timeout_s
        self._sessions = sessions
        self._providers = providers
        self._settings = settings
        self._client = client

    async def start_case(self, case: store.HandoffRow) -> None:
        """Start the committed case's run, with its tenant's claim timeout."""
        if self._client is None:
            log.warning("no Temporal client: hand-off %s has no workflow", case.id)
            return
        async with self._sessions() as db:
            session = await session_store.with_tenant(db, session_id=case.session_id)
        assert session is not None
        tenant = TenantConfig.model_validate(session.tenant_config)
        timeout_s = tenant.handoff_claim_timeout_s or self._settings.handoff_claim_timeout_s
        inp = HandoffInput(case.id, case.session_id, case.tenant_id, float(timeout_s))
        await start_handoff(self._client, inp, task_queue=self._settings.task_queue)

    @activity.defn
    async def write_case_summary(self, inp: HandoffInput) -> str:
        """The case summary, the model's if it is usable, else code's; who wrote it."""
        async with self._sessions() as db:
            case = await store.get_case(db, handoff_id=inp.handoff_id)
            assert case is not None, f"hand-off {inp.handoff_id} is missing"
            if case.summary is not None:
                return case.summary_by or "code"  # written by an earlier attempt
            facts = await store.case_facts(db, case=case)
            session = await session_store.with_tenant(db, session_id=case.session_id)
        assert session is not None
        tenant = TenantConfig.model_validate(session.tenant_config)
        summary, by = await self._write(facts, tenant)
        async with self._sessions() as db:
            await store.save_summary(db, handoff_id=inp.handoff_id, summary=summary, by=by)
            await db.commit()
        return by

    async def _write(self, facts: CaseFacts, tenant: TenantConfig) -> tuple[str, str]:
        messages = summary_request(facts)
        request = ModelRequest(
            model=tenant.model or self._settings.model,
            messages=redact_messages(messages) if tenant.redact_model_input else messages,
            max_output_tokens=600,
        )
        provider = self._providers.get(tenant.model_provider or self._settings.model_provider)
        try:
            async with asyncio.timeout(self._summary_timeout_s):
                parts = [e.text async for e in provider.stream(request) if isinstance(e, TextDelta)]
            return parse_summary("".join(parts), facts), "model"
        except Exception as exc:  # a failed, slow or unusable answer: code writes it
            log.info("the case summary is written by code (%s)", exc)
            return code_summary(facts), "code"

    @activity.defn
    async def tell_unclaimed(self, inp: HandoffInput) -> HandoffOutcome:
        """Nobody claimed the case in time: tell the customer (once, while it still waits).
        The case's status after it."""
        async with self._sessions() as db:
            await store.tell_unclaimed(db, handoff_id=inp.handoff_id)
            await db.commit()
        return await self.case_status(inp)

    @activity.defn
    async def case_status(self, inp: HandoffInput) -> HandoffOutcome:
        """The case's status as the store holds it."""
        async with self._sessions() as db:
            case = await store.get_case(db, handoff_id=inp.handoff_id)
        return HandoffOutcome(case.status if case is not None else "resolved")
