"""Where a tenant's configuration may send the deployment's requests: the allow-list of MCP
server addresses (`Settings.mcp_allowed_hosts`), checked when a tenant's config is saved
(api/routes/admin.py) and again on every TCP connection a turn's MCP session opens
(gateway/pinned.py), so a DNS name that moved to an internal address since the save is still
refused. The connection goes to an address this check passed, never to a second lookup's
answer: a name that answers a public address to the check and an internal one a moment later
(DNS rebinding) gets no connection at all.

An entry is `host:port`, `host` (any port), `*:port` or `*` (any host, any port). A host an
entry names is reached at whatever address it has: the operator listed it. A host only a `*`
entry covers must resolve to public addresses only, every one of them: loopback, private,
link-local, shared, reserved, multicast and unspecified ranges are refused, so a tenant
cannot point the worker at the metadata service, the database or a neighbour's admin port.
A redirect is never followed off the URL's origin (scheme, host, port).

Each refusal names its rule, the same words at save time (a 422) and at turn time (the
turn's `warning`).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NoReturn
from urllib.parse import urlsplit

from parley.errors import InvalidRequest, UrlNotAllowed

Rule = Literal["host_not_listed", "private_address", "unresolvable", "redirect_off_origin"]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Looks a host up: its addresses (a name resolves to one or more; an IP literal is itself).
Resolver = Callable[[str, int], Awaitable[list[str]]]

ANY = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}
# How long a lookup may take before the host counts as unresolvable.
RESOLVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # lower case, IPv6 without brackets
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port = parts.port or DEFAULT_PORTS.get(scheme, 0)
        except ValueError:  # a port that is no number
            port = 0
        return cls(scheme, host_key(parts.hostname or ""), port)


@dataclass(frozen=True)
class Allowlist:
    """The parsed `mcp_allowed_hosts`: hosts named (with their ports, None for any) and the
    ports any public host may use (None for any)."""

    named: frozenset[tuple[str, int | None]]
    public_ports: frozenset[int | None]

    @classmethod
    def parse(cls, entries: Sequence[str]) -> Allowlist:
        named: set[tuple[str, int | None]] = set()
        public: set[int | None] = set()
        for entry in entries:
            host, port = _split(entry.strip())
            if host == ANY:
                public.add(port)
            else:
                named.add((host, port))
        return cls(frozenset(named), frozenset(public))

    def names(self, host: str, port: int) -> bool:
        key = host_key(host)
        return bool({(key, port), (key, None)} & self.named)

    def admits_public(self, port: int) -> bool:
        return bool({port, None} & self.public_ports)


def _split(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, `host`, `*`, `*:port` -> (host, port or None)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:  # a bare name, `*`, or a bare IPv6 address
        host, port = entry, ""
    key = host if host == ANY else host_key(host)
    if port in ("", ANY):
        return key, None
    if not port.isdigit():
        raise ValueError(f"an MCP allow-list entry has a bad port: {entry!r}")
    return key, int(port)


def host_key(host: str) -> str:
    """The form hosts are compared in: lower case, ASCII (a Unicode name in its `xn--` form,
    as a connection names it), no root dot. A name IDNA cannot encode is kept lower-cased; it
    then names no allow-list entry but its own, so it gets the stricter `*` rule."""
    name = host.lower().rstrip(".")
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return name


def address_kind(address: str) -> str | None:
    """What makes an address internal ("loopback", "private", …), or None when it is public."""
    ip: IpAddress = ipaddress.ip_address(address.split("%", 1)[0])  # no IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "reserved"


async def check_url(url: str, allowed: Allowlist, *, field: str, resolve: Resolver) -> None:
    """Raise `UrlNotAllowed` naming the rule when `url` may not be reached; `resolve` gives a
    host's addresses (the caller's I/O: `gateway/resolver.py` asks the system's resolver). A
    host the allow-list names is not looked up: it may be reached wherever it is. A URL that
    does not parse (an unclosed IPv6 bracket) is `InvalidRequest` naming the field."""
    try:
        origin = Origin.of(url)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: not a URL ({exc})", field=field) from exc
    if not allowed.names(origin.host, origin.port):
        await addresses_to_reach(origin.host, origin.port, allowed, field=field, resolve=resolve)


async def addresses_to_reach(
    host: str, port: int, allowed: Allowlist, *, field: str, resolve: Resolver
) -> list[str]:
    """The addresses a connection to `host:port` may use, looked up once: any a host the
    allow-list names has (none when its lookup failed: the host is unreachable, not refused),
    public ones only of a host only `*` admits (`UrlNotAllowed` naming the rule otherwise).
    Connect to these, never to another lookup's answer."""
    named = allowed.names(host, port)
    if not named and (not host or not allowed.admits_public(port)):
        refuse("host_not_listed", f"{host}:{port} is not on the deployment's MCP allow-list", field)
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            addresses = await resolve(host, port)
    except (OSError, TimeoutError, UnicodeError):
        addresses = []
    if not named:
        check_addresses(host, addresses, field=field)
    return addresses


def check_addresses(host: str, addresses: Sequence[str], *, field: str) -> None:
    """The rule for what a host only `*` admits resolved to: at least one address, and every
    one of them public."""
    if not addresses:
        refuse("unresolvable", f"{host} does not resolve to any address", field)
    for address in addresses:
        kind = address_kind(address)
        if kind is not None:
            refuse(
                "private_address",
                f"{host} resolves to {address}, a {kind} address; only a host the "
                "deployment's MCP allow-list names may be internal",
                field,
            )


def check_redirect(url: str, location: str, *, field: str) -> None:
    """A redirect may stay on the URL's origin only."""
    if Origin.of(location) != Origin.of(url):
        refuse(
            "redirect_off_origin", f"a redirect to {Origin.of(location).host} was refused", field
        )


def refuse(rule: Rule, message: str, field: str) -> NoReturn:
    raise UrlNotAllowed(f"{field}: {message} (rule {rule})", field=field, rule=rule)
