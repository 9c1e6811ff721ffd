"""`PARLEY_API_WORKER`: the API process runs a worker on its own Temporal client and starts
turns eagerly (without it, the API starts none: a worker does). No other worker serves this
API's task queue, so a turn that ends at all ran on the API's own worker; the start response
carried its first task (an eager start), and the turn is pinned to the build, as any turn is.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowHandle,
)

from parley.api.main import create_app
from parley.config import Settings
from parley.dispatch.deployment import build_id
from parley.ids import workflow_id_for_turn
from tests.support.client import ParleyClient
from tests.support.stack import own_queue, serve


class EagerStarts(Interceptor):
    """Records, per workflow id, whether its start asked to be eager and whether it was."""

    def __init__(self) -> None:
        self.starts: dict[str, tuple[bool, bool]] = {}

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Recording(next, self)


class _Recording(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, owner: EagerStarts) -> None:
        super().__init__(next)
        self._owner = owner

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        handle = await super().start_workflow(input)
        eager = bool(getattr(handle, "__temporal_eagerly_started", False))
        self._owner.starts[input.id] = (input.request_eager_start, eager)
        return handle


async def test_an_api_that_runs_a_worker_starts_its_turns_eagerly_and_runs_them(
    settings: Settings, tokens: dict[str, str], temporal_client: Client, sessions: Any
) -> None:
    api_settings = own_queue(settings, "api-worker", api_worker=True)
    starts = EagerStarts()
    async with serve(create_app(api_settings, temporal_interceptors=[starts])) as url:
        priya = ParleyClient(url, tokens["priya"])
        try:
            session_id = await priya.new_session()
            turn_id, events = await priya.turn(session_id, "Where is my order?")
        finally:
            await priya.aclose()
    assert events[-1].type == "done", [e.type for e in events]
    assert "8472" in events[-1].data["message"]["text"]
    workflow_id = workflow_id_for_turn(turn_id)
    assert starts.starts[workflow_id] == (True, True), "asked for an eager start and got one"
    described = await temporal_client.get_workflow_handle(workflow_id).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    assert info.behavior == 1 and info.deployment_version.build_id == build_id(settings), info


async def test_by_default_the_api_starts_no_turn_and_a_worker_does(
    settings: Settings, tokens: dict[str, str], worker: Any
) -> None:
    """Without a worker of its own, the API calls no Temporal for a new turn: the post rings
    the workers' outbox and one of them starts it (dispatch/outbox.py `start_rung`)."""
    starts = EagerStarts()
    async with serve(create_app(settings, temporal_interceptors=[starts])) as url:
        priya = ParleyClient(url, tokens["priya"])
        try:
            session_id = await priya.new_session()
            turn_id, events = await priya.turn(session_id, "Tell me about yourself")
        finally:
            await priya.aclose()
    assert events[-1].type == "done"
    assert workflow_id_for_turn(turn_id) not in starts.starts, starts.starts
