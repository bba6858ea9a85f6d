"""Request guards that run before the body is read: DNS-rebinding (Host, Origin) and the body size limit."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from sidecar.config import ListenConfig
from sidecar.protocol.errors import InvalidRequest, PayloadTooLarge, RpcError

__all__ = ["check_host_and_origin", "is_loopback", "read_body"]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_READ_CHUNK = 65536


def is_loopback(host: str) -> bool:
    """True for localhost names and loopback addresses."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _hostname(value: str) -> str:
    # "host:port", "[::1]:port", or a bare name; urlsplit does the bracket handling for us.
    return urlsplit(f"//{value}").hostname or ""


def check_host_and_origin(request: web.Request, config: ListenConfig) -> RpcError | None:
    """Refuse requests a browser could be tricked into sending (protocol.md §8: Origin 403; Host 421)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin not in config.allowed_origins:
        local_server = is_loopback(config.host)
        if not (local_server and is_loopback(urlsplit(origin).hostname or "")):
            return InvalidRequest(f"Origin {origin!r} is not allowed", http_status=403)
    if is_loopback(config.host):
        host = request.headers.get("Host", "")
        if not is_loopback(_hostname(host)):
            return InvalidRequest("Host header is not a loopback name", http_status=421)
    return None


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refusing with 413 as soon as it is known to exceed `limit` (before it is all read)."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body larger than {limit} bytes")
        chunks.append(chunk)
