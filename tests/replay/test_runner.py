"""The worker's workflow runner (dispatch/runner.py): no sandbox by default, its own sandbox
(every workflow module imported once per process) with `PARLEY_WORKFLOW_SANDBOX=on`; the
committed histories replayed under both as under the SDK's default sandbox.

tests/replay/test_replay.py replays every history in the default sandbox (every workflow module
imported afresh and checked); here the same recordings go through the runners the worker
really uses, and every workflow the worker registers goes through the sandbox's import checks:
the checks a worker without a sandbox no longer makes on every run are made here."""

from __future__ import annotations

import ast
import dataclasses
import pkgutil
import typing
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import (
    RestrictedWorkflowAccessError,
    SandboxedWorkflowRunner,
)

import parley.contracts
from parley import workflows
from parley.config import Settings
from parley.dispatch.runner import PASSED_THROUGH, workflow_runner
from parley.worker import WORKFLOWS as REGISTERED
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.summary import SummaryWorkflow
from parley.workflows.turn import TurnWorkflow
from tests.support.clock_at_import import ClockAtImport
from tests.support.histories import SHAPES, current
from tests.support.workflow_variants import ReadsTheClock

WORKFLOWS = Path(workflows.__file__).parent
MUTABLE = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "Counter", "OrderedDict"}


@pytest.mark.parametrize("sandboxed", [False, True], ids=["default", "sandbox on"])
@pytest.mark.parametrize("shape", SHAPES)
async def test_every_current_history_replays_under_the_workers_runner(
    shape: str, sandboxed: bool
) -> None:
    replayer = Replayer(
        workflows=[TurnWorkflow, SpecialistWorkflow, SummaryWorkflow],
        workflow_runner=workflow_runner(DataConverter.default, sandboxed=sandboxed),
    )
    await replayer.replay_workflow(current(shape))


def test_the_sandbox_is_off_unless_the_setting_turns_it_on() -> None:
    def runner(settings: Settings) -> object:
        return workflow_runner(DataConverter.default, sandboxed=settings.workflow_sandbox)

    assert isinstance(runner(Settings()), UnsandboxedWorkflowRunner)
    assert isinstance(runner(Settings(workflow_sandbox="on")), SandboxedWorkflowRunner)


@pytest.mark.parametrize("registered", REGISTERED, ids=lambda cls: cls.__name__)
async def test_every_registered_workflow_passes_the_sandboxs_import_checks(
    registered: type,
) -> None:
    """The worker runs its workflows without a sandbox: each one's module (and every module it
    imports outside `imports_passed_through`) imported afresh in the SDK's default sandbox,
    as a sandboxed worker would before it ran a turn."""
    defn = workflow._Definition.must_from_class(registered)
    SandboxedWorkflowRunner().prepare_workflow(defn)


async def test_the_import_checks_refuse_a_module_that_reads_the_clock() -> None:
    defn = workflow._Definition.must_from_class(ClockAtImport)
    with pytest.raises(RestrictedWorkflowAccessError):
        SandboxedWorkflowRunner().prepare_workflow(defn)
    UnsandboxedWorkflowRunner().prepare_workflow(defn)  # what the worker would have let by


async def test_the_replay_tier_refuses_a_turn_that_reads_the_clock() -> None:
    """A run that reads the machine's clock replays without complaint outside the sandbox (the
    worker's runner); the default sandbox the replay tests use refuses it."""
    history = current("plain")
    unchecked = Replayer(workflows=[ReadsTheClock], workflow_runner=UnsandboxedWorkflowRunner())
    await unchecked.replay_workflow(history)
    result = await Replayer(workflows=[ReadsTheClock]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert isinstance(result.replay_failure, Exception)
    assert "datetime.datetime.now" in str(result.replay_failure)


def test_every_workflow_module_is_imported_once() -> None:
    modules = {f"parley.workflows.{m.name}" for m in pkgutil.iter_modules([str(WORKFLOWS)])}
    assert modules == set(PASSED_THROUGH)


def _module_level_mutables(tree: ast.Module) -> list[str]:
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is None:
            continue
        called = value.func if isinstance(value, ast.Call) else None
        name = getattr(called, "id", getattr(called, "attr", None))
        if isinstance(value, MUTABLE) or name in MUTABLE_CALLS:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
    return found


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.py")), ids=lambda p: p.name)
def test_no_workflow_module_keeps_mutable_state_of_its_own(path: Path) -> None:
    """Imported once per process, a module-level list or dict would be shared by every turn
    the worker runs, and a replay could read what another turn left there."""
    assert _module_level_mutables(ast.parse(path.read_text())) == []


def test_the_guard_sees_a_module_level_cache() -> None:
    tree = ast.parse("SEEN = {}\nCACHE: dict[str, int] = dict()\nLIMIT = 3\n")
    assert len(_module_level_mutables(tree)) == 2


def test_payload_types_resolve_without_their_modules_globals() -> None:
    """The sandbox decodes activity results with `get_type_hints`, looking the module up in its
    own module table, where the worker's runner never imported it: annotations written as
    strings (a `from __future__ import annotations`) would not resolve there."""
    types = [
        obj
        for obj in vars(parley.contracts).values()
        if dataclasses.is_dataclass(obj) and obj.__module__ == "parley.contracts"
    ]
    assert types
    for cls in types:
        typing.get_type_hints(cls, globalns={}, localns={})
