"""One batch of a turn's tool calls (the calls of one model reply), and the step boundary
every part of the turn checks. Workflow code, run inside the turn workflow."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.tools import ToolActivities
    from parley.contracts import (
        MAX_TOOL_CALLS_PER_RESPONSE,
        ExecuteToolInput,
        ToolCallRef,
        ToolOutcome,
        TurnInput,
    )
    from parley.skills import RUN_SKILL
    from parley.tools import Risk, risk_of

from parley.workflows.options import SKILL, TOOL
from parley.workflows.wording import TOO_MANY_TOOLS


def honour_cancel() -> None:
    """A step boundary: a Stop delivered while the step ran is honoured here, whatever the
    step returned (a model call that finished before hearing of it, a screen)."""
    if workflow.cancellation_reason() is not None:
        raise asyncio.CancelledError()


async def run_tools(
    inp: TurnInput,
    calls: list[ToolCallRef],
    seen: set[tuple[str, str]],
    *,
    refuse_all: str | None = None,
) -> list[ToolOutcome]:
    """Reads run in parallel; proposals and hand-offs one at a time, after them. The batch
    runs to its end: a steer that comes meanwhile is taken by the next model step. `seen`:
    the turn's calls so far, for the repeat guard."""
    jobs: list[tuple[ExecuteToolInput, str]] = []  # each with its line in the UI
    for position, call in enumerate(calls):
        refuse = refuse_all
        key = (call.name, call.args_hash)
        if refuse is None and key in seen:
            refuse = "an identical call already ran in this turn; use its result"
        if refuse is None and position >= MAX_TOOL_CALLS_PER_RESPONSE:
            refuse = TOO_MANY_TOOLS
        seen.add(key)
        jobs.append(
            (
                ExecuteToolInput(inp.turn_id, call.call_id, refuse, inp.confirmation_timeout_s),
                f"{call.name} (refused)" if refuse else call.name,
            )
        )
    # Skills run one at a time, after the reads: each holds a sandbox.
    parallel = [
        (j, summary)
        for (j, summary), c in zip(jobs, calls, strict=True)
        if (risk_of(c.name) in (Risk.read, None) or j.refuse) and c.name != RUN_SKILL
    ]
    serial = [j for j in jobs if j not in parallel]
    outcomes = list(await asyncio.gather(*(_execute_tool(*j) for j in parallel)))
    for one in serial:
        honour_cancel()
        outcomes.append(await _execute_tool(*one))
    honour_cancel()
    return outcomes


async def _execute_tool(job: ExecuteToolInput, summary: str) -> ToolOutcome:
    # A skill's sandbox may run for its whole wall clock: a bundle of its own.
    options = SKILL if summary == RUN_SKILL else TOOL
    return await options.run(ToolActivities.execute_tool, job, summary=summary)
