"""Replay tests: the current workflow code must replay histories recorded by earlier code.

Every file in tests/histories/ is the history of a real turn (or of a session's summary run,
`summary_v*`, recorded by tests/system/test_summary_runs.py; of an export or a retention purge,
`data_v*`, recorded by tests/workflow/test_data_workflows.py; of an erasure, `erasure_v*`,
recorded by tests/workflow/test_erasure_workflow.py; of an import's indexing, `import_v*`,
recorded by tests/workflow/test_import_workflow.py; of a hand-off to a person, `handoff_v*`,
recorded by tests/workflow/test_handoff_workflow.py; of a renewed card's wait,
`renewal_v*`, recorded by tests/workflow/test_renewal_workflow.py; or of a tenant's budget
approval, `budget_v*`, recorded by tests/workflow/test_budget_approval_workflow.py). A
change to the workflow that would break a turn already running in production fails here.
Turns are pinned to the build they started on (dispatch/deployment.py), so such a change
ships as a new build with a new recording, never as a `workflow.patched()` branch (none is
allowed, below). The previous build's turn recordings are replayed on the previous build's
own code, exported from git (tests/support/previous_build.py), which is what runs them: they
no longer replay on this build's (shown below, so that a build that does not change the
shape is not called a new one).

To record the current code's histories next to the old ones:
    PARLEY_RECORD_HISTORY=turn_vN .venv/bin/pytest tests/workflow/test_replay_shapes.py
then commit tests/histories/turn_vN_*.json: one history of every shape in SHAPES, each
fetched after the workflow closed (tests/workflow/test_replay_shapes.py), and move `CURRENT`
(tests/support/histories.py), and `PREVIOUS`/`PREVIOUS_BUILD` to the build before. The previous
build's recordings stay beside the current ones until no turn started on that build can still
be running; older ones go.
"""

from __future__ import annotations

import ast
import gc
import warnings
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.workflow import NondeterminismError

from parley import workflows
from parley.workflows.budget_approval import BudgetApprovalWorkflow
from parley.workflows.erasure import ErasureWorkflow
from parley.workflows.export import ExportWorkflow
from parley.workflows.handoff import HandoffWorkflow
from parley.workflows.imports import ImportWorkflow
from parley.workflows.renewal import RenewalWorkflow
from parley.workflows.retention import RetentionPurgeWorkflow
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.summary import SummaryWorkflow
from parley.workflows.turn import TurnWorkflow
from tests.support.histories import (
    CURRENT,
    HISTORIES,
    PREVIOUS,
    PREVIOUS_BUILD,
    PREVIOUS_SHAPES,
    SHAPES,
    current,
    previous_build_histories,
    replayer,
)
from tests.support.previous_build import export, replay
from tests.support.workflow_variants import ExtraStep, SeparateSteps

WORKFLOW_TASK = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
}
CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
}


PREVIOUS_BUILD_HISTORIES = previous_build_histories()


@pytest.mark.parametrize(
    "path",
    sorted(set(HISTORIES.glob("*.json")) - set(PREVIOUS_BUILD_HISTORIES)),
    ids=lambda p: p.stem,
)
async def test_committed_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json("recorded-turn", path.read_text())
    # A delegated turn's specialist (specialist_v*_returns) replays beside the turns, and so
    # do the summary runs, the exports and purges (data_v*, tests/workflow/
    # test_data_workflows.py), the erasures (erasure_v*, tests/workflow/
    # test_erasure_workflow.py), the imports (import_v*, tests/workflow/
    # test_import_workflow.py), the hand-offs (handoff_v*, tests/workflow/
    # test_handoff_workflow.py), the renewals (renewal_v*, tests/workflow/
    # test_renewal_workflow.py) and the budget approvals (budget_v*, tests/workflow/
    # test_budget_approval_workflow.py).
    workflows = [
        TurnWorkflow,
        SpecialistWorkflow,
        SummaryWorkflow,
        ExportWorkflow,
        RetentionPurgeWorkflow,
        ErasureWorkflow,
        ImportWorkflow,
        HandoffWorkflow,
        RenewalWorkflow,
        BudgetApprovalWorkflow,
    ]
    await replayer(*workflows).replay_workflow(history)


