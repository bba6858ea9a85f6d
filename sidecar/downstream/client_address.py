"""The address a request comes from, as fair share counts anonymous clients: the connection's peer, or behind
proxies the sidecar trusts (`listen.trusted_proxies`), the first address in the one header those proxies write
(`listen.forwarded_header`: `X-Forwarded-For`, or RFC 7239 `Forwarded`) that is not one of them, read from the
nearest hop back. A header from a peer that is not trusted is ignored, and so is the other header from a
trusted one (a proxy passes on what the client wrote there): anyone can write one, and a client must not pick
which queue it waits in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import web

__all__ = ["ClientAddresses"]

_MAX_ADDRESS_CHARS = 64
"""A forwarded hop that is no IP address (`unknown`, an obfuscated name) still names a client: cut to this."""

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ClientAddresses:
    """Derives each request's client address."""

    def __init__(self, trusted_proxies: Iterable[str], header: str = "x-forwarded-for") -> None:
        self._trusted: tuple[_Network, ...] = tuple(ipaddress.ip_network(net, strict=False) for net in trusted_proxies)
        self._rfc7239 = header == "forwarded"

    def of(self, request: web.Request) -> str:
        peer = request.remote or "unknown"
        if not self._trusted or not self._is_trusted(peer):
            return peer
        hops = _forwarded_hops(request) if self._rfc7239 else _x_forwarded_for_hops(request)
        for hop in reversed(hops):
            if not self._is_trusted(hop):
                return hop
        return hops[0] if hops else peer  # every hop is a trusted proxy: the farthest one is the client

    def _is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack listener sees an IPv4 proxy as ::ffff:10.0.0.1
        return any(ip in network for network in self._trusted)


def _forwarded_hops(request: web.Request) -> list[str]:
    """The addresses in RFC 7239 `Forwarded` (aiohttp parses it), client first."""
    return [_bare(value) for element in request.forwarded if (value := element.get("for"))]


def _x_forwarded_for_hops(request: web.Request) -> list[str]:
    """The addresses in `X-Forwarded-For`, client first."""
    return [
        _bare(part)
        for header in request.headers.getall("X-Forwarded-For", ())
        for part in header.split(",")
        if part.strip()
    ]


def _bare(value: str) -> str:
    """An address without its port or IPv6 brackets: `"[2001:db8::1]:4711"` -> `2001:db8::1`."""
    value = value.strip().strip('"')
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value[:_MAX_ADDRESS_CHARS]
