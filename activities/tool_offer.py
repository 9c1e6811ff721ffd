"""The tools a turn's request offers: the tenant's tools, then the rules of
parley/tool_offer.py applied to what the store knows about the turn."""

from __future__ import annotations

from typing import Any

from parley.activities.mcp import McpTools
from parley.activities.skills import SkillTools
from parley.store import result_sets
from parley.store.db import Db
from parley.store.turns.reads import TurnFacts
from parley.tenancy import TenantConfig
from parley.tool_offer import Offer, TurnShape, offer
from parley.tools import model_tools


async def offered_tools(
    db: Db,
    turn: TurnFacts,
    tenant: TenantConfig,
    *,
    message: str,
    mcp: McpTools,
    skills: SkillTools,
    recent_turns: int,
    facts: tuple[bool, frozenset[str]] | None = None,
) -> Offer:
    """Local tools, the allowed tools of the tenant's MCP servers, `run_skill` when the tenant
    enables skills; less those this turn's shape cannot use. `message`: the text the turn
    answers; `facts`: the session's facts (`result_sets.offer_facts`) when the caller read
    them already."""
    tools = tenant_tools(tenant) + await mcp.offered(db, turn, tenant) + skills.offered(tenant)
    has_result_sets, recently_used = facts or await result_sets.offer_facts(
        db, session_id=turn.session_id, user_seq=turn.user_seq, recent_turns=recent_turns
    )
    shape = TurnShape(
        message=message,
        result_set_in_play="result_set" in (turn.resolution or {}),
        has_result_sets=has_result_sets,
        recently_used=recently_used,
        skills=tuple(skills.manifests(tenant)),
    )
    return offer(tools, shape)


def tenant_tools(tenant: TenantConfig) -> list[dict[str, Any]]:
    """The local tool schemas this tenant lets the model see."""
    return [t for t in model_tools() if tenant.offered(t["name"])]
