"""Liveness and readiness endpoints."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from sidecar.upstream.client import UpstreamClient

__all__ = ["healthz", "make_readyz"]


async def healthz(request: web.Request) -> web.Response:
    """200 while the process serves requests."""
    return web.json_response({"status": "ok"})


def make_readyz(upstream: UpstreamClient) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def readyz(request: web.Request) -> web.Response:
        """200 once the upstream answers; 503 with the reason while it does not."""
        if await upstream.check():
            return web.json_response({"status": "ready", "upstream": upstream.url})
        reason = upstream.last_error or "upstream not reached yet"
        return web.json_response({"status": "not ready", "upstream": upstream.url, "reason": reason}, status=503)

    return readyz
