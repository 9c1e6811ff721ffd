"""Outgoing HTTP clients share one verified TLS context per library (parley/tls.py): a
client made per MCP session, webhook delivery or health poll no longer reads the whole trust
store again (about 45 ms of CPU each), and verification stays as each library sets it."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from parley.egress import Allowlist
from parley.gateway.pinned import pinned_transport
from parley.jwks import KeySets
from parley.tls import httpx2_verified, httpx_verified


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
