"""`parley eval` against a test stack: a target that mints its users' and operators' tokens
in the stack's database, as the CLI does against `make run`."""

from __future__ import annotations

from pathlib import Path

from parley.eval.runner import Target
from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.stack import SteppedClock

STARTER = Path(__file__).resolve().parents[2] / "evals" / "starter"


def eval_target(
    api_url: str,
    sessions: Database,
    backend_url: str | None,
    *,
    breaker_clock: SteppedClock | None = None,
    cooldown_s: float = 0.0,
    admin: str = "ops_admin",
) -> Target:
    """`breaker_clock`: the worker's breaker clock, moved past its cooldown after a
    conversation that switched a backend fault on (instead of waiting it out)."""

    async def token_for(tenant: str, user: str) -> str:
        async with sessions() as db:
            token = await create_token(db, tenant_id=tenant, user_id=user)
            await db.commit()
            return token

    async def admin_token_for(tenant: str) -> str | None:
        try:
            return await token_for(tenant, admin)
        except LookupError:
            return None

    async def after_faults() -> None:
        if breaker_clock is not None:
            breaker_clock.advance(cooldown_s + 1)

    return Target(api_url, token_for, admin_token_for, backend_url, after_faults)
