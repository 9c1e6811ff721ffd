"""(t) The first delta of a plain turn in a session long enough for recall to run, recall by
meaning on and off, beside the bare stream (issue 39, acceptance 5).

Section (a) starts a fresh session every few turns, so its window holds the whole
conversation and recall never runs. Here each system gets one session that already holds
`messages` imported messages (bench/locomo_import.py `synthetic_items`, through
`POST .../import`, followed to `done` and its summary run settled): every turn's build then
searches the older messages, and with embeddings on it embeds the question beside the
build's reads. "on" is the stack itself (its default, local embeddings); "off" is a worker
and an API of its own on the same database and Temporal with `PARLEY_EMBEDDINGS=""`
(bench/stack.py `side_stack`), its session imported through its own API (so its import
embeds nothing and recall is full-text alone). Plain turns go to the baseline, "on" and
"off" interleaved turn by turn (bench/runner.py `sequential`), after a few untimed ones.

What acceptance 5 reads: on's first-delta p50 over the baseline's, beside off's; the
embedding sits off the critical path when on's ratio is within 10% of off's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
from sqlalchemy import select
from temporalio.client import Client

from bench.locomo_import import TENANT, fresh_user, imported_session, synthetic_items
from bench.runner import ParleyTarget, Target, sequential, timed
from bench.stack import Stack, log, side_stack
from bench.throughput import fmt, ratio
from parley.store.db import Database
from parley.store.models import ModelCall, Turn
from tests.support.client import ParleyClient
from tests.support.orm import orm

MESSAGES = 600
TURNS = 20
WARM_TURNS = 3


class LongSession(ParleyTarget):
    """Parley, every turn in one session that holds `messages` imported messages."""

    def __init__(self, name: str, http: httpx.AsyncClient, session_id: str) -> None:
        super().__init__(http)
        self.name, self.session_id = name, session_id

    async def new_conversation(self) -> str:
        return self.session_id


async def long_session(
    parley_url: str, token: str, temporal: Client, *, messages: int, limit: int
) -> str:
    """A new session of the token's user holding `messages` imported messages, indexed and
    its summary settled."""
    client = ParleyClient(parley_url, token)
    try:
        sid, _, _ = await imported_session(client, temporal, synthetic_items(messages), limit)
    finally:
        await client.aclose()
    return sid


async def measure_recall_latency(
    stack: Stack,
    db_sessions: Database,
    baseline: Target,
    *,
    messages: int = MESSAGES,
    turns: int = TURNS,
) -> dict[str, Any]:
    temporal = await Client.connect(stack.settings.temporal_address)
    token = await fresh_user(db_sessions, TENANT)
    limit = stack.settings.max_import_messages
    off_env = {"PARLEY_EMBEDDINGS": ""}
    async with side_stack(stack, "no-embeddings", off_env, {"embeddings": ""}) as off:
        log(f"(t) importing {messages} messages into a session of each system")
        sessions = {
            "on": await long_session(
                stack.parley_url, token, temporal, messages=messages, limit=limit
            ),
            "off": await long_session(
                off.parley_url, token, temporal, messages=messages, limit=limit
            ),
        }
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx.AsyncClient(base_url=stack.parley_url, headers=headers, timeout=60) as on_http,
            httpx.AsyncClient(base_url=off.parley_url, headers=headers, timeout=60) as off_http,
        ):
            targets = [
                baseline,
                LongSession("on", on_http, sessions["on"]),
                LongSession("off", off_http, sessions["off"]),
            ]
            await timed(
                "(t) warm-up", sequential(targets, WARM_TURNS, WARM_TURNS, stack.check), log
            )
            log(f"(t) {turns} plain turns per system, interleaved")
            phases = await timed(
                "(t) sequential", sequential(targets, turns, turns, stack.check), log
            )
    figures = {name: phase.report() for name, phase in phases.items()}
    searched = {name: await recall_methods(db_sessions, sid) for name, sid in sessions.items()}

    def over(name: str, other: str) -> float:
        return ratio(
            figures[name]["first_delta"]["p50_ms"], figures[other]["first_delta"]["p50_ms"]
        )

    return {
        **figures,
        "messages": messages,
        "embeddings": stack.settings.embeddings or "off",
        # How each system's builds recalled, as their stored requests say ("fts": by words,
        # "hybrid": with the question embedded; the untimed turns among them).
        "recall": searched,
        "first_delta_p50_ratio": {
            "on_over_baseline": over("on", "baseline"),
            "off_over_baseline": over("off", "baseline"),
            "on_over_off": over("on", "off"),
        },
    }


async def recall_methods(db_sessions: Database, session_id: str) -> dict[str, int]:
    """How the session's model requests were recalled, counted by method."""
    async with orm(db_sessions) as db:
        methods = await db.scalars(
            select(ModelCall.request["budget"]["recall"].astext)
            .join(Turn, Turn.id == ModelCall.turn_id)
            .where(Turn.session_id == session_id)
        )
        return dict(Counter(str(m) for m in methods))


def render_recall_latency(r: dict[str, Any]) -> str:
    lines = [
        "",
        f"(t) First `delta` of a plain turn in a session of {r['messages']} imported messages "
        f"(recall runs every turn), embeddings {r['embeddings']} / off (ms)",
        f"{'':<22}{'turns ok':>9}{'first-delta p50':>17}{'p95':>9}{'full-turn p50':>15}",
    ]
    for name, label in (
        ("baseline", "baseline"),
        ("on", "parley, embeddings on"),
        ("off", "parley, embeddings off"),
    ):
        f = r[name]
        lines.append(
            f"{label:<22}{f['ok']:>4}/{f['turns']:<4}{fmt(f['first_delta']['p50_ms']):>17}"
            f"{fmt(f['first_delta']['p95_ms']):>9}{fmt(f['full_turn']['p50_ms']):>15}"
        )
    ra = r["first_delta_p50_ratio"]
    lines.append(
        f"  first-delta p50 over the baseline's: on {fmt(ra['on_over_baseline'], 2)}x, off "
        f"{fmt(ra['off_over_baseline'], 2)}x; on over off {fmt(ra['on_over_off'], 2)}x "
        "(acceptance 5: the query's embedding off the critical path, on within 10% of off)"
    )
    for name in ("on", "off"):
        counts = r.get("recall", {}).get(name, {})
        shown = ", ".join(f"{method} {n}" for method, n in sorted(counts.items()))
        lines.append(f"  {name}: the builds recalled by {shown or 'nothing recorded'}")
    for name in ("baseline", "on", "off"):
        for error in r[name].get("first_errors", []):
            lines.append(f"(t) {name} failure: {error}")
    return "\n".join(lines)
