"""Which tools a turn's request offers (parley/tool_offer.py): a tool with a precondition is
withheld, with its reason, while the turn's shape cannot use it; a tool used lately stays."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from sqlalchemy import select

from parley.activities.skills import load_catalog
from parley.config import REPO_ROOT
from parley.result_sets import mentions_scope
from parley.skills import RUN_SKILL, SkillManifest, run_skill_schema
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import ModelCall
from parley.tenancy import TenantConfig
from parley.tool_offer import (
    NO_RESULT_SET,
    NO_SEARCH,
    NO_SKILL_ASKED,
    PROPOSE_ORDERS_CSV,
    SEARCH_ORDERS,
    TurnShape,
    offer,
    skill_asked,
)
from parley.tools import model_tools
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import reply

CHART = load_catalog(Path(REPO_ROOT) / "skills")["spending_chart"][1]
PLAIN = "Okay, thanks. What's happening with the refund on that order?"


def _tools(skills: tuple[SkillManifest, ...] = ()) -> list[dict]:
    tenant = TenantConfig()
    local = [t for t in model_tools() if tenant.offered(t["name"])]
    return local + ([run_skill_schema(list(skills))] if skills else [])


def _names(shape: TurnShape) -> list[str]:
    return [t["name"] for t in offer(_tools(shape.skills), shape).tools]


def test_a_plain_support_message_is_offered_neither_search_nor_export_nor_skills() -> None:
    shape = TurnShape(message=PLAIN, skills=(CHART,))
    made = offer(_tools(shape.skills), shape)
    assert made.withheld == {
        SEARCH_ORDERS: NO_SEARCH,
        PROPOSE_ORDERS_CSV: NO_RESULT_SET,
        RUN_SKILL: NO_SKILL_ASKED,
    }
    # The order reads, the email proposal and the hand-over are always there, in order.
    offered = [t["name"] for t in made.tools]
    assert offered == [t["name"] for t in _tools() if t["name"] not in made.withheld]
    assert {"get_order", "get_refund", "propose_email", "handoff_to_human"} <= set(offered)


def test_a_search_shaped_message_is_offered_the_search_but_not_the_export() -> None:
    for message in (
        "Show me everything I ordered last week.",
        "Which of my orders were over $200?",
        "What did I buy in October?",
        "List all my shipped orders.",
    ):
        names = _names(TurnShape(message=message))
        assert SEARCH_ORDERS in names, message
        assert PROPOSE_ORDERS_CSV not in names, message


def test_a_result_set_brings_the_search_and_the_export() -> None:
    narrowing = TurnShape(message="just the ones over $500", result_set_in_play=True)
    assert SEARCH_ORDERS in _names(narrowing)
    held = TurnShape(message="email me those as a spreadsheet", has_result_sets=True)
    assert PROPOSE_ORDERS_CSV in _names(held)


def test_a_message_about_one_order_or_in_passing_is_not_a_search() -> None:
    assert not mentions_scope("What's the latest on order 8472? Has it shipped yet?")
    assert not mentions_scope("I sent photos of the mug to your team last week.")
    assert not mentions_scope("It may arrive late, you said.")
    assert mentions_scope("Make me a chart of my October spending by week.")


def test_run_skill_is_offered_when_the_message_asks_for_what_a_skill_does() -> None:
    assert skill_asked(CHART, "Make me a chart of my October spending by week.")
    assert skill_asked(CHART, "Could you plot my spending in May?")
    assert skill_asked(CHART, "Run the spending_chart skill.")
    assert not skill_asked(CHART, PLAIN)
    # A skill whose manifest lists no words is offered on every turn.
    assert skill_asked(SkillManifest(name="peek", description="peek"), PLAIN)
    chart_turn = TurnShape(message="Make me a chart of my October spending", skills=(CHART,))
    names = _names(chart_turn)
    # Without a sandbox the chart's answer falls back to the plain search of that month.
    assert RUN_SKILL in names and SEARCH_ORDERS in names


def test_a_tool_used_lately_stays_offered() -> None:
    follow_up = TurnShape(
        message=PLAIN,
        skills=(CHART,),
        recently_used=frozenset({SEARCH_ORDERS, RUN_SKILL, PROPOSE_ORDERS_CSV}),
    )
    made = offer(_tools(follow_up.skills), follow_up)
    assert made.withheld == {}
    assert {SEARCH_ORDERS, RUN_SKILL, PROPOSE_ORDERS_CSV} <= {t["name"] for t in made.tools}


# --- through the stack: the stored request says what was withheld ------------------------------


@pytest_asyncio.fixture
async def dana(api_url: str, sessions: Database) -> AsyncIterator[ParleyClient]:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="cust_4410")
        await db.commit()
    client = ParleyClient(api_url, token)
    yield client
    await client.aclose()


async def _requests(sessions: Database, turn_id: str) -> list[dict]:
    async with orm(sessions) as db:
        calls = await db.scalars(
            select(ModelCall).where(ModelCall.turn_id == turn_id).order_by(ModelCall.step)
        )
        return [c.request for c in calls if c.provider != "resolver"]


async def test_the_stored_request_names_what_was_withheld_and_a_search_keeps_its_tools(
    dana: ParleyClient, sessions: Database
) -> None:
    sid = await dana.new_session()
    turn_id, events = await dana.turn(sid, "Hi there, thanks for having me.")
    assert events[-1].type == "done"
    [first] = await _requests(sessions, turn_id)
    assert first["budget"]["tools_withheld"] == {
        SEARCH_ORDERS: NO_SEARCH,
        PROPOSE_ORDERS_CSV: NO_RESULT_SET,
    }
    assert {t["name"] for t in first["tools"]}.isdisjoint({SEARCH_ORDERS, PROPOSE_ORDERS_CSV})

    turn_id, events = await dana.turn(sid, "Show me everything I ordered last week.")
    assert events[-1].type == "done"
    requests = await _requests(sessions, turn_id)
    assert all(SEARCH_ORDERS in {t["name"] for t in r["tools"]} for r in requests)
    assert "I found" in reply(events)

    # The next, plain message: the search was used a turn ago and a result set is stored.
    turn_id, events = await dana.turn(sid, "Thanks, that's helpful.")
    assert events[-1].type == "done"
    [after] = await _requests(sessions, turn_id)
    assert after["budget"]["tools_withheld"] == {}
    assert {SEARCH_ORDERS, PROPOSE_ORDERS_CSV} <= {t["name"] for t in after["tools"]}
