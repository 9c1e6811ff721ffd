"""The worker's workflow runner (dispatch/runner.py): every workflow module imported once per
process, and the committed histories replayed under it as under the SDK's default sandbox.

tests/replay/test_replay.py replays every history in the default sandbox (every workflow module
imported afresh and checked); here the same recordings go through the runner the worker
really uses, whose sandbox never imports the payload types' module itself."""

from __future__ import annotations

import ast
import dataclasses
import pkgutil
import typing
from pathlib import Path

import pytest
from temporalio.converter import DataConverter
from temporalio.worker import Replayer

import parley.contracts
from parley import workflows
from parley.dispatch.runner import PASSED_THROUGH, workflow_runner
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.summary import SummaryWorkflow
from parley.workflows.turn import TurnWorkflow
from tests.support.histories import SHAPES, current

WORKFLOWS = Path(workflows.__file__).parent
MUTABLE = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "Counter", "OrderedDict"}


@pytest.mark.parametrize("shape", SHAPES)
async def test_every_current_history_replays_under_the_workers_runner(shape: str) -> None:
    replayer = Replayer(
        workflows=[TurnWorkflow, SpecialistWorkflow, SummaryWorkflow],
        workflow_runner=workflow_runner(DataConverter.default),
    )
    await replayer.replay_workflow(current(shape))


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
