"""Worker Deployment Versioning on the real dev server. By default every worker is a version
of the "parley" deployment and the session stack's turns are pinned to its build. With stub
activities: a deploy of a new build while a turn rests on a confirmation card. New turns go to
the new build; the waiting turn stays pinned to the build it started on and finishes there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.config import Settings
from parley.contracts import ResolveActionSignal, TurnInput, TurnOutcome
from parley.dispatch.deployment import (
    build_id,
    current_build,
    deployment_config,
    deployment_version,
    installed_digest,
    promote,
    promote_configured,
)
from parley.ids import workflow_id_for_turn
from parley.workflows.turn import TurnWorkflow
from tests.support.client import ParleyClient
from tests.support.time_skipping import (
    STEP_DEADLINE_S,
    proposing,
    reached,
    waiting_for_confirmation,
)
from tests.support.workflow_stubs import ACTION_ID, Stubs


@asynccontextmanager
async def versioned_worker(
    client: Client, settings: Settings, queue: str, stubs: Stubs
) -> AsyncIterator[None]:
    """A worker of the settings' build that makes its version current, as run_worker does."""
    async with Worker(
        client,
        task_queue=queue,
        workflows=[TurnWorkflow],
        activities=stubs.activities(),
        deployment_config=deployment_config(settings),
    ):
        await promote_configured(client, settings)
        yield


def build_of(description: object) -> str:
    info = description.raw_description.workflow_execution_info.versioning_info  # type: ignore[attr-defined]
    assert info.behavior == 1, info  # VERSIONING_BEHAVIOR_PINNED
    return str(info.deployment_version.build_id)


async def test_a_turn_started_before_a_deploy_finishes_on_its_own_build(
    temporal_env: WorkflowEnvironment, settings: Settings
) -> None:
    client = temporal_env.client
    deployment = f"parley-{uuid.uuid4().hex[:8]}"
    queue = f"versioned-{uuid.uuid4().hex[:8]}"
    old = settings.model_copy(update={"worker_deployment": deployment, "worker_build_id": "b1"})
    new = settings.model_copy(update={"worker_deployment": deployment, "worker_build_id": "b2"})
    old_stubs, new_stubs = Stubs(), Stubs()
    old_stubs.answers = proposing()

    async with versioned_worker(client, old, queue, old_stubs):
        waiting = await client.start_workflow(
            TurnWorkflow.run,
            TurnInput("turn_pinned", "ses_1", "northwind"),
            id=queue + "-a",
            task_queue=queue,
            execution_timeout=timedelta(minutes=5),
        )
        await reached(old_stubs, "request_confirmation")
        await asyncio.wait_for(waiting_for_confirmation(waiting), STEP_DEADLINE_S)

        async with versioned_worker(client, new, queue, new_stubs):  # the deploy
            fresh = await client.start_workflow(
                TurnWorkflow.run,
                TurnInput("turn_fresh", "ses_2", "northwind"),
                id=queue + "-b",
                task_queue=queue,
                execution_timeout=timedelta(minutes=5),
            )
            assert await fresh.result() == TurnOutcome("completed", "msg_mc_0")
            confirmed = ResolveActionSignal(ACTION_ID, "confirmed")
            assert (
                await waiting.execute_update(TurnWorkflow.decide_action, confirmed) == "confirmed"
            )
            await waiting.result()

            assert build_of(await waiting.describe()) == "b1"
            assert build_of(await fresh.describe()) == "b2"

            # A worker of the old build starting again (a restart mid-deploy) leaves the new
            # build current; only `parley dev` (the checkout is the truth) takes it back.
            old_version = deployment_version(old)
            assert old_version is not None
            assert await promote(client, old_version) is False
            assert await current_build(client, deployment) == "b2"
            assert await promote(client, old_version, take_back=True) is True
            assert await current_build(client, deployment) == "b1"
    # The new build ran the new turn only; the waiting turn sent its email on the old one.
    assert {i.turn_id for _, i in new_stubs.calls} == {"turn_fresh"}
    assert old_stubs.names().count("send_email") == 1 and "send_email" not in new_stubs.names()
    assert "turn_fresh" not in {i.turn_id for _, i in old_stubs.calls}


def test_the_build_id_comes_from_the_setting_else_the_package_and_commit(
    settings: Settings,
) -> None:
    assert build_id(settings.model_copy(update={"worker_build_id": "2026.11.30"})) == "2026.11.30"
    derived = build_id(settings.model_copy(update={"worker_build_id": ""}))
    assert derived.startswith("0.1.0")  # pyproject's version, then the commit in a checkout
    assert deployment_config(settings.model_copy(update={"worker_deployment": ""})) is None


def test_by_default_a_worker_is_a_pinned_version_of_the_parley_deployment() -> None:
    defaults = Settings(database_url="postgresql://unused")
    config = deployment_config(defaults)
    assert config is not None and config.use_worker_versioning
    assert config.default_versioning_behavior == VersioningBehavior.PINNED
    assert config.version == deployment_version(defaults)
    assert config.version is not None
    assert config.version.deployment_name == "parley"
    assert config.version.build_id == build_id(defaults)
    # Unversioned stays one setting away (PARLEY_WORKER_DEPLOYMENT="").
    assert deployment_config(defaults.model_copy(update={"worker_deployment": ""})) is None


async def test_a_turn_on_the_stack_is_pinned_to_the_workers_build(
    priya: ParleyClient, temporal_client: Client, settings: Settings
) -> None:
    session_id = await priya.new_session()
    turn_id, events = await priya.turn(session_id, "Tell me about yourself")
    assert events[-1].type == "done"
    handle = temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.result()  # `done` streams from the turn's one workflow task, before it completes
    described = await handle.describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    assert info.behavior == 1, info  # VERSIONING_BEHAVIOR_PINNED
    assert info.deployment_version.deployment_name == "parley"
    assert info.deployment_version.build_id == build_id(settings)


def test_an_image_without_git_gets_a_build_id_from_its_installed_files() -> None:
    record = "parley/workflows/turn.py,sha256=AAAA,1200\nparley/config.py,sha256=BBBB,900\n"
    digest = installed_digest(record)
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert installed_digest(record) == digest  # every replica of one image agrees
    assert installed_digest(record.replace("AAAA", "CCCC")) != digest  # changed code
    # An editable install (a checkout) records no source file: the git commit names it.
    assert installed_digest("__editable__.parley-0.1.0.pth,sha256=DDDD,90\n") == ""
