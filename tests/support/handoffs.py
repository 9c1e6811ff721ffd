"""A hand-off opened for a test: a tenant of its own whose webhook is a test's receiver, and a
case in a session of its user's, opened as the model's `handoff_to_human` opens one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from parley.handoffs import HandoffInput
from parley.store import handoffs, tenants
from parley.store.db import Database
from parley.store.identity import Identity
from parley.tenancy import TenantConfig
from parley.webhooks import HandoffWebhookConfig
from tests.support.tenants import AdminTenant, new_admin_tenant
from tests.support.toolkit import post_unstarted


@dataclass
class Case:
    tenant: AdminTenant
    owner: Identity
    inp: HandoffInput


async def new_case(sessions: Database, webhook_url: str, *, claim_timeout_s: float) -> Case:
    """A tenant of the test's own whose webhook is `webhook_url` (stored as the API would,
    past its egress check), and a case opened in a session of its user's."""
    tenant = await new_admin_tenant(sessions, prefix="hook")
    owner = Identity(tenant.tenant_id, tenant.admin_id, ())
    config = TenantConfig(handoff_webhook=HandoffWebhookConfig(url=webhook_url))
    async with sessions() as db:
        await tenants.set_config(db, tenant_id=tenant.tenant_id, config=config)
        await db.commit()
        posted = await post_unstarted(db, owner=owner, text="Could a representative help me?")
    assert posted.turn is not None
    async with sessions() as db:
        case, _ = await handoffs.open_handoff(
            db,
            handoff_id=f"hof_{uuid.uuid4().hex[:12]}",
            session_id=posted.turn.session_id,
            turn_id=posted.turn.id,
            reason="I want to talk to a person",
        )
        await db.commit()
    inp = HandoffInput(case.id, case.session_id, tenant.tenant_id, claim_timeout_s)
    return Case(tenant, owner, inp)
