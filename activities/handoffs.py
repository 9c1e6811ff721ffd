"""The hand-off workflow's steps (workflows/handoff.py) and the start of a case's run.

`write_case_summary` asks the tenant's model for the case summary and checks the answer
(parley/handoffs.py): a provider that fails, is slow, or answers something other than the
JSON asked for (or loses the order in play) gives way to the summary written by code, so the
person always gets one naming the order and the reason. The other steps only ask the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client

from parley.activities.metrics import HANDOFFS_OPENED
from parley.activities.webhooks import WebhookSender
from parley.business_hours import local_text
from parley.config import Settings
from parley.dispatch.handoffs import start_case_run
from parley.egress import Resolver
from parley.gateway.base import ModelRequest, TextDelta
from parley.gateway.registry import ProviderPool
from parley.gateway.resolver import system_resolver
from parley.handoff_rules import HandoffRules, OpenedBy, policy_reason
from parley.handoffs import (
    AWAY_TEXT,
    AwayNotice,
    CaseFacts,
    HandoffInput,
    HandoffOutcome,
    code_summary,
    parse_summary,
    summary_request,
)
from parley.ids import handoff_id_for_policy
from parley.redaction import redact_messages
from parley.store import handoff_openers as openers
from parley.store import handoffs as store
from parley.store import sessions as session_store
from parley.store import webhooks as hooks
from parley.store.db import Database, Db, connect
from parley.tenancy import TenantConfig
from parley.webhooks import WebhookInput, delivery_id

log = logging.getLogger(__name__)

# The model's time to write a summary before code writes it instead.
SUMMARY_TIMEOUT_S = 30.0


def _payload(case: store.HandoffRow, event: str) -> dict[str, Any]:
    """What the team's tools are told: the case, its reason and summary (the customer's
    words, which an erasure of theirs removes from the delivery log too)."""
    return {
        "event": event,
        "handoff_id": case.id,
        "tenant_id": case.tenant_id,
        "session_id": case.session_id,
        "status": case.status,
        "reason": case.reason,
        "summary": case.summary,
        "agent_name": case.agent_name,
        "created_at": case.created_at.isoformat(),
    }


class HandoffActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        providers: ProviderPool,
        settings: Settings,
        client: Client | None = None,  # the worker's: starts a case's run (`start_case`)
        summary_timeout_s: float = SUMMARY_TIMEOUT_S,
        resolve: Resolver = system_resolver,  # a webhook's host, as the egress rules ask
    ) -> None:
        self._resolve = resolve
        self._summary_timeout_s = summary_timeout_s
        self._sessions = sessions
        self._providers = providers
        self._settings = settings
        self._client = client
        self._sender = WebhookSender(
            sessions=sessions, allowlist=settings.mcp_allowlist, resolve=resolve
        )

    def steps(self) -> list[Callable[..., Any]]:
        """The workflow's steps, as the worker registers them."""
        return [
            self.write_case_summary,
            self.tell_unclaimed,
            self.tell_away,
            self.case_status,
            self.deliver_webhook,
        ]

    async def start_case(self, case: store.HandoffRow) -> None:
        """Start the committed case's run, with its tenant's claim timeout."""
        if self._client is None:
            log.warning("no Temporal client: hand-off %s has no workflow", case.id)
            return
        await start_case_run(
            self._client,
            self._sessions,
            case,
            task_queue=self._settings.task_queue,
            default_timeout_s=self._settings.handoff_claim_timeout_s,
        )

    async def open_by_policy(self, *, session_id: str, turn_id: str) -> str | None:
        """As a turn ends: open a case when the tenant's policy says the assistant keeps
        failing the customer (parley/handoff_rules.py), and start its run. Only a session at
        rest (no turn active or queued) and held by no case; once per turn however often the
        ending runs. The case's id, if one opened or was open from this turn."""
        # One unlocked read is what every turn's end pays, in autocommit: one round trip,
        # with no `BEGIN` before it nor `ROLLBACK` after (psycopg's rollback also drops the
        # connection's prepared statements). A case to open locks the session's row in a
        # unit of work and looks again.
        async with connect(self._sessions) as conn:
            if await self._policy_reason(conn, session_id) is None:
                return None
        async with self._sessions() as db:
            if not await openers.lock_session_row(db, session_id=session_id):
                return None
            found = await self._policy_reason(db, session_id)
            if found is None:
                return None
            reason, rules = found
            opened = await openers.open_by_code(
                db,
                handoff_id=handoff_id_for_policy(turn_id=turn_id),
                session_id=session_id,
                turn_id=turn_id,
                by=OpenedBy.policy,
                reason=reason,
                priority=rules.priority(OpenedBy.policy, reason),
            )
            await db.commit()
        if opened is None:
            return None
        if opened.new:
            HANDOFFS_OPENED.labels(OpenedBy.policy.value).inc()
        await self.start_case(opened.case)
        return opened.case.id

    @staticmethod
    async def _policy_reason(db: Db, session_id: str) -> tuple[str, HandoffRules] | None:
        """Why the tenant's policy hands this session to a person now, with its rules; None
        while a turn is active or queued, or when nothing calls for it."""
        seen = await openers.policy_seen(db, session_id=session_id)
        if seen is None or seen.busy:
            return None
        rules = TenantConfig.model_validate(seen.tenant_config).handoffs()
        reason = policy_reason(rules, outages=seen.outages, retractions=seen.retractions)
        return None if reason is None else (reason, rules)

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
        The case's status after it, and whether the customer was told now."""
        async with self._sessions() as db:
            told = await store.tell_unclaimed(db, handoff_id=inp.handoff_id)
            await db.commit()
        status = await self.case_status(inp)
        return HandoffOutcome(status.status, told)

    @activity.defn
    async def tell_away(self, notice: AwayNotice) -> bool:
        """The case opened outside the team's hours: tell the customer when a person is
        back (once, while it still waits). Whether they were told now."""
        back = local_text(notice.week, datetime.fromisoformat(notice.back_at))
        async with self._sessions() as db:
            told = await store.tell_away(
                db, handoff_id=notice.handoff_id, text=AWAY_TEXT.format(back=back)
            )
            await db.commit()
        return told

    @activity.defn
    async def deliver_webhook(self, inp: WebhookInput) -> str:
        """Tell the tenant's webhook of the case's event: the same signed body under the same
        idempotency key on every attempt; a receiver's refusal is retried by Temporal, an
        address the egress rules refuse is not. The delivery's status."""
        async with self._sessions() as db:
            planned = await self._plan_delivery(db, inp)
            await db.commit()
        return await self._sender.deliver(planned)

    async def _plan_delivery(
        self, db: Db, inp: WebhookInput
    ) -> tuple[hooks.DeliveryRow, str] | None:
        case = await store.get_case(db, handoff_id=inp.handoff_id)
        assert case is not None, f"hand-off {inp.handoff_id} is missing"
        session = await session_store.with_tenant(db, session_id=case.session_id)
        assert session is not None
        hook = TenantConfig.model_validate(session.tenant_config).handoff_webhook
        if hook is None:
            return None
        secret = await hooks.tenant_secret(db, tenant_id=case.tenant_id)
        assert secret is not None
        delivery = await hooks.record(
            db,
            delivery_id=delivery_id(handoff_id=case.id, event=inp.event),
            tenant_id=case.tenant_id,
            session_id=case.session_id,
            handoff_id=case.id,
            event=inp.event,
            url=hook.url,
            payload=_payload(case, inp.event),
        )
        return delivery, secret

    @activity.defn
    async def case_status(self, inp: HandoffInput) -> HandoffOutcome:
        """The case's status as the store holds it."""
        async with self._sessions() as db:
            case = await store.get_case(db, handoff_id=inp.handoff_id)
        return HandoffOutcome(case.status if case is not None else "resolved")
