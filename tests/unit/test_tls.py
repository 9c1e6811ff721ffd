"""Outgoing HTTP clients share one verified TLS context per library (parley/tls.py): a
client made per MCP session, webhook delivery or health poll no longer reads the whole trust
store again (about 45 ms of CPU each), and verification stays as each library sets it."""

from __future__ import annotations

import ast
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.egress import Allowlist
from parley.gateway.pinned import pinned_transport
from parley.jwks import KeySets
from parley.tls import httpx2_verified, httpx_verified
from tests.support.layout import REPO, product_files


@pytest.fixture
def trust_store_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every read of a trust store from here on (`load_verify_locations`), and contexts built
    afresh: the cached ones are dropped first, so the first use builds each once."""
    httpx_verified.cache_clear()
    httpx2_verified.cache_clear()
    reads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        reads.append(args or kwargs)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    yield reads


def test_each_context_verifies_servers_by_name() -> None:
    for context in (httpx_verified(), httpx2_verified()):
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname


async def test_many_pinned_transports_and_key_sets_read_the_trust_store_once_each(
    trust_store_reads: list[object],
) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return []

    allowed = Allowlist.parse([])
    transports = [pinned_transport(allowed, field="test", resolve=resolve) for _ in range(5)]
    key_sets = [KeySets() for _ in range(5)]
    try:
        assert len(trust_store_reads) <= 2, trust_store_reads  # one per library, at most
        pools = {id(t._pool._ssl_context) for t in transports}  # type: ignore[attr-defined]
        assert pools == {id(httpx2_verified())}
    finally:
        for sets in key_sets:
            await sets.aclose()
        for transport in transports:
            await transport.aclose()


# What makes an HTTP client (or sends through a throwaway one) in httpx and httpx2.
CLIENT_MAKERS = {"Client", "AsyncClient", "HTTPTransport", "AsyncHTTPTransport"}
ONE_SHOT = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}


def _unshared_clients(path: Path) -> list[str]:
    """The calls in `path` that make an httpx or httpx2 client with neither a context
    (`verify=`) nor a transport of its own (`transport=`): each would read the trust store."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if not (isinstance(owner, ast.Name) and owner.id in ("httpx", "httpx2")):
            continue
        if node.func.attr not in CLIENT_MAKERS | ONE_SHOT:
            continue
        given = {keyword.arg for keyword in node.keywords}
        if not given & {"verify", "transport"}:
            found.append(f"{path.relative_to(REPO)}:{node.lineno} {owner.id}.{node.func.attr}")
    return found


def test_every_client_the_product_makes_shares_the_verified_context() -> None:
    unshared = [call for path in product_files() for call in _unshared_clients(path)]
    assert unshared == [], "pass verify=httpx_verified() (or httpx2_verified()): " + str(unshared)
