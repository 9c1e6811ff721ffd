"""`parley eval capture --feedback`: negative feedback on answers becomes draft conversation
files for a person to complete.

Each draft replays what the user said in that session up to the rated answer, redacted with
the log redaction (`parley.logs.redact`: email addresses and card numbers), with the rating's
comment as a note and no expectations yet; `status: draft` keeps it out of runs until a
person labels it. The drafts are derived copies of user text: their `source` names the user,
session and message, which is what the erasure of that user or session must look for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from parley.eval.client import AdminClient, EvalClientError, UserClient
from parley.logs import redact

TokenFor = Callable[[str, str], Awaitable[str | None]]


async def capture_feedback(
    *, url: str, admin_token: str, tenant: str, token_for: TokenFor, out: Path, limit: int = 50
) -> list[Path]:
    """Write one draft per negative rating not captured yet; returns the files written."""
    admin = AdminClient(url, admin_token)
    try:
        ratings = await admin.feedback(tenant, limit=limit)
    finally:
        await admin.aclose()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for rating in ratings:
        path = out / f"feedback-{rating['message_id']}.yaml"
        if path.exists():
            continue
        said = await _user_messages(url, tenant, rating, token_for)
        path.write_text(draft_text(tenant, rating, said))
        written.append(path)
    return written


async def _user_messages(
    url: str, tenant: str, rating: dict[str, Any], token_for: TokenFor
) -> list[str]:
    """What the user said in the session up to the rated answer (empty without their token)."""
    token = await token_for(tenant, str(rating["user_id"]))
    if token is None:
        return []
    user = UserClient(url, token)
    try:
        messages = await user.messages(str(rating["session_id"]), 0)
    except EvalClientError:
        return []
    finally:
        await user.aclose()
    rated = next((m["seq"] for m in messages if m["id"] == rating["message_id"]), None)
    return [
        str(m["text"])
        for m in messages
        if m["role"] == "user" and (rated is None or m["seq"] < rated)
    ]


def draft_text(tenant: str, rating: dict[str, Any], said: list[str]) -> str:
    steps = [{"say": redact(text), "expect": {}} for text in said] or [
        {"say": "TODO: what the user said", "expect": {}}
    ]
    draft = {
        "name": f"feedback on {rating['message_id']}",
        "tenant": tenant,
        "user": str(rating["user_id"]),
        "status": "draft",
        "tags": ["captured"],
        "source": {
            "feedback_message_id": str(rating["message_id"]),
            "session_id": str(rating["session_id"]),
            "turn_id": str(rating.get("turn_id") or ""),
        },
        "steps": steps,
    }
    note = redact(str(rating.get("comment") or "(no comment)")).replace("\n", " ")
    answer = redact(str(rating.get("answer_text") or "")).replace("\n", " ")[:300]
    header = (
        "# DRAFT captured from negative feedback: a person adds the expectations (slots,\n"
        "# tools, clarification, reply facts) and sets `status: ready`.\n"
        "# Derived from user text (redacted): erasing this user or session deletes this file.\n"
        f"# Comment: {note}\n"
        f"# Rated answer: {answer}\n"
    )
    return header + yaml.safe_dump(draft, sort_keys=False, allow_unicode=True)
