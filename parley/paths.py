"""Answer paths by turn shape: how much machinery a model step gets, decided by code.

    path      when                                             tools   reasoning effort
    fast      no tool is available to the turn (none allowed,   none    low
              or the allow-lists filter every one out)
    tools     the turn has tools: the loop of model and tools    all     the tenant's
    reanswer  the tool loop hit its cap with no answer: one      none    the tenant's
              more step words an answer from what it has

A fast step is grounded: the model is told to answer from the conversation and the passages
in front of it and to say so when they do not hold the answer. A re-answer is a child of the
step that hit the cap (`reanswer_of`, recorded on the request and the step's trace span): the
tools' results so far are in its prompt, and it is told that no more lookups will run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from parley.context import Block, Position
from parley.tokens import TokenCounter, count_message


class AnswerPath(StrEnum):
    fast = "fast"
    tools = "tools"
    reanswer = "reanswer"


FAST_EFFORT = "low"

FAST_NOTE = (
    "No tools are available in this conversation: answer from the conversation and the "
    "passages above. If they do not hold the answer, say so plainly; do not guess."
)
REANSWER_NOTE = (
    "The lookups for this answer have reached their limit and no more will run. Answer the "
    "user now from the tool results above; say plainly what you could not find out."
)


def choose_path(tools: list[dict[str, Any]], *, reanswer: bool = False) -> AnswerPath:
    """The path of a model step: its tools are already chosen (an empty list for a re-answer)."""
    if reanswer:
        return AnswerPath.reanswer
    return AnswerPath.tools if tools else AnswerPath.fast


def effort_for(path: AnswerPath, configured: str | None) -> str | None:
    """The reasoning effort a step asks of the provider: low on the fast path, else what the
    tenant configured (None leaves it to the provider)."""
    return FAST_EFFORT if path is AnswerPath.fast else configured


def path_block(counter: TokenCounter, path: AnswerPath) -> list[Block]:
    """The note that tells the model which path it is on (none on the tool loop). Sits with
    the state block, in the volatile tail, so the cached prefix is the same on every path."""
    note = {AnswerPath.fast: FAST_NOTE, AnswerPath.reanswer: REANSWER_NOTE}.get(path)
    if note is None:
        return []
    message = {"role": "system", "content": note}
    return [
        Block(
            kind="path",
            label="the answer path",
            messages=(message,),
            tokens=count_message(counter, message),
            position=Position.state,
            required=True,
            order=1,
        )
    ]
