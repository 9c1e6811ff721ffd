"""Tools from outside: a turn's sessions with its tenant's MCP servers (the official `mcp` SDK,
streamable HTTP). Activities only; the workflow sees namespaced tool names and ids.

Three uses, each opening its own session as the turn's user and closing it however it ends
(the SDK's context managers are the `finally`: the session's `DELETE` goes out on success,
error and cancellation alike):

- `offered`, while the context is built: list the server's tools, keep the allowed ones,
  namespace them. A server that cannot be reached, or refuses the credentials, leaves the
  turn with its local tools and a `warning`.
- `run`, for a tool call the model made: refuse anything the allow-list does not name (even
  when the model names it), validate the arguments against the schema the server lists,
  then call a read, or turn a write into a proposal (a pending action, like `propose_email`).
- `execute_confirmed`, from `send_email` once the user confirmed such a proposal: call the
  write, once, under the action's idempotency key.

What a server answers is data for the model, fenced like every tool result; its failures
come back as errors prefixed so the model cannot mistake them for facts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urljoin

import httpx2
import jsonschema
from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.contracts import TOOL_ATTEMPTS
from parley.egress import Allowlist, check_redirect
from parley.errors import UrlNotAllowed
from parley.gateway.pinned import pinned_transport
from parley.gateway.resolver import system_resolver
from parley.ids import action_id_for_call, mcp_idempotency_key
from parley.mcp import (
    IDEMPOTENCY_HEADER,
    MCP_UNAVAILABLE,
    McpServerConfig,
    McpTool,
    failure_text,
    find_tool,
    is_mcp_name,
    model_schema,
)
from parley.statuses import ActionStatus
from parley.store import actions, steps, tenants
from parley.store.actions import ActionRow
from parley.store.db import Database, Db, connect
from parley.store.events import warn_once as warn_once_in_log
from parley.store.turns.reads import TurnFacts
from parley.store.turns.tool_calls import ToolCallRow
from parley.tenancy import TenantConfig
from parley.tools import ToolError
from parley.wire import WarningData

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

log = logging.getLogger(__name__)

# What the model reads of one result, at most.
MAX_CONTENT_CHARS = 3000
REDIRECTS = (301, 302, 303, 307, 308)


class McpUnavailable(Exception):
    """The server could not be reached, refused the credentials, or broke off the session."""


class _OriginGuard(httpx2.AsyncBaseTransport):
    """The session's transport: every request goes to the configured URL's origin, over
    connections to addresses the allow-list admits (gateway/pinned.py: one lookup per
    connection, checked, then connected to), and a redirect anywhere else is refused before
    anything follows it (parley/egress.py). The refusal is kept, since the SDK reports a
    failed request in its own words."""

    def __init__(self, server: McpServerConfig, allowed: Allowlist) -> None:
        self._server = server
        self._inner = pinned_transport(allowed, field=server.name, resolve=system_resolver)
        self.refused: UrlNotAllowed | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self._check(str(request.url))
        try:
            response = await self._inner.handle_async_request(request)
        except UrlNotAllowed as exc:  # a connection the allow-list refused
            self.refused = exc
            raise
        location = response.headers.get("location")
        if response.status_code in REDIRECTS and location:
            try:
                self._check(urljoin(str(request.url), location))
            finally:
                if self.refused is not None:
                    await response.aclose()
        return response

    def _check(self, url: str) -> None:
        try:
            check_redirect(self._server.url, url, field=self._server.name)
        except UrlNotAllowed as exc:
            self.refused = exc
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def mcp_session(
    server: McpServerConfig,
    *,
    tenant_id: str,
    user_id: str,
    allowed: Allowlist,
    extra: dict[str, str] | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized session with `server` as the user, closed when the block ends. Its
    address is checked against the deployment's allow-list on every connection (the name
    resolved then, not when the config was saved, and connected to as checked):
    `UrlNotAllowed` names the rule that refused it, and nothing was sent to a refused
    address."""
    # The SDK is loaded at a worker's first session, not at its start: its protocol models
    # are about a third of the worker's imports, and a tenant without servers never needs them.
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = server.headers(tenant_id=tenant_id, user_id=user_id) | (extra or {})
    timeout = httpx2.Timeout(server.timeout_s)
    guard = _OriginGuard(server, allowed)
    try:
        async with (
            # trust_env off: no proxy from the environment may resolve the name instead.
            httpx2.AsyncClient(
                headers=headers, timeout=timeout, transport=guard, trust_env=False
            ) as http,
            streamable_http_client(server.url, http_client=http) as (read, write),
            ClientSession(read, write, read_timeout_seconds=server.timeout_s) as session,
        ):
            await session.initialize()
            yield session
    except Exception as exc:
        if guard.refused is not None:
            raise guard.refused from exc
        raise


