"""How the worker runs workflow code: outside Temporal's sandbox by default, with the
determinism checks the sandbox makes moved to the test tier, where they cost no turn anything.

- The sandbox gives each workflow run its own module table, restricted builtins and proxies
  that refuse the clock, randomness and I/O at run time. That costs every run: building the
  sandbox for a new workflow (its first task, on the path to a turn's first token) and
  entering it on every activation: 1.5 to 3 ms of a plain turn's worker CPU, about 0.5 ms of
  it before the first step (bench/replay_cost.py: 11.7 ms per plain replay with it, 8.9
  without). The workflow code is the same in every run of a build, so the checks are made
  where they fail a build rather than a turn:
  tests/replay/test_replay.py replays every committed history under the SDK's default
  sandbox (a workflow that reads the clock, draws a random number, does I/O or imports
  unsafely fails there, on the path the history took), and tests/replay/test_runner.py
  runs every registered workflow's module through the sandbox's import checks.
  `PARLEY_WORKFLOW_SANDBOX=on` runs production workflows in the sandbox again.
- In the sandbox (that setting on), the default would import a workflow's module afresh for
  every run, so that module state cannot leak from one run to the next. No workflow module
  here keeps state at module level (constants, frozen options and pure functions only;
  every run's state lives on its workflow instance: tests/replay/test_runner.py checks),
  so every module under `workflows` is passed through: imported once per process.
- For every payload of every activation the SDK asks the workflow, inside its sandbox, which
  serialization context applies (a snippet compiled and the import state swapped each time).
  A context matters only to a payload codec, external payload storage or a converter that
  reads it; with the SDK's own converters and neither of the others, every payload is
  written the same whatever the context, so the worker answers with the workflow's own
  context, outside the sandbox (`ContextFreeRunner`).

Payload types (parley/contracts.py) are decoded in the sandbox, whose module table holds only
what was imported in it: their annotations are evaluated when the module loads, so decoding
needs no lookup of the module's globals. `one_batch_per_task` sets how a task's jobs reach
the workflow (a Stop beside a confirm).
"""

from __future__ import annotations

from typing import Any

import temporalio.converter
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    DataConverter,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker._workflow_instance import _WorkflowLogicFlag
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import Info

# Every workflow module: none holds state of its own (see above). A new module under
# `workflows` goes here too (tests/replay/test_replay.py checks the list is complete).
PASSED_THROUGH = (
    "parley.workflows.options",
    "parley.workflows.erasure",
    "parley.workflows.wording",
    "parley.workflows.model_step",
    "parley.workflows.tool_batch",
    "parley.workflows.steering",
    "parley.workflows.specialist",
    "parley.workflows.summary",
    "parley.workflows.turn",
    "parley.workflows.export",
    "parley.workflows.retention",
    "parley.workflows.imports",
    "parley.workflows.handoff",
    "parley.workflows.renewal",
    "parley.workflows.budget_approval",
)
RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)


def workflow_runner(converter: DataConverter, *, sandboxed: bool) -> WorkflowRunner:
    """The worker's runner for workflows whose payloads `converter` writes; `sandboxed`:
    `PARLEY_WORKFLOW_SANDBOX` (see the module's docstring)."""
    if not sandboxed:
        return UnsandboxedWorkflowRunner()
    if context_free(converter):
        return ContextFreeRunner(restrictions=RESTRICTIONS)
    return SandboxedWorkflowRunner(restrictions=RESTRICTIONS)


def context_free(converter: DataConverter) -> bool:
    """Whether the serialization context cannot change a payload `converter` writes."""
    return (
        converter.payload_codec is None
        and converter.external_storage is None
        and converter.payload_converter_class is temporalio.converter.DefaultPayloadConverter
        and converter.failure_converter_class is temporalio.converter.DefaultFailureConverter
    )


class ContextFreeRunner(SandboxedWorkflowRunner):
    """The sandboxed runner whose instances name the workflow's own context for every
    payload, without entering the sandbox (see the module's docstring)."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _ContextFree(super().create_instance(det), det.info)


class _ContextFree(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, info: Info) -> None:
        self._inner = inner
        self._context = WorkflowSerializationContext(
            namespace=info.namespace, workflow_id=info.workflow_id
        )
        self._store = StorageDriverStoreContext(
            target=StorageDriverWorkflowInfo(
                id=info.workflow_id,
                run_id=info.run_id,
                type=info.workflow_type,
                namespace=info.namespace,
            )
        )

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> WorkflowSerializationContext:
        return self._context

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        return self._store

    def get_info(self) -> Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


def one_batch_per_task(worker: Worker) -> Worker:
    """Each workflow task's jobs all applied before the workflow code runs again.

    By default the SDK runs the workflow after the signals of a task and only then applies
    the rest of its jobs, the cancel among them. A Stop and a confirm that reach the turn in
    one task would then let the confirm's wait end and the send be scheduled before the turn
    hears of the Stop, even when the history has the Stop first. With every job applied
    first, the wait ends cancelled. The SDK records the choice in the history (its logic flag
    2, meant to become its default), so histories written without it replay as they were.
    """
    worker._set_default_workflow_logic_flag(
        _WorkflowLogicFlag.PROCESS_WORKFLOW_ACTIVATION_JOBS_AS_SINGLE_BATCH, enabled=True
    )
    return worker
