"""The system's DNS resolver, as `parley.egress` asks it: the domain decides which addresses
may be reached, this module only looks them up."""

from __future__ import annotations

import asyncio
import socket


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives `host`, each once, in the order it prefers
    them (the order a pinned connection tries them in: gateway/pinned.py)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
