"""The deployment's MCP allow-list rules (parley/egress.py), with a stand-in resolver: which
URLs a tenant's config may name, and the rule each refusal names."""

from __future__ import annotations

import pytest

from parley.config import Settings
from parley.egress import Allowlist, addresses_to_reach, check_addresses, check_redirect, check_url
from parley.errors import InvalidRequest, UrlNotAllowed

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


class Rebinding:
    """A name whose first answer is public and whose later answers are loopback: what a DNS
    name with a short TTL can do between a check and a connection."""

    def __init__(self, first: str = "93.184.216.34", later: str = "127.0.0.1") -> None:
        self.answers = [first, later]
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        return [self.answers[min(self.lookups, 2) - 1]]


async def test_the_addresses_a_connection_may_use_come_from_one_checked_lookup() -> None:
    allowed = Allowlist.parse(["*"])
    rebinding = Rebinding()
    await check_url("http://rebind.example/mcp", allowed, field="url", resolve=rebinding)
    # The connection's own lookup is the one checked: the loopback answer is refused.
    with pytest.raises(UrlNotAllowed) as refused:
        await addresses_to_reach("rebind.example", 80, allowed, field="url", resolve=rebinding)
    assert refused.value.extra["rule"] == "private_address"
    assert "127.0.0.1, a loopback address" in refused.value.message
    assert rebinding.lookups == 2
    # A public answer is handed back as the addresses to connect to.
    public = await addresses_to_reach("mcp.example.com", 443, allowed, field="url", resolve=resolve)
    assert public == ["93.184.216.34"]


async def test_a_named_host_may_be_reached_at_any_address_it_has() -> None:
    named = Allowlist.parse(["mcp.internal:443"])
    reach = await addresses_to_reach("mcp.internal", 443, named, field="url", resolve=resolve)
    assert reach == ["10.1.2.3"]
    for host, port, rule in (
        ("nowhere.internal", 443, "host_not_listed"),  # never looked up
        ("mcp.internal", 8443, "host_not_listed"),
    ):
        with pytest.raises(UrlNotAllowed) as refused:
            await addresses_to_reach(host, port, named, field="url", resolve=resolve)
        assert refused.value.extra["rule"] == rule
    # A named host whose lookup fails is unreachable (a connection error), not refused.
    gone = Allowlist.parse(["nowhere.example"])
    assert await addresses_to_reach("nowhere.example", 443, gone, field="u", resolve=resolve) == []


async def test_a_unicode_name_on_the_list_is_the_name_a_connection_uses() -> None:
    """A connection names its host in ASCII (`xn--...`): a Unicode entry (or URL) still names
    it, so the host the operator listed is not held to the stricter `*` rule."""
    listed = Allowlist.parse(["Bücher.example:443", "mcp.internal."])
    assert listed.names("xn--bcher-kva.example", 443)
    assert listed.names("bücher.example", 443)
    assert listed.names("MCP.internal", 443)
    reach = await addresses_to_reach(
        "xn--bcher-kva.example", 443, listed, field="url", resolve=unicode_dns
    )
    assert reach == ["10.9.8.7"]  # named: internal is fine
    assert await rule_for("https://bücher.example/mcp", ["bücher.example"]) is None


async def unicode_dns(host: str, port: int) -> list[str]:
    return {"xn--bcher-kva.example": ["10.9.8.7"]}[host]


def test_every_address_of_a_host_only_the_wildcard_admits_must_be_public() -> None:
    check_addresses("ok.example", ["93.184.216.34", "2606:2800:220:1::1"], field="x")
    for addresses, rule in (
        (["93.184.216.34", "169.254.169.254"], "private_address"),  # the metadata service
        (["::ffff:10.0.0.7"], "private_address"),
        ([], "unresolvable"),
    ):
        with pytest.raises(UrlNotAllowed) as refused:
            check_addresses("h.example", addresses, field="x")
        assert refused.value.extra["rule"] == rule


async def test_a_url_that_does_not_parse_is_an_invalid_request_not_a_crash() -> None:
    # Found by schemathesis on a tenant's hand-off webhook URL: a 500 before this.
    with pytest.raises(InvalidRequest, match="not a URL"):
        await check_url("http://[::1", Allowlist.parse(["*"]), field="url", resolve=resolve)