def test_there_is_at_least_one_committed_history() -> None:
    assert list(HISTORIES.glob("*.json")), "record one with PARLEY_RECORD_HISTORY"


@pytest.fixture(scope="module")
def previous_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(PREVIOUS_BUILD, tmp_path_factory.mktemp("previous-build"))


def test_the_previous_build_replays_its_recordings_on_its_own_code(previous_build: Path) -> None:
    assert all(path.exists() for path in PREVIOUS_BUILD_HISTORIES)
    replayed = replay(previous_build, PREVIOUS_BUILD_HISTORIES)
    assert replayed == {path.name: "ok" for path in PREVIOUS_BUILD_HISTORIES}


def test_the_current_recordings_do_not_replay_on_the_previous_build(previous_build: Path) -> None:
    # The shape changed: a turn of either build must end on its own build's workers.
    recordings = [HISTORIES / f"{CURRENT}_{shape}.json" for shape in ("plain", "tool")]
    replayed = replay(previous_build, recordings)
    assert all(outcome != "ok" for outcome in replayed.values()), replayed


@pytest.mark.parametrize("shape", PREVIOUS_SHAPES)
async def test_the_previous_build_s_recordings_do_not_replay_on_the_current_code(
    shape: str,
) -> None:
    with pytest.raises((NondeterminismError, RuntimeError)):
        await replayer(TurnWorkflow).replay_workflow(current(shape, PREVIOUS))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_current_recording_has_every_shape_each_to_its_close(shape: str) -> None:
    history = current(shape)
    assert history.events[-1].event_type in CLOSED
    # The task that closed the run is in it: the last workflow task completed (a history
    # fetched too early ends on a task started and never finished).
    tasks = [e.event_type for e in history.events if e.event_type in WORKFLOW_TASK]
    assert tasks[-1] == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


@pytest.mark.parametrize("shape", SHAPES)
async def test_an_extra_activity_fails_replay_of_every_shape(shape: str) -> None:
    with pytest.raises(NondeterminismError):
        await replayer(ExtraStep).replay_workflow(current(shape))


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_step_split_into_its_parts_fails_replay_of_every_shape(shape: str) -> None:
    # Local steps' recorded results are matched to the steps by order: the first part is
    # handed the whole step's result and its decoding fails the task.
    # What the process held before is frozen, so the collection below looks only at what the
    # replay made (a full one, over a long run's heap, took seconds each time).
    gc.freeze()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises((NondeterminismError, RuntimeError)):
                await replayer(SeparateSteps).replay_workflow(current(shape))
            # What the failed replay left behind is collected here, not in a later test: no
            # step of the variant was left unawaited to warn then.
            gc.collect()
    finally:
        gc.unfreeze()
    assert not [w for w in caught if "never awaited" in str(w.message)], caught


PATCH_CALLS = {"patched", "deprecate_patch"}


def _patch_calls(tree: ast.Module) -> list[str]:
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in PATCH_CALLS
    ]


@pytest.mark.parametrize(
    "path", sorted(Path(workflows.__file__).parent.glob("*.py")), ids=lambda p: p.stem
)
def test_no_workflow_branches_on_a_patch(path: Path) -> None:
    # One way to version a workflow: a new shape is a new build, and turns are pinned to the
    # build they started on (dispatch/deployment.py).
    assert _patch_calls(ast.parse(path.read_text())) == []


def test_the_guard_sees_a_patch_marker() -> None:
    tree = ast.parse("if workflow.patched('turn-v14'):\n    pass\nworkflow.deprecate_patch('x')\n")
    assert len(_patch_calls(tree)) == 2
