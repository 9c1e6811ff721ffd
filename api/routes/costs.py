"""What a tenant's model calls cost: the ledger (store/costs.py) rolled up for a period, as
JSON or as CSV for a spreadsheet. `parley usage` prints the same report.

Admins read their own tenant only; any other tenant is 404.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from parley.api.deps import Admin, DbSession
from parley.api.errors import answers
from parley.errors import Forbidden, InvalidRequest, NotFound
from parley.store import costs
from parley.wire import CalendarDay

router = APIRouter(
    prefix="/v1/admin/tenants/{tenant_id}",
    tags=["admin"],
    responses=answers(Forbidden, NotFound),
)

# The longest period one report covers.
MAX_DAYS = 366


class CostLineOut(BaseModel):
    """One group's calls: `name` is the user id, `provider/model` or day it groups (the
    tenant's id on the total). Money is a decimal string in USD, exact."""

    name: str
    calls: int
    input_tokens: int  # every prompt token, cached ones included
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    estimated_calls: int  # the provider reported no usage: Parley's own count
    unpriced_calls: int  # no price known for the model (not in cost_usd)
    cost_usd: str


class CostReportOut(BaseModel):
    tenant_id: str
    from_: date = Field(alias="from")
    to: date
    by: str | None
    currency: Literal["USD"]
    total: CostLineOut
    lines: list[CostLineOut]


@router.get(
    "/costs",
    response_model=CostReportOut,
    response_model_by_alias=True,
    responses={
        **answers(InvalidRequest),
        200: {"content": {"text/csv": {"schema": {"type": "string"}}}},
    },
)
async def get_costs(
    tenant_id: str,
    db: DbSession,
    _: Admin,
    start: Annotated[CalendarDay | None, Query(alias="from")] = None,
    end: Annotated[CalendarDay | None, Query(alias="to")] = None,
    by: Literal["user", "model", "day", "session"] | None = None,
    format: Literal["json", "csv"] = "json",
) -> CostReportOut | Response:
    """What the tenant's model calls cost in the UTC days `from`..`to` (inclusive), in total
    and `by` user, model, day or session; `format=csv` for a spreadsheet. Without `to`,
    today; without `from`, the first day of `to`'s month (this month so far)."""
    end = end or datetime.now(UTC).date()
    start = start or end.replace(day=1)
    if end < start:
        raise InvalidRequest("`to` is before `from`", field="to")
    if (end - start).days >= MAX_DAYS:
        raise InvalidRequest(f"a report covers at most {MAX_DAYS} days", field="to")
    report = await costs.cost_report(db, tenant_id=tenant_id, start=start, end=end, by=by)
    if format == "csv":
        filename = f"costs-{tenant_id}-{start}-{end}.csv"
        return Response(
            report.as_csv(),
            media_type="text/csv",
            headers={"content-disposition": f'attachment; filename="{filename}"'},
        )
    return CostReportOut.model_validate(report.as_json())
