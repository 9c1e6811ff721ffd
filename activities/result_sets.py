"""Result sets in the turn: the search tool, the CSV export proposal, and the resolver step
that decides, before the model runs, which set or which new search a message means.

The domain rules are in parley/result_sets.py; this module does their I/O: it reads and
writes `result_sets` rows (store/result_sets.py), asks the backend for its clock and its
orders, and records the export as a pending action whose arguments carry the whole file, so
the user's confirmation is bound to exactly those rows (the action's argument hash).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from parley.activities.email_proposal import (
    NO_VERIFIED_ADDRESS,
    mask_email,
    propose_send_email,
    verified_address,
)
from parley.activities.northwind import NorthwindClient
from parley.ids import result_set_id_for_call
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.result_sets import (
    CSV_FILENAME,
    NeedsToday,
    SetResolution,
    decide,
    describe_query,
    describe_set,
    orders_csv,
)
from parley.store import result_sets as result_set_store
from parley.store import slots
from parley.store.db import Database, Db, connect
from parley.store.turns.reads import TurnFacts
from parley.store.turns.tool_calls import ToolCallRow
from parley.tools import ProposeOrdersCsvArgs, SearchOrdersArgs, ToolError

RESULT_SET_TOOLS = ("search_orders", "propose_orders_csv")
CSV_CONTENT_TYPE = "text/csv"


class AskingTurn(Protocol):
    """The turn whose message the resolver reads (`TurnFacts`, or the session's own row
    while the context build holds one)."""

    @property
    def session_id(self) -> str: ...
    @property
    def user_message_id(self) -> str: ...


async def resolve_result_sets(
    db: Db,
    turn: AskingTurn,
    northwind: NorthwindClient,
    current: dict[str, Slot] | None = None,
    *,
    message: str,
    has_sets: bool = True,
) -> SetResolution:
    """Rungs of the resolver ladder for result sets (run before the order resolver) for
    the turn's `message`; `current`: the session's slots when the caller has read them
    already; `has_sets=False`: the caller knows the session has stored no set (none is read)."""
    sets = (
        await result_set_store.recent_result_sets(db, session_id=turn.session_id)
        if has_sets
        else []
    )
    if current is None:
        current = await slots.get_slots(db, session_id=turn.session_id)
    pending = current.get(PENDING_CLARIFICATION)
    value = pending.value if pending is not None and isinstance(pending.value, dict) else None
    try:
        return decide(message, sets=sets, pending=value)
    except NeedsToday:
        today = await northwind.today() or datetime.now(UTC).date()
        return decide(message, sets=sets, pending=value, today=today)


def export_summary(args: dict[str, Any]) -> str | None:
    """How the state block names an export action ("orders.csv with 3 rows"), or None."""
    attached = args.get("attachment")
    if not attached:
        return None
    rows = attached.get("rows")
    return f"{attached['filename']} with {rows} row{'' if rows == 1 else 's'}"


def attachments_to_send(args: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The attachments of a confirmed email, in the email service's shape."""
    attached = args.get("attachment")
    if not attached:
        return None
    keys = ("filename", "content_type", "content")
    return [{k: attached[k] for k in keys}]


class ResultSetTools:
    """Runs `search_orders` and `propose_orders_csv` for the tool executor."""

    def __init__(
        self,
        *,
        sessions: Database,
        northwind: NorthwindClient,
    ) -> None:
        self._sessions = sessions
        self._northwind = northwind

    async def run(
        self, turn: TurnFacts, call: ToolCallRow, args: Any, ttl_s: float
    ) -> dict[str, Any]:
        if isinstance(args, SearchOrdersArgs):
            return await self._search(turn, call, args)
        assert isinstance(args, ProposeOrdersCsvArgs)
        return await self._propose_csv(turn, call, args, ttl_s)

    async def _search(
        self, turn: TurnFacts, call: ToolCallRow, args: SearchOrdersArgs
    ) -> dict[str, Any]:
        query = args.model_dump(exclude_none=True)
        found = await self._northwind.search_orders(turn.tenant_id, turn.user_id, query)
        rows = [
            {
                "order_id": str(o["order_id"]),
                "placed": o["placed"],
                "total": o["total"],
                "status": o["status"],
            }
            for o in found
        ]
        async with connect(self._sessions) as conn:
            stored = await result_set_store.record_result_set(
                conn,
                result_set_id=result_set_id_for_call(tool_call_id=call.id),
                session_id=turn.session_id,
                turn_id=turn.id,
                tool_call_id=call.id,
                user_seq=turn.user_seq,
                query=query,
                rows=rows,
            )
        return {
            "result_set_id": stored.id,
            "query": query,
            "about": describe_query(query),
            "count": len(rows),
            "currency": "USD",
            "orders": rows,
        }

    async def _propose_csv(
        self, turn: TurnFacts, call: ToolCallRow, args: ProposeOrdersCsvArgs, ttl_s: float
    ) -> dict[str, Any]:
        async with connect(self._sessions) as conn:
            stored = await result_set_store.session_result_set(
                conn, session_id=turn.session_id, result_set_id=args.result_set_id
            )
        if stored is None:
            return ToolError("not_found", "no such result set in this conversation").as_result()
        customer = await self._northwind.get_customer(turn.tenant_id, turn.user_id)
        recipient = verified_address(customer)
        if recipient is None:
            return NO_VERIFIED_ADDRESS.as_result()
        count = len(stored.rows)
        attachment = {
            "filename": CSV_FILENAME,
            "content_type": CSV_CONTENT_TYPE,
            "content": orders_csv(stored.rows),
            "rows": count,
        }
        action = await propose_send_email(
            self._sessions,
            turn=turn,
            call=call,
            args={
                "result_set_id": stored.id,
                "to": recipient,
                "subject": f"Your Northwind orders: {describe_set(stored)}",
                "body": f"Attached: {CSV_FILENAME}, {describe_set(stored)}.",
                "attachment": attachment,
            },
            summary=f"Email {CSV_FILENAME} ({describe_set(stored)}) to {mask_email(recipient)}",
            ttl_s=ttl_s,
        )
        return {
            "action_id": action.id,
            "status": "pending_confirmation",
            "result_set_id": stored.id,
            "filename": CSV_FILENAME,
            "rows": count,
            "order_ids": stored.order_ids,
            "recipient_masked": action.recipient_masked,
        }
