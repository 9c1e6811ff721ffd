"""HTTP connections pinned to the addresses the egress rules checked (`parley/egress.py`).

Checking a URL and then handing it to an HTTP client leaves a window: the client looks the
name up again when it connects, and a name with a short TTL can answer a public address to
the check and an internal one to the connection (DNS rebinding). Here the check and the
connection share one lookup: every TCP connect the transport makes (the first request, a
reconnect of the pool, a later request of the session) resolves the host once, applies the
allow-list's rule to what it got, and connects to those addresses, in order, by IP. TLS is
still verified against the URL's host name: httpcore2 starts TLS with the origin's host as
the server name whatever address the stream reached.

Proxies are never used, since a proxy would resolve the name itself: the pool has none, and
the client that carries the transport is built with `trust_env=False` (activities/mcp.py), so
`HTTP_PROXY` and friends are not read (nor `.netrc`). `SSL_CERT_FILE`/`SSL_CERT_DIR` still
choose the CAs, as for every other client of the deployment.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpcore2
import httpx2

from parley.egress import Allowlist, Resolver, addresses_to_reach
from parley.tls import httpx2_verified

# The pool's bounds: httpx2's defaults (`httpx2.Limits`, a client's default limits).
LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20)


class PinnedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, except that a TCP connect reaches only an address the
    allow-list admits for its host, from the one lookup it checked (`UrlNotAllowed` naming
    the rule otherwise, before any byte is sent)."""

    def __init__(self, allowed: Allowlist, *, field: str, resolve: Resolver) -> None:
        self._allowed = allowed
        self._field = field  # what a refusal names (the server's name)
        self._resolve = resolve
        self._sockets = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await addresses_to_reach(
            host.lower(), port, self._allowed, field=self._field, resolve=self._resolve
        )
        failed: Exception = httpcore2.ConnectError(f"{host} does not resolve to any address")
        for address in addresses:
            try:
                return await self._sockets.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failed = exc  # the next checked address, as a resolver's caller would
        raise failed

    async def sleep(self, seconds: float) -> None:
        await self._sockets.sleep(seconds)


def pinned_transport(
    allowed: Allowlist, *, field: str, resolve: Resolver
) -> httpx2.AsyncBaseTransport:
    """httpx2's own transport over a connection pool whose every connection is pinned.

    httpx2 offers no public way to give its transport a network backend, so its pool (the
    one attribute the transport delegates every request, stream and close to) is replaced by
    one built here. The alternative, a transport of our own around httpcore2, would repeat
    httpx2's request, response and error translation. The check below makes an httpx2 that
    no longer keeps its pool there fail loudly rather than connect unpinned;
    tests/system/test_mcp_pinning.py covers the rest (a rebinding name reaches nothing)."""
    transport = httpx2.AsyncHTTPTransport(verify=httpx2_verified())
    if not isinstance(getattr(transport, "_pool", None), httpcore2.AsyncConnectionPool):
        raise RuntimeError("httpx2's transport no longer keeps its pool in `_pool`")
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2_verified(),  # as httpx2 builds it: verified, system CAs
        max_connections=LIMITS.max_connections,
        max_keepalive_connections=LIMITS.max_keepalive_connections,
        keepalive_expiry=LIMITS.keepalive_expiry,
        network_backend=PinnedBackend(allowed, field=field, resolve=resolve),
    )
    return transport
