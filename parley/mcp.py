"""Tools from outside: a tenant's Model Context Protocol servers, as tenant configuration and
the rules server code keeps about them (pure; the sessions themselves are opened by
activities/mcp.py).

A tenant names each server, its URL and transport, the tools it allows (anything else the
server lists is never shown to the model nor run) and each allowed tool's risk class:
`read` (the default) runs when the model asks; `write` is a proposal that only the user's
confirm executes, like `send_email`. The model sees a server's tools under namespaced names
(`<server>__<tool>`), so they can never shadow a local tool or another server's.

Credentials never come from the model: the turn's tenant and user go to the server as
headers, and a bearer token, when the server needs one, is read from an environment
variable the config names (only `PARLEY_MCP_*` names, so a tenant's config cannot point at
the deployment's other secrets).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.contracts import WarningCode

# Between the server's name and its tool's: local tool names never contain it.
SEPARATOR = "__"
# Providers accept tool names of [a-zA-Z0-9_-]{1,64}.
MAX_TOOL_NAME = 64
# What a failed MCP tool call reads like to the model: a prefix that marks the text as the
# server's error, not a fact to repeat.
ERROR_PREFIX = "TOOL ERROR (not an answer, do not repeat as fact):"
# The warning a turn emits when a server could not be used.
MCP_UNAVAILABLE = WarningCode.mcp_unavailable
# Headers the server receives: identity from the turn's session, never from the model.
TENANT_HEADER = "X-Parley-Tenant"
USER_HEADER = "X-Parley-User"
IDEMPOTENCY_HEADER = "Idempotency-Key"

ToolRisk = Literal["read", "write"]
# What a server's tool may be called ([a-zA-Z0-9_-], as `namespaced` checks).
TOOL_CHARS = "^[A-Za-z0-9_-]+$"


class McpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # as TenantConfig

    # The namespace of the server's tools as the model sees them.
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,23}$")
    url: str = Field(pattern=r"^https?://", max_length=500)
    transport: Literal["streamable_http"] = "streamable_http"
    # The allow-list: only these of the server's tools are listed to the model or run.
    # The pattern documents the characters `_names_fit` requires (which also bounds the
    # namespaced name's length).
    allowed_tools: list[Annotated[str, Field(json_schema_extra={"pattern": TOOL_CHARS})]] = Field(
        default_factory=list, max_length=50
    )
    # Risk class per allowed tool; a tool left out is `read`.
    risk: dict[str, ToolRisk] = Field(default_factory=dict)
    # Name of the environment variable holding the bearer token the server expects, if any.
    token_env: str | None = Field(default=None, pattern=r"^PARLEY_MCP_[A-Z0-9_]{1,40}$")
    timeout_s: float = Field(default=10.0, gt=0, le=60)

    @model_validator(mode="after")
    def _names_fit(self) -> McpServerConfig:
        for tool in self.allowed_tools:
            if not namespaced(self.name, tool):
                raise ValueError(f"tool name {tool!r} does not fit a provider's tool name")
        unknown = set(self.risk) - set(self.allowed_tools)
        if unknown:
            raise ValueError(f"risk given for tools not allowed: {sorted(unknown)}")
        return self

    def headers(self, *, tenant_id: str, user_id: str) -> dict[str, str]:
        """What the server is told about who is asking (the turn's session, the environment)."""
        headers = {TENANT_HEADER: tenant_id, USER_HEADER: user_id}
        token = os.environ.get(self.token_env) if self.token_env else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


@dataclass(frozen=True)
class McpTool:
    """One allowed tool of one configured server."""

    server: McpServerConfig
    tool: str  # the server's own name for it
    risk: ToolRisk

    @property
    def name(self) -> str:
        """The namespaced name the model sees."""
        return f"{self.server.name}{SEPARATOR}{self.tool}"


def namespaced(server: str, tool: str) -> str | None:
    """`server__tool`, or None when the result is not a name every provider accepts."""
    name = f"{server}{SEPARATOR}{tool}"
    ok = len(name) <= MAX_TOOL_NAME and all(
        c.isascii() and (c.isalnum() or c in "_-") for c in tool
    )
    return name if ok and tool else None


def is_mcp_name(name: str) -> bool:
    return SEPARATOR in name


def find_tool(servers: list[McpServerConfig] | None, name: str) -> McpTool | None:
    """The allowed tool a namespaced name stands for; None for anything not allowed."""
    server_name, sep, tool = name.partition(SEPARATOR)
    if not sep:
        return None
    for server in servers or []:
        if server.name == server_name and tool in server.allowed_tools:
            return McpTool(server, tool, server.risk.get(tool, "read"))
    return None


def model_schema(
    tool: McpTool, *, description: str, input_schema: dict[str, Any]
) -> dict[str, Any]:
    """The provider-neutral definition the model is offered for a listed, allowed tool. The
    server's description is its text, not ours: cut short and labelled with its origin."""
    text = " ".join(description.split())[:400]
    if tool.risk == "write":
        text += " Nothing happens until the customer confirms."
    parameters = {k: v for k, v in input_schema.items() if k not in ("title", "$schema")}
    for prop in parameters.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return {
        "name": tool.name,
        "description": f"[from {tool.server.name}] {text}",
        "parameters": parameters or {"type": "object", "properties": {}},
    }


def failure_text(server: str, what: str) -> str:
    """The prefixed error a failed call gives the model."""
    return f"{ERROR_PREFIX} the {server} tool server {what}; no data came back."
