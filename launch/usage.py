"""`parley usage`: what a tenant's model calls cost in a period, from the ledger, as the admin
route reports it (store/costs.py `cost_report`): JSON, or CSV with `--csv`."""

from __future__ import annotations

import json
from datetime import date

from parley.config import Settings
from parley.launch.seeding import require_database
from parley.store import costs
from parley.store.db import Database, create_engine


async def usage_report(
    settings: Settings,
    *,
    tenant: str,
    start: date,
    end: date,
    by: costs.By | None,
    csv: bool,
) -> str:
    """The report's text."""
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            report = await costs.cost_report(db, tenant_id=tenant, start=start, end=end, by=by)
    finally:
        await engine.dispose()
    if csv:
        return report.as_csv()
    return json.dumps(report.as_json(), indent=2)
