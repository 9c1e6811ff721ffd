"""Skills for the tool executor: the catalog, the `run_skill` tool, its artifacts and events.

The model names a skill and its arguments; everything else is the server's: the skill must be
in the catalog and enabled for the tenant, the arguments must match its manifest's schema,
the customer's data comes from the backend with the session's identity, and the run happens
in a sandbox of its own (activities/sandbox.py). Files it produced are stored with the
session under ids derived from the call, so a retried attempt stores them once; the executor
announces them as `artifact` events, and a failed or impossible run as a `warning`, when it
records the call's result (`events`, appended once per call).
"""

from __future__ import annotations

import logging
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from parley.activities.northwind import BackendError, NorthwindClient
from parley.activities.sandbox import Produced, Sandbox, SkillRunError
from parley.config import Settings
from parley.contracts import EventType, WarningCode
from parley.ids import artifact_file_id
from parley.skills import (
    SANDBOX_UNAVAILABLE,
    SKILL_FAILED,
    SKILL_TIMED_OUT,
    RunSkillArgs,
    SkillManifest,
    effective_limits,
    month_range,
    run_skill_schema,
)
from parley.store import artifacts
from parley.store.db import Database, connect
from parley.store.turns.reads import TurnFacts
from parley.store.turns.tool_calls import ToolCallRow
from parley.tenancy import TenantConfig
from parley.tools import ToolError
from parley.wire import ArtifactData, WarningData

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"

WARNINGS = {
    SANDBOX_UNAVAILABLE: "Skills cannot run here (no sandbox is available); the reply says so.",
    SKILL_FAILED: "The skill did not finish; the reply says so.",
    SKILL_TIMED_OUT: "The skill ran past its time limit and was stopped; the reply says so.",
}
# Any other error a skill call ends with (it was stopped from outside) is a failed skill.
WARNING_OTHER = "The skill was stopped before it finished; the reply says so."


class _BadArguments(Exception):
    """Arguments the schema let through that name nothing (an unknown month)."""


def load_catalog(root: Path) -> dict[str, tuple[Path, SkillManifest]]:
    """Every skill folder under `root` with a valid manifest named as its folder; a broken
    one is logged and left out, never offered."""
    found: dict[str, tuple[Path, SkillManifest]] = {}
    for manifest_path in sorted(root.glob(f"*/{MANIFEST}")):
        folder = manifest_path.parent
        try:
            manifest = SkillManifest.model_validate_json(manifest_path.read_text())
        except (OSError, ValidationError) as exc:
            log.warning("skill %s left out: %s", folder.name, exc)
            continue
        if manifest.name == folder.name and (folder / manifest.entry).is_file():
            found[manifest.name] = (folder.resolve(), manifest)
    return found


