"""Request guards that run before the body is read: DNS-rebinding (Host, Origin) and the body size limit."""

from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from sidecar.config import ListenConfig
from sidecar.protocol import InvalidRequest, PayloadTooLarge, RequestTimeout, RpcError

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
    """Refuse requests a browser could be tricked into sending (protocol.md §8: Origin 403; Host 421), and
    malformed Host or Origin headers (400)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin not in config.allowed_origins:
        try:
            origin_host = urlsplit(origin).hostname or ""
        except ValueError:  # "http://[": not a URL at all
            return InvalidRequest("malformed Origin header", http_status=400)
        if not (is_loopback(config.host) and is_loopback(origin_host)):
            return InvalidRequest(f"Origin {origin!r} is not allowed", http_status=403)
    if is_loopback(config.host):
        try:
            host = _hostname(request.headers.get("Host", ""))
        except ValueError:  # "[": no host at all
            return InvalidRequest("malformed Host header", http_status=400)
        if not is_loopback(host):
            return InvalidRequest("Host header is not a loopback name", http_status=421)
    return None


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, refusing with 413 as soon as it is known to exceed `limit` (before it is all read), and
    with 408 when it has not all arrived within `timeout_s`."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await request.content.read(_READ_CHUNK)
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body larger than {limit} bytes")
                chunks.append(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from exc
