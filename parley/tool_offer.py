"""Which of the tenant's tools a turn's request offers: those the turn's shape can use (pure).

Every offered schema rides every model call of a step (a few hundred tokens a turn that
nothing reads), so a tool with a precondition is withheld while its precondition does not
hold. The rules are code over the turn's state, never the model's say:

| tool                 | offered when                                                        |
|----------------------|---------------------------------------------------------------------|
| `propose_orders_csv` | the session holds a result set (its only argument names one)        |
| `search_orders`      | the message names a period or an amount of orders; or a result set  |
|                      | is in play (the resolver found a new search, a narrowing or a       |
|                      | reference); or an offered skill reads the customer's orders (with   |
|                      | no sandbox its answer falls back to the plain search of that month) |
| `run_skill`          | the message asks for what an enabled skill does (a word of its      |
|                      | manifest's `offer_when`) or names the skill; a skill whose manifest |
|                      | lists no words is always offered                                    |
| `delegate_returns`   | the message is about returning something ("return", "send back")   |
|                      | (and the tenant allows specialists, parley/tenancy.py)              |

Every other tool (the order reads, `propose_email`, the hand-off to a human, MCP tools) is
always offered.
A tool called in this turn or in the last few turns stays offered whatever its rule says: a
follow-up may need it again. Withholding is prompt economy, not permission: the executor still
accepts any tool the tenant allows. The request's budget plan records what was withheld and
why (`tools_withheld`), so an operator can see it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from parley.result_sets import mentions_scope
from parley.skills import RUN_SKILL, SkillManifest
from parley.specialists import DELEGATE_RETURNS, mentions_returning

SEARCH_ORDERS = "search_orders"
PROPOSE_ORDERS_CSV = "propose_orders_csv"

# Why a tool was left out, as the budget plan shows it.
NO_RESULT_SET = "no result set in the session to export"
NO_SEARCH = "the message names no period or amount and no result set is in play"
NO_SKILL_ASKED = "the message asks for no enabled skill"
NO_RETURN = "the message is not about returning something"


@dataclass(frozen=True)
class TurnShape:
    """What the rules read about a turn."""

    message: str
    # The resolver's result-set answer for this turn (`turn.resolution["result_set"]`).
    result_set_in_play: bool = False
    # The session has stored at least one result set.
    has_result_sets: bool = False
    # Tools called in this turn and the last few turns.
    recently_used: frozenset[str] = frozenset()
    # The skills the tenant enables (their manifests say what asks for them).
    skills: tuple[SkillManifest, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Offer:
    tools: list[dict[str, Any]]
    withheld: dict[str, str]  # tool name -> why it was left out


def skill_asked(manifest: SkillManifest, message: str) -> bool:
    """Whether a message asks for what the skill does, or names it."""
    if not manifest.offer_when:
        return True
    words = [*manifest.offer_when, manifest.name, manifest.name.replace("_", " ")]
    pattern = r"\b(" + "|".join(re.escape(w) for w in words) + r")s?\b"
    return re.search(pattern, message, re.IGNORECASE) is not None


def _reads_orders(skills: Iterable[SkillManifest], message: str) -> bool:
    return any(s.data == "orders" and skill_asked(s, message) for s in skills)


def why_withheld(name: str, shape: TurnShape) -> str | None:
    """The reason `name` is left out of this turn's request; None: it is offered."""
    if name in shape.recently_used:
        return None
    if name == PROPOSE_ORDERS_CSV and not shape.has_result_sets:
        return NO_RESULT_SET
    if name == SEARCH_ORDERS and not (
        shape.result_set_in_play
        or mentions_scope(shape.message)
        or _reads_orders(shape.skills, shape.message)
    ):
        return NO_SEARCH
    if name == RUN_SKILL and not any(skill_asked(s, shape.message) for s in shape.skills):
        return NO_SKILL_ASKED
    if name == DELEGATE_RETURNS and not mentions_returning(shape.message):
        return NO_RETURN
    return None


def offer(tools: list[dict[str, Any]], shape: TurnShape) -> Offer:
    """The tools of `tools` this turn offers, in their given order (cache-friendly), and the
    ones it withholds with the reason."""
    kept: list[dict[str, Any]] = []
    withheld: dict[str, str] = {}
    for tool in tools:
        reason = why_withheld(str(tool["name"]), shape)
        if reason is None:
            kept.append(tool)
        else:
            withheld[str(tool["name"])] = reason
    return Offer(kept, withheld)
