"""Prefixed random ids (`ses_…`, `trn_…`) and the ids derived from them.

Derived ids are pure functions of the ids they come from, so that the API, the workflow and
the activities agree on them without passing anything extra through workflow history, and
so that a retried step finds (or produces) the very row an earlier attempt wrote: a retry is
idempotent because its ids are. The strings they produce are stored in rows and committed
workflow histories; changing a scheme here changes it everywhere, and must stay readable.
"""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def workflow_id_for_turn(turn_id: str) -> str:
    """One workflow per turn: starting it twice attaches to (or refuses) the same workflow."""
    return f"turn-{turn_id}"


def summary_workflow_id(*, session_id: str) -> str:
    """The session's summary workflow: one run at a time per session, which the turns that
    finish start or signal (`summary-ses_…`; runs started per turn were `summary-trn_…`)."""
    return f"summary-{session_id}"


def message_id_for_call(model_call_id: str) -> str:
    """The assistant message a model call produces; known before its first token streams,
    so deltas, the stored message and a retried attempt all name the same message."""
    return "msg_" + model_call_id.removeprefix("mc_")


def override_message_id(*, model_call_id: str) -> str:
    """The message for code's own words at the end of a turn (bounds, expiry, a declined
    input). The model call's message may already hold its tool calls, so this one gets its
    own id, derived so a retried finalize stores it once."""
    return message_id_for_call(model_call_id + "o")


def tool_call_row_id(*, model_call_id: str, position: int) -> str:
    """A tool call row: the model call (one step of one turn) and the call's position in its
    response. Never the provider's call id, which is unique only within its response (when
    a server sends one at all) and long enough to be cut."""
    return f"{model_call_id}:{position}"


def tool_result_message_id(*, tool_call_id: str) -> str:
    """The `tool` message holding a call's result: one per call however often it is stored."""
    digest = hashlib.sha256(tool_call_id.encode()).hexdigest()[:20]
    return f"msg_t{digest}"


def unfinished_message_id(*, turn_id: str, streamed_message_id: str | None) -> str:
    """The message that keeps what streamed in a turn that did not finish: the streamed
    message's own id, or one derived from the turn when nothing streamed."""
    return streamed_message_id or f"msg_{turn_id.removeprefix('trn_')}x"


def unfinished_message_fallback_id(*, candidate: str) -> str:
    """When `candidate` already holds a stored step (a tool-calling message), the unfinished
    answer takes the next id in line."""
    return candidate + "x"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def action_id_for_call(*, tool_call_id: str) -> str:
    """The action a proposing tool call records: a retried attempt finds the same action,
    and the whole row id (turn, step, position) goes into it, never a cut-off part."""
    return "act_" + _digest(tool_call_id)


def handoff_id_for_call(*, tool_call_id: str) -> str:
    """The hand-off a `handoff_to_human` call records: one however often the call runs."""
    return "hof_" + _digest(tool_call_id)


def handoff_id_for_policy(*, turn_id: str) -> str:
    """The hand-off a tenant's policy opens as a turn ends: one however often the end runs."""
    return "hof_" + _digest("policy:" + turn_id)


def result_set_id_for_call(*, tool_call_id: str) -> str:
    """The result set a `search_orders` call stores: one however often the call runs."""
    return "rs_" + _digest(tool_call_id)


def email_idempotency_key(*, action_id: str) -> str:
    """One action, one email, however often `send_email` runs: the email service dedupes
    on this key, and it is also how an unanswered send is looked up afterwards."""
    return f"parley-{action_id}"


def mcp_idempotency_key(*, action_id: str) -> str:
    """One confirmed MCP write, one effect, however often it is executed: the tool server
    dedupes on this key."""
    return f"parley-mcp-{action_id}"


def specialist_workflow_id(*, turn_id: str) -> str:
    """The specialist a turn hands work to: one per turn (a turn delegates at most once)."""
    return f"specialist-{turn_id}"


def interaction_id_for(*, turn_id: str, step: int) -> str:
    """A specialist's question: its step in the turn, so a retried ask shows the same one
    and an answer to an earlier question is told apart."""
    return "ia_" + _digest(f"{turn_id}:{step}")


def specialist_action_id(*, turn_id: str, step: int) -> str:
    """The action a specialist proposes: one however often the proposing step runs."""
    return "act_" + _digest(f"{turn_id}:specialist:{step}")


def return_idempotency_key(*, action_id: str) -> str:
    """One confirmed return, one RMA, however often `create_return` runs."""
    return f"parley-return-{action_id}"


# Bumped whenever the layout of the prompt's stable prefix changes.
PROMPT_LAYOUT_VERSION = 2


def prompt_cache_key(*, stable_prefix: str) -> str:
    """Names the prompt's invariant prefix (instructions, tool schemas) for the provider's
    cache: versioned by layout, and a digest of the prefix itself, so equal prefixes share a
    key and no tenant id or other tenant data is sent with it."""
    digest = hashlib.sha256(stable_prefix.encode()).hexdigest()[:16]
    return f"parley-p{PROMPT_LAYOUT_VERSION}-{digest}"


def artifact_file_id(*, tool_call_id: str, name: str) -> str:
    """A file a `run_skill` call produced: stored once however often the call runs."""
    return "file_" + _digest(f"{tool_call_id}/{name}")


def export_workflow_id(export_id: str) -> str:
    """One workflow per export: asking again for an export still being written attaches."""
    return f"export-{export_id}"


def import_workflow_id(import_id: str) -> str:
    """One workflow per import: repeating the import's request attaches to it."""
    return f"import-{import_id}"


def renewal_action_id(*, action_id: str) -> str:
    """The card that renews an expired one (`POST .../renew`): one however often the user
    asks, so a repeated renew answers the same card, and its send its own idempotency key."""
    return "act_" + _digest(f"{action_id}:renewal")


def renewal_workflow_id(*, action_id: str) -> str:
    """The workflow that waits for a renewed card's answer (`renewal-act_…`, the renewal's id)."""
    return f"renewal-{action_id}"
