"""The deployment's MCP allow-list rules (parley/egress.py), with a stand-in resolver: which
URLs a tenant's config may name, and the rule each refusal names."""

from __future__ import annotations

import pytest

from parley.config import Settings
from parley.egress import Allowlist, check_redirect, check_url
from parley.errors import UrlNotAllowed

DNS = {
    "mcp.example.com": ["93.184.216.34"],
    # One public address and one internal one: the internal one is enough to refuse.
    "split.example.com": ["93.184.216.35", "10.0.0.7"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
    "mcp.internal": ["10.1.2.3"],
}


async def resolve(host: str, port: int) -> list[str]:
    if host in DNS:
        return DNS[host]
    if host[0].isdigit() or ":" in host:
        return [host]  # an address resolves to itself
    raise OSError("no such name")


async def rule_for(url: str, entries: list[str]) -> str | None:
    try:
        await check_url(url, Allowlist.parse(entries), field="url", resolve=resolve)
    except UrlNotAllowed as exc:
        assert exc.extra["field"] == "url" and exc.extra["rule"] in exc.message
        return str(exc.extra["rule"])
    return None


@pytest.mark.parametrize(
    ("url", "entries", "rule"),
    [
        ("https://mcp.example.com/mcp", ["*"], None),
        ("https://mcp.example.com/mcp", ["*:443"], None),
        ("http://mcp.example.com:8080/mcp", ["*:443"], "host_not_listed"),
        ("https://mcp.example.com/mcp", ["mcp.internal:443"], "host_not_listed"),
        ("https://split.example.com/mcp", ["*"], "private_address"),
        ("https://mapped.example.com/mcp", ["*"], "private_address"),
        ("http://[::1]:8100/mcp", ["*"], "private_address"),
        ("http://100.64.0.1/mcp", ["*"], "private_address"),  # carrier-grade NAT
        ("http://0.0.0.0:8100/mcp", ["*"], "private_address"),
        ("https://nowhere.example/mcp", ["*"], "unresolvable"),
        # A host the deployment names is reached wherever it is.
        ("https://mcp.internal/mcp", ["mcp.internal:443"], None),
        ("http://mcp.internal:9000/mcp", ["mcp.internal"], None),
        ("http://127.0.0.1:8100/mcp", ["127.0.0.1:8100"], None),
        ("http://127.0.0.1:8101/mcp", ["127.0.0.1:8100"], "host_not_listed"),
        ("http://127.0.0.1:8101/mcp", ["127.0.0.1:8100", "*"], "private_address"),
        ("http://[::1]:8100/mcp", ["[::1]:8100"], None),
    ],
)
async def test_the_allow_list_names_the_rule_that_refuses(
    url: str, entries: list[str], rule: str | None
) -> None:
    assert await rule_for(url, entries) == rule


def test_a_redirect_may_not_leave_the_origin() -> None:
    check_redirect("http://127.0.0.1:8100/mcp", "http://127.0.0.1:8100/mcp/", field="x")
    for elsewhere in (
        "http://127.0.0.1:8101/mcp",
        "https://127.0.0.1:8100/mcp",
        "http://evil.example/mcp",
    ):
        with pytest.raises(UrlNotAllowed) as refused:
            check_redirect("http://127.0.0.1:8100/mcp", elsewhere, field="x")
        assert refused.value.extra["rule"] == "redirect_off_origin"


def test_a_bad_entry_is_refused_when_the_deployment_starts() -> None:
    with pytest.raises(ValueError, match="bad port"):
        Settings(database_url="postgresql://unused", mcp_allowed_hosts=["mcp.internal:https"])
