"""(g) Answer paths by turn shape (parley/paths.py): time to the first `delta` of a no-tool
question on the fast path, beside the same question with the tenant's tools offered, and a
tool turn (one lookup, then the answer). Interleaved turn by turn in one run, so the rows see
the same machine; the tenant's config is switched between turns (it is read per turn).

The fast path's saving is real work not done: no tool schemas in the prompt, no listing of
the tenant's MCP tools before the model step, low reasoning effort asked of the provider
(the demo model has no reasoning to shorten, so that part shows only with a real provider).
"""

from __future__ import annotations

from typing import Any

from bench.runner import ParleyTarget, Phase, run_turn, tool_text
from parley.store import tenants
from parley.store.db import Database
from parley.tenancy import TenantConfig

TENANT = "northwind"
QUESTION = "What is your policy on damaged items? (benchmark turn {i})"
ROWS = ("fast path (no tools)", "same question, tools offered", "tool turn (one lookup)")


async def _configure(db_sessions: Database, config: TenantConfig) -> None:
    async with db_sessions() as db:
        await tenants.set_config(db, tenant_id=TENANT, config=config)
        await db.commit()


async def measure_paths(
    parley: ParleyTarget, db_sessions: Database, *, turns: int
) -> dict[str, Any]:
    async with db_sessions() as db:
        tenant = await tenants.get_tenant(db, tenant_id=TENANT)
        offered = TenantConfig.model_validate(tenant.config or {})
    # No local tool allowed, no MCP server, no skill, no specialist: nothing to offer.
    bare = offered.model_copy(
        update={"tool_allowlist": [], "mcp_servers": None, "skills": None, "specialists": None}
    )
    phases = {row: Phase() for row in ROWS}
    conversations = {row: await parley.new_conversation() for row in ROWS}
    try:
        for i in range(turns):
            for row in ROWS:
                fast = row == ROWS[0]
                await _configure(db_sessions, bare if fast else offered)
                text = tool_text(i) if row == ROWS[2] else QUESTION.format(i=i)
                phases[row].turns.append(await run_turn(parley, conversations[row], text))
    finally:
        await _configure(db_sessions, offered)
    return {row: phase.report() for row, phase in phases.items()}


def render_paths(results: dict[str, Any]) -> str:
    lines = ["", "(g) Answer paths by turn shape: POST -> first `delta` (ms), interleaved"]
    lines.append(f"  {'':<32}{'p50':>9}{'p95':>9}{'full p50':>10}{'ok':>5}")
    fast = results[ROWS[0]]["first_delta"]["p50_ms"]
    for row in ROWS:
        r = results[row]
        lines.append(
            f"  {row:<32}{r['first_delta']['p50_ms']:>9.1f}{r['first_delta']['p95_ms']:>9.1f}"
            f"{r['full_turn']['p50_ms']:>10.1f}{r['ok']:>5}"
            + ("" if row == ROWS[0] else f"   {r['first_delta']['p50_ms'] / fast:.2f}x fast")
        )
    return "\n".join(lines)
