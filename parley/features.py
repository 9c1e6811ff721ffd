"""Feature access: what a user may use, kept on their identity (`users.features`).

Every user has the assistant until an operator revokes it (`parley feature revoke`); without
it a user keeps their history (reading sessions and messages) but starts no new turns.
"""

from __future__ import annotations

ASSISTANT = "assistant"
# Features an operator may grant or revoke; the CLI refuses any other name.
KNOWN = (ASSISTANT,)