class SkillTools:
    def __init__(
        self,
        *,
        sessions: Database,
        northwind: NorthwindClient,
        settings: Settings,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._sessions = sessions
        self._northwind = northwind
        self._settings = settings
        self._sandbox = sandbox or Sandbox(
            bwrap=settings.sandbox_bwrap,
            root=settings.sandbox_root or Path(tempfile.gettempdir()),
            python=settings.sandbox_python,
        )
        # The catalog, read at first use: skills ship with the deployment, so a worker reads
        # its folder once instead of every manifest in every context build and tool call.
        self._catalog: dict[str, tuple[Path, SkillManifest]] | None = None

    def _enabled(self, tenant: TenantConfig) -> dict[str, tuple[Path, SkillManifest]]:
        if self._catalog is None:
            self._catalog = load_catalog(self._settings.skills_dir)
        catalog = self._catalog
        return {name: catalog[name] for name in tenant.skills or [] if name in catalog}

    def manifests(self, tenant: TenantConfig) -> list[SkillManifest]:
        """The manifests of the skills the tenant enables (what asks for each: `offer_when`)."""
        return [manifest for _, manifest in self._enabled(tenant).values()]

    def offered(self, tenant: TenantConfig) -> list[dict[str, Any]]:
        """The `run_skill` tool when the tenant enables a skill the catalog holds."""
        enabled = self._enabled(tenant)
        return [run_skill_schema([m for _, m in enabled.values()])] if enabled else []

    async def run(self, turn: TurnFacts, call: ToolCallRow, tenant: TenantConfig) -> dict[str, Any]:
        """The result the model reads: what the skill said and the files it produced, or a
        structured error."""
        try:
            args = RunSkillArgs.model_validate(call.arguments or {})
        except ValidationError as exc:
            return ToolError("invalid_arguments", str(exc.errors()[0]["msg"])).as_result()
        skill = self._enabled(tenant).get(args.skill)
        if skill is None:
            return ToolError("not_allowed", f"{args.skill} is not an enabled skill").as_result()
        folder, manifest = skill
        try:
            jsonschema.validate(args.arguments, manifest.input_schema)
        except jsonschema.ValidationError as exc:
            return ToolError("invalid_arguments", exc.message).as_result()
        try:
            data = await self._data(turn, manifest, args)
        except _BadArguments as exc:
            return ToolError("invalid_arguments", str(exc)).as_result()
        except BackendError as exc:
            return ToolError("unavailable", str(exc), retryable=True).as_result()
        limits = effective_limits(
            manifest.limits, wall_clock_cap_s=self._settings.sandbox_wall_clock_s
        )
        try:
            ran = await self._sandbox.run(
                run_id=f"{turn.id}-{call.id}",
                skill_dir=folder,
                manifest=manifest,
                limits=limits,
                payload={"arguments": args.arguments, "data": data},
            )
        except SkillRunError as exc:
            failed = ToolError(exc.code, str(exc)).as_result()
            # The period the server worked out, so a model can answer without the skill.
            return failed | ({"period": data["period"]} if "period" in data else {})
        stored = await self._store(turn, call, ran.files)
        return {
            "skill": manifest.name,
            "summary": ran.summary,
            "artifacts": [a.model_dump() for a in stored],
        }

    async def _data(
        self, turn: TurnFacts, manifest: SkillManifest, args: RunSkillArgs
    ) -> dict[str, Any]:
        """The customer's data the skill works on, read with the session's identity."""
        if manifest.data == "orders":
            today = await self._northwind.today() or date.today()
            period = month_range(str(args.arguments.get("month", "")), today)
            if period is None:
                raise _BadArguments("month must be a month name or YYYY-MM")
            query = {"placed_from": period[0].isoformat(), "placed_to": period[1].isoformat()}
            orders = await self._northwind.search_orders(turn.tenant_id, turn.user_id, query)
            return {"period": query, "orders": orders}
        return {}

    async def _store(
        self, turn: TurnFacts, call: ToolCallRow, files: list[Produced]
    ) -> list[ArtifactData]:
        async with connect(self._sessions) as conn:
            stored = [
                await artifacts.store_artifact(
                    conn,
                    file_id=artifact_file_id(tool_call_id=call.id, name=f.name),
                    session_id=turn.session_id,
                    tenant_id=turn.tenant_id,
                    user_id=turn.user_id,
                    name=f.name,
                    content_type=f.content_type,
                    content=f.content,
                )
                for f in files
            ]
        return [ArtifactData(file_id=r.id, name=r.name, content_type=r.content_type, bytes=r.size)
                for r in stored]  # fmt: skip


def events(result: dict[str, Any]) -> list[tuple[EventType, BaseModel]]:
    """What the stream shows of a skill call's outcome (the executor appends it with the
    call's end, once per call): each file as an `artifact`, a failure as a `warning`."""
    error = result.get("error")
    if isinstance(error, dict):
        code = str(error.get("code"))
        if code in ("invalid_arguments", "not_allowed", "unavailable"):
            # The model's own mistake (it reads the error, the user needs no notice), or the
            # order system down (the executor's `tool_unavailable` warning says so).
            return []
        known = WarningCode(code) if code in WARNINGS else None
        warning = WarningData(
            code=known or SKILL_FAILED, message=WARNINGS[known] if known else WARNING_OTHER
        )
        return [(EventType.warning, warning)]
    return [
        (EventType.artifact, ArtifactData.model_validate(artifact))
        for artifact in result.get("artifacts") or []
    ]
