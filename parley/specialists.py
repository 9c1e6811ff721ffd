"""Specialists: agents a turn hands a task to, with their own persona, tools and bounds.

The first is the Returns specialist. A turn's model asks for it with `delegate_returns`;
the turn then runs it as a child workflow (workflows/specialist.py), which asks the user
which item and why (each question an `interaction` the turn rests on in `awaiting_input`),
checks the return window and proposes `create_return` as an action only the user's confirm
executes. With the demo model its steps are fixed here and in the workflow; a real model
drives it as an agent loop of its own (parley/returns_agent.py), given the persona below.

Pure: the rules (questions, reasons, how a typed answer picks an option, the closing words)
are tested alone; the I/O is in activities/specialist.py.
"""

from __future__ import annotations

import re
from enum import StrEnum

from parley.wire import Option

RETURNS = "returns"
RETURNS_LABEL = "Returns specialist"
DELEGATE_RETURNS = "delegate_returns"
CREATE_RETURN = "create_return"
# The tools a tenant offers only when it allows specialists (`TenantConfig.specialists`).
DELEGATION_TOOLS = frozenset({DELEGATE_RETURNS})

RETURNS_PERSONA = (
    "You are Northwind's Returns specialist. You help one customer return one item of one "
    "order: ask which item and why, check the return window, and prepare the return for the "
    "customer to confirm. Never create a return the customer has not confirmed."
)

ITEM_QUESTION = "Which item?"
REASON_QUESTION = "Why are you returning it?"
REASONS: tuple[Option, ...] = (
    Option(label="Too small", value="too_small"),
    Option(label="Too large", value="too_large"),
    Option(label="Damaged", value="damaged"),
    Option(label="Changed my mind", value="changed_my_mind"),
)


class SpecialistOutcome(StrEnum):
    """How a specialist ended; the turn's last words follow from it."""

    created = "created"  # the user confirmed and the return exists
    declined = "declined"  # the user said no to the proposal
    expired = "expired"  # the proposal was not answered in time
    timed_out = "timed_out"  # a question was not answered in time
    not_eligible = "not_eligible"  # the return window has closed
    gave_up = "gave_up"  # the specialist's step bound was reached
    failed = "failed"  # the backend did not create the return
    answered = "answered"  # a real model ended in words of its own (parley/returns_agent.py)


CLOSING_TEXT: dict[str, str] = {
    SpecialistOutcome.created: (
        "Your return is created. The prepaid label is on its way to your email address."
    ),
    SpecialistOutcome.declined: "OK, I haven't created a return.",
    SpecialistOutcome.expired: "The confirmation expired, so I didn't create the return.",
    SpecialistOutcome.timed_out: (
        "I didn't hear back from you, so I've set the return aside for now. Just ask again "
        "whenever you're ready and we'll pick it up."
    ),
    SpecialistOutcome.not_eligible: (
        "I'm sorry, this order is outside its return window, so I can't start a return."
    ),
    SpecialistOutcome.gave_up: (
        "I couldn't work out which option you meant, so I've stopped here. Please ask again."
    ),
    SpecialistOutcome.failed: "I couldn't create the return just now; nothing was changed.",
    # Said only when the model's own words cannot be (empty, or declined by the screen).
    SpecialistOutcome.answered: "I've stopped here without creating a return. Please ask again.",
}


def closing_text(outcome: str, rma_id: str | None = None) -> str:
    text = CLOSING_TEXT.get(outcome, CLOSING_TEXT[SpecialistOutcome.failed])
    if outcome == SpecialistOutcome.created and rma_id:
        return f"Your return {rma_id} is created. The prepaid label is on its way to your email."
    return text


# Words that make a message about returning something: the only messages the hand-over is
# offered on (parley/tool_offer.py), so other prompts do not carry its schema.
_RETURNING = re.compile(
    r"\breturn(?:s|ed|ing)?\b|\bRMA\b|\bsend(?:ing)?\b(?:\s+\w+){0,3}\s+back\b", re.IGNORECASE
)


def mentions_returning(message: str) -> bool:
    """Whether a message talks about returning something ("return", "send it back")."""
    return _RETURNING.search(message) is not None


def reason_label(value: str) -> str:
    return next((o.label for o in REASONS if o.value == value), value)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def match_option(text: str, options: list[Option]) -> str:
    """The option a typed answer names: its value, its label, or the one option sharing the
    most words with it. "" when nothing (or more than one option equally) matches."""
    said = text.strip().lower()
    for option in options:
        if said in (option.value.lower(), option.label.lower()):
            return option.value
    words = _words(text)
    scored = sorted(
        ((len(words & (_words(o.label) | _words(o.value))), o.value) for o in options),
        reverse=True,
    )
    if not scored or scored[0][0] == 0 or (len(scored) > 1 and scored[1][0] == scored[0][0]):
        return ""
    return scored[0][1]
