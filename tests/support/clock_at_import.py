"""A workflow module that reads the machine's clock when it is imported: what the sandbox's
import checks refuse (tests/replay/test_runner.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import workflow

LOADED_AT = datetime.now(UTC)


@workflow.defn(name="clock-at-import")
class ClockAtImport:
    @workflow.run
    async def run(self) -> str:
        return LOADED_AT.isoformat()
