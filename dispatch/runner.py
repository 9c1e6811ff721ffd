"""How the worker runs workflow code: in Temporal's sandbox, with two costs of it taken off
each turn.

- The sandbox re-imports a workflow's module for every run. The turn's helpers that hold no
  state (frozen step options, constants, the patch table, pure functions over the workflow
  API, the specialist) are passed through, imported once; the turn and summary workflow
  modules stay in the sandbox, executed afresh for every run but compiled once per process
  (`CompiledOnce`): where bytecode is not written (PYTHONDONTWRITEBYTECODE, as in the image
  and the dev environment) every run compiled them from source.
- For every payload of every activation the SDK asks the workflow, inside its sandbox, which
  serialization context applies (a snippet compiled and the import state swapped each time).
  A context matters only to a payload codec, external payload storage or a converter that
  reads it; with the SDK's own converters and neither of the others, every payload is
  written the same whatever the context, so the worker answers with the workflow's own
  context, outside the sandbox (`ContextFreeRunner`).

What the workflow code may do, and the replay of its histories, are the sandbox's as before.
`one_batch_per_task` sets how a task's jobs reach the workflow (a Stop beside a confirm).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import Any, ClassVar

import temporalio.converter
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    DataConverter,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker._workflow_instance import _WorkflowLogicFlag
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import Info

# Modules without state of their own: constants, frozen options, the patch table, functions
# over the workflow API, and the specialist's helpers and workflow (its state is per run).
PASSED_THROUGH = (
    "workflows.options",
    "workflows.patches",
    "workflows.wording",
    "workflows.model_step",
    "workflows.specialist",
)
RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)


def workflow_runner(converter: DataConverter) -> WorkflowRunner:
    """The worker's runner for workflows whose payloads `converter` writes."""
    compile_workflows_once()
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


class CompiledOnce(importlib.machinery.SourceFileLoader):
    """The loader of a module under `workflows`: its code object is compiled once per process
    and version of its source file, then reused by every sandbox that imports the module."""

    _codes: ClassVar[dict[tuple[str, int, int], CodeType]] = {}

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        code = self._codes.get(key)
        if code is None:
            code = super().get_code(fullname)
            assert code is not None
            self._codes[key] = code
        return code


class _WorkflowSources(importlib.abc.MetaPathFinder):
    """Finds the modules under `workflows` as the path finder does, loaded by `CompiledOnce`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("workflows."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if spec is None or type(loader) is not importlib.machinery.SourceFileLoader:
            return spec
        spec.loader = CompiledOnce(loader.name, loader.path)
        return spec


def compile_workflows_once() -> None:
    """Serve the modules under `workflows` through `CompiledOnce` (installed once)."""
    if not any(isinstance(finder, _WorkflowSources) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WorkflowSources())


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
