"""The address a request comes from, as fair share counts anonymous clients: the connection's peer, or behind
proxies the sidecar trusts (`listen.trusted_proxies`), the first address in `Forwarded` / `X-Forwarded-For`
that is not one of them, read from the nearest hop back. A header from a peer that is not trusted is ignored:
anyone can write one, and a client must not pick which queue it waits in.
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

    def __init__(self, trusted_proxies: Iterable[str]) -> None:
        self._trusted: tuple[_Network, ...] = tuple(ipaddress.ip_network(net, strict=False) for net in trusted_proxies)

    def of(self, request: web.Request) -> str:
        peer = request.remote or "unknown"
        if not self._trusted or not self._is_trusted(peer):
            return peer
        hops = _forwarded_hops(request)
        for hop in reversed(hops):
            if not self._is_trusted(hop):
                return hop
        return hops[0] if hops else peer  # every hop is a trusted proxy: the farthest one is the client

    def _is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._trusted)


def _forwarded_hops(request: web.Request) -> list[str]:
    """The addresses a request passed through, client first: RFC 7239 `Forwarded` when present (aiohttp parses
    it), else `X-Forwarded-For`."""
    hops = [_bare(value) for element in request.forwarded if (value := element.get("for"))]
    if hops:
        return hops
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
