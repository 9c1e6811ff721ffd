"""What a tenant's turns cost, as an operator reads it: the admin route (JSON and CSV) and
`parley usage` agree with the ledger; a tenant's own prices price its calls; the worker's
cost counter moves by what the ledger wrote."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

from prometheus_client import REGISTRY
from sqlalchemy import select

from parley.config import Settings
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import ModelCost, User
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import REPO, service_env
from tests.support.tenants import new_admin_tenant

# The tenant's own price for the demo model, per million tokens: high enough that two
# short turns cost whole cents.
PRICES = {"demo/demo-1": {"input": "900.00", "cached_input": "90.00", "output": "2000.00"}}


def counted_cost() -> Decimal:
    value = REGISTRY.get_sample_value(
        "parley_model_cost_usd_total", {"provider": "demo", "model": "demo-1", "kind": "turn"}
    )
    return Decimal(str(value or 0))


async def test_the_route_and_the_cli_report_what_the_ledger_holds(
    api_url: str, sessions: Database, settings: Settings
) -> None:
    tenant = await new_admin_tenant(sessions, prefix="cost")
    async with orm(sessions) as db:
        db.add(User(tenant_id=tenant.tenant_id, id="cust_a", display_name="A", roles=[]))
        await db.commit()
    async with sessions() as db:
        customer_token = await create_token(db, tenant_id=tenant.tenant_id, user_id="cust_a")
        await db.commit()
    admin = ParleyClient(api_url, tenant.token)
    customer = ParleyClient(api_url, customer_token)
    base = f"/v1/admin/tenants/{tenant.tenant_id}"
    try:
        put = await admin.http.put(f"{base}/config", json={"prices": PRICES})
        assert put.status_code == 200, put.text
        before = counted_cost()
        session_id = await customer.new_session()
        for text in ("Where is my order?", "What about the refund?"):
            _, events = await customer.turn(session_id, text)
            assert events[-1].type == "done"

        async with orm(sessions) as db:
            rows = (
                await db.scalars(select(ModelCost).where(ModelCost.tenant_id == tenant.tenant_id))
            ).all()
        assert rows and all(r.user_id == "cust_a" and r.kind == "turn" for r in rows)
        ledger = sum(Decimal(r.cost_usd or 0) for r in rows)
        # Priced with the tenant's own price, not the table's.
        own = sum(
            (
                (r.input_tokens - r.cached_tokens) * Decimal("900")
                + r.cached_tokens * Decimal("90")
                + r.output_tokens * Decimal("2000")
            )
            / 1_000_000
            for r in rows
        )
        assert ledger == own and ledger >= Decimal("0.01")
        assert counted_cost() - before >= ledger - Decimal("0.000001")

        day = datetime.now(UTC).date().isoformat()
        period = {"from": day, "to": day}
        report = await admin.http.get(f"{base}/costs", params={**period, "by": "model"})
        assert report.status_code == 200, report.text
        body = report.json()
        assert Decimal(body["total"]["cost_usd"]) == ledger
        assert body["total"]["calls"] == len(rows)
        assert [line["name"] for line in body["lines"]] == ["demo/demo-1"]
        assert body["total"]["output_tokens"] == sum(r.output_tokens for r in rows)

        as_csv = await admin.http.get(
            f"{base}/costs", params={**period, "by": "user", "format": "csv"}
        )
        assert as_csv.headers["content-type"].startswith("text/csv")
        table = list(csv.DictReader(io.StringIO(as_csv.text)))
        assert [(r["user"], Decimal(r["cost_usd"])) for r in table] == [("cust_a", ledger)]

        printed = subprocess.run(
            [
                sys.executable,
                "-m",
                "parley.launch.cli",
                "usage",
                "--tenant",
                tenant.tenant_id,
                "--from",
                day,
                "--to",
                day,
                "--by",
                "model",
            ],
            env=service_env(settings),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert printed.returncode == 0, printed.stderr
        assert json.loads(printed.stdout) == body

        backwards = await admin.http.get(f"{base}/costs", params={"from": day, "to": "2000-01-01"})
        assert backwards.status_code == 422
        assert backwards.json()["error"]["code"] == "invalid_request"
        customer_asks = await customer.http.get(f"{base}/costs", params=period)
        assert customer_asks.status_code == 403
    finally:
        await admin.aclose()
        await customer.aclose()
