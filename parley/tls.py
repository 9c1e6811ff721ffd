"""The TLS settings outgoing HTTP clients verify servers with, built once per process.

httpx and httpx2 build a new `ssl.SSLContext` for every client (and every transport) made
without one, and building one parses the whole trust store: about 45 ms of CPU on a Debian
machine. Parley makes clients per MCP session, per webhook delivery, per embeddings request
and per health poll, and each paid that again. A context may be shared by any number of
clients, connections and threads once it is configured; these are never changed after they
are built. Each is what its library builds for `verify=True`, so the roots trusted (and the
`SSL_CERT_FILE` / `SSL_CERT_DIR` the libraries honour) are the same as before.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def httpx_verified() -> ssl.SSLContext:
    """httpx's default: certifi's roots, or the `SSL_CERT_FILE` / `SSL_CERT_DIR` given."""
    import httpx

    return httpx.create_ssl_context()


@functools.cache
def httpx2_verified() -> ssl.SSLContext:
    """httpx2's default (the MCP SDK's and the webhooks' client): the system's roots."""
    import httpx2

    return httpx2.create_ssl_context()
