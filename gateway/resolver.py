"""The system's DNS resolver, as `parley.egress.check_url` asks it: the domain decides which
addresses may be reached, this module only looks them up."""

from __future__ import annotations

import asyncio
import socket


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives `host` (what the connection would use)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})
