"""Handing work to a specialist: the `delegate_returns` tool's check, before the turn
starts the specialist as its child (workflows/specialist.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from parley.activities.northwind import NorthwindClient
from parley.specialists import RETURNS
from parley.tools import ToolError


class DelegatingTurn(Protocol):
    """Whom the turn serves (`TurnFacts`, or any row of the turn): the backend's reads are
    made as that customer."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...


async def delegate_returns(
    nw: NorthwindClient, turn: DelegatingTurn, order_id: str
) -> dict[str, Any]:
    """The order must be the customer's (another's answers `not_found`) and have items to
    return; then the turn hands it to the Returns specialist."""
    items = (await nw.order_resource(turn.tenant_id, turn.user_id, order_id, "/items"))["items"]
    if not items:
        return ToolError("nothing_to_return", "this order has no items to return").as_result()
    return {"delegated_to": RETURNS, "order_id": order_id}