def refused_warning(server: McpServerConfig, exc: UrlNotAllowed) -> str:
    """What the turn's user reads (the rule, not the addresses; those go to the log)."""
    log.warning("MCP server %s refused: %s", server.name, exc.message)
    return (
        f"The {server.name} tools were refused by this deployment's address rules "
        f"({exc.extra.get('rule')}); this answer uses the built-in tools only."
    )


async def warn_once(db: Db, *, turn_id: str, message: str) -> None:
    """The turn's `mcp_unavailable` warning, once however many steps meet the failure."""
    data = WarningData(code=MCP_UNAVAILABLE, message=message)
    await warn_once_in_log(db, turn_id=turn_id, data=data)


def _content(result: Any) -> tuple[str, Any]:
    """The text of a tool result and, when that text is JSON, its parsed value."""
    text = "\n".join(getattr(block, "text", "") for block in result.content).strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = getattr(result, "structured_content", None)
    return text[:MAX_CONTENT_CHARS], data


class OfferingTurn(Protocol):
    """The turn whose model is offered the servers' tools (`TurnFacts`, or the session's
    own row while the context build holds one): sessions are opened as its user."""

    @property
    def id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...


class McpTools:
    """The turn's side of its tenant's MCP servers (built in worker.py)."""

    def __init__(self, *, sessions: Database, allowed: Allowlist | None = None) -> None:
        self._sessions = sessions
        # Where the tenants' servers may be (`Settings.mcp_allowed_hosts`; default: public).
        self._allowed = allowed or Allowlist.parse(["*"])

    async def offered(
        self, db: Db, turn: OfferingTurn, tenant: TenantConfig
    ) -> list[dict[str, Any]]:
        """The allowed tools of every configured server, as the model is offered them (the
        caller commits the warning a failed server leaves). Listed once per turn: a later
        step offers what its first step listed, so a turn's tools do not change under it."""
        if not any(server.allowed_tools for server in tenant.mcp_servers or []):
            return []
        first = await steps.first_step_tools(db, turn_id=turn.id)
        if first is not None:
            return [t for t in first if is_mcp_name(t["name"])]
        offered: list[dict[str, Any]] = []
        for server in tenant.mcp_servers or []:
            if not server.allowed_tools:
                continue  # nothing it serves is allowed: no session at all
            try:
                listed = await self._list(server, turn.tenant_id, turn.user_id)
            except UrlNotAllowed as exc:
                await warn_once(db, turn_id=turn.id, message=refused_warning(server, exc))
                continue
            except McpUnavailable:
                await warn_once(
                    db,
                    turn_id=turn.id,
                    message=f"The {server.name} tools could not be reached; this answer "
                    "uses the built-in tools only.",
                )
                continue
            for name, (description, schema) in listed.items():
                tool = find_tool([server], f"{server.name}__{name}")
                if tool is not None:  # outside the allow-list: never shown
                    offered.append(model_schema(tool, description=description, input_schema=schema))
        return offered

    async def _list(
        self, server: McpServerConfig, tenant_id: str, user_id: str
    ) -> dict[str, tuple[str, dict[str, Any]]]:
        try:
            async with asyncio.timeout(server.timeout_s):
                async with mcp_session(
                    server, tenant_id=tenant_id, user_id=user_id, allowed=self._allowed
                ) as session:
                    listed = await session.list_tools()
        except UrlNotAllowed:
            raise
        except Exception as exc:  # any way a session fails is the server being unusable
            raise McpUnavailable(type(exc).__name__) from exc
        return {t.name: (t.description or "", dict(t.input_schema)) for t in listed.tools}

    async def run(
        self, turn: TurnFacts, call: ToolCallRow, tenant: TenantConfig, *, ttl_s: float
    ) -> dict[str, Any]:
        """The result the model reads for a call of a namespaced tool (`tenant`: the turn's
        tenant's configuration, as the executor read it with the call)."""
        tool = find_tool(tenant.mcp_servers, call.name)
        if tool is None:
            return ToolError(
                "not_allowed", f"{call.name} is not enabled for this tenant"
            ).as_result()
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                return ToolError("invalid_arguments", "arguments are not valid JSON").as_result()
        if not isinstance(arguments, dict):
            return ToolError("invalid_arguments", "arguments must be a JSON object").as_result()
        try:
            async with asyncio.timeout(tool.server.timeout_s * 2):
                return await self._run(turn, call, tool, arguments, ttl_s)
        except UrlNotAllowed as exc:
            await self._warn(turn, tool, refused_warning(tool.server, exc))
            message = failure_text(tool.server.name, "is refused by the deployment's rules")
            return ToolError("not_allowed", message).as_result()
        except Exception as exc:
            if isinstance(exc, ApplicationError):
                raise
            await self._warn(turn, tool)
            message = failure_text(tool.server.name, "could not be reached or refused the call")
            return ToolError("server_unavailable", message).as_result()

    async def _run(
        self,
        turn: TurnFacts,
        call: ToolCallRow,
        tool: McpTool,
        arguments: dict[str, Any],
        ttl_s: float,
    ) -> dict[str, Any]:
        server = tool.server
        async with mcp_session(
            server, tenant_id=turn.tenant_id, user_id=turn.user_id, allowed=self._allowed
        ) as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
            if tool.tool not in listed:
                return ToolError("unknown_tool", f"{server.name} no longer serves it").as_result()
            try:
                jsonschema.validate(arguments, dict(listed[tool.tool].input_schema))
            except jsonschema.ValidationError as exc:
                path = ".".join(str(p) for p in exc.absolute_path) or "arguments"
                return ToolError("invalid_arguments", f"{path}: {exc.message}").as_result()
            except jsonschema.SchemaError:
                return ToolError("bad_response", "the server's schema is not valid").as_result()
            if tool.risk == "write":
                # Derived from the call, so a retried attempt finds the same action.
                action_id = action_id_for_call(tool_call_id=call.id)
                return await self._propose(turn, action_id, tool, arguments, ttl_s)
            result = await session.call_tool(tool.tool, arguments)
        text, data = _content(result)
        if getattr(result, "is_error", False):
            message = failure_text(server.name, f"answered: {text[:300]}")
            return ToolError("tool_error", message).as_result()
        return {"source": server.name, "tool": tool.tool, "content": data if data else text}

    async def _propose(
        self,
        turn: TurnFacts,
        action_id: str,
        tool: McpTool,
        arguments: dict[str, Any],
        ttl_s: float,
    ) -> dict[str, Any]:
        """A write is recorded for the user to confirm; nothing reaches the server yet."""
        shown = ", ".join(f"{k} {v}" for k, v in sorted(arguments.items()))
        summary = f"{tool.tool.replace('_', ' ').capitalize()}: {shown} (via {tool.server.name})"
        async with connect(self._sessions) as conn:  # one statement, autocommit
            action = await actions.create_action(
                conn,
                turn=turn,
                action_id=action_id,
                tool=tool.name,
                args={"server": tool.server.name, "tool": tool.tool, "arguments": arguments},
                summary=summary[:500],
                recipient_masked=None,
                ttl=timedelta(seconds=ttl_s),
            )
        return {"action_id": action.id, "status": "pending_confirmation", "summary": summary}

    async def execute_confirmed(self, action: ActionRow) -> tuple[ActionStatus, dict[str, Any]]:
        """Run a confirmed write once: the server dedupes on the action's key, so a retry
        after a lost answer has no second effect."""
        async with self._sessions() as db:
            tenant = await tenants.tenant_config(db, tenant_id=action.tenant_id)
        tool = find_tool(tenant.mcp_servers, action.tool)
        if tool is None or tool.risk != "write":  # unconfigured since the proposal
            return ActionStatus.failed, {"accepted": False, "error": "not_allowed"}
        key = {IDEMPOTENCY_HEADER: mcp_idempotency_key(action_id=action.id)}
        try:
            async with (
                asyncio.timeout(tool.server.timeout_s * 2),
                mcp_session(
                    tool.server,
                    tenant_id=action.tenant_id,
                    user_id=action.user_id,
                    allowed=self._allowed,
                    extra=key,
                ) as session,
            ):
                result = await session.call_tool(tool.tool, action.args["arguments"])
        except UrlNotAllowed as exc:  # nothing was sent: it never will be
            return ActionStatus.failed, {"accepted": False, "error": exc.code}
        except Exception as exc:
            if activity.info().attempt < TOOL_ATTEMPTS:
                raise ApplicationError(str(exc), type="backend_unavailable") from exc
            return ActionStatus.unknown, {"accepted": None}
        text, data = _content(result)
        if getattr(result, "is_error", False):
            return ActionStatus.failed, {"accepted": False, "error": text[:300]}
        return ActionStatus.executed, {"accepted": True, "result": data if data else text}

    async def _warn(self, turn: TurnFacts, tool: McpTool, message: str | None = None) -> None:
        async with self._sessions() as db:
            await warn_once(
                db,
                turn_id=turn.id,
                message=message
                or f"The {tool.server.name} tools did not answer; the reply says so.",
            )
            await db.commit()
