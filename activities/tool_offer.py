"""The tools a turn's request offers: the tenant's tools, then the rules of
parley/tool_offer.py applied to what the store knows about the turn."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ScalarSelect, distinct, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from activities.mcp import McpTools
from activities.skills import SkillTools
from parley.tenancy import TenantConfig
from parley.tool_offer import Offer, TurnShape, offer
from parley.tools import model_tools
from store import result_sets
from store.models import Message, ToolCall, Turn


async def offered_tools(
    db: AsyncSession,
    turn: Turn,
    tenant: TenantConfig,
    *,
    mcp: McpTools,
    skills: SkillTools,
    recent_turns: int,
) -> Offer:
    """Local tools, the allowed tools of the tenant's MCP servers, `run_skill` when the tenant
    enables skills; less those this turn's shape cannot use."""
    tools = tenant_tools(tenant) + await mcp.offered(db, turn, tenant) + skills.offered(tenant)
    message = await db.get(Message, turn.user_message_id)
    # Both facts about the session in one round trip.
    has_result_sets, recently_used = (
        await db.execute(
            select(
                result_sets.result_sets_exist(session_id=turn.session_id),
                _recently_used(turn, recent_turns),
            )
        )
    ).one()
    shape = TurnShape(
        message=message.text if message is not None else "",
        result_set_in_play="result_set" in (turn.resolution or {}),
        has_result_sets=bool(has_result_sets),
        recently_used=frozenset(recently_used or ()),
        skills=tuple(skills.manifests(tenant)),
    )
    return offer(tools, shape)


def tenant_tools(tenant: TenantConfig) -> list[dict[str, Any]]:
    """The local tool schemas this tenant lets the model see."""
    return [t for t in model_tools() if tenant.offered(t["name"])]


def _recently_used(turn: Turn, recent_turns: int) -> ScalarSelect[Any]:
    """The tools called in this turn and the session's `recent_turns` turns before it (an
    array of names, NULL when none)."""
    recent = (
        select(Turn.id)
        .where(Turn.session_id == turn.session_id, Turn.user_seq <= turn.user_seq)
        .order_by(Turn.user_seq.desc())
        .limit(recent_turns + 1)
    )
    return (
        select(func.array_agg(distinct(ToolCall.name)))
        .where(ToolCall.turn_id.in_(recent.scalar_subquery()))
        .scalar_subquery()
    )
