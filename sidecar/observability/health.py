"""Liveness and readiness endpoints: the same answer on both listeners, the reasons on the admin one only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

__all__ = ["Readiness", "healthz", "make_readyz"]


class Readiness(Protocol):
    """What readiness asks of the upstream (a narrow view: observability never reaches up into the parts)."""

    @property
    def url(self) -> str: ...

    @property
    def not_ready_reason(self) -> str | None: ...

    async def check(self) -> bool: ...


async def healthz(request: web.Request) -> web.Response:
    """200 while the process serves requests."""
    return web.json_response({"status": "ok"})


def make_readyz(
    upstream: Readiness, degraded: Callable[[], str | None] = lambda: None, *, detail: bool
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """`GET /readyz`. With `detail` (the admin listener): the upstream as it may be shown, why it is not ready, and
    whether Redis is lost. Without (the client listener): ready or not, and nothing about the upstream, which
    anyone who can reach the MCP port could read."""

    async def readyz(request: web.Request) -> web.Response:
        """200 once the upstream answers (with `degraded` when Redis is lost); 503 while it does not."""
        ready = await upstream.check()
        body: dict[str, str] = {"status": "ready" if ready else "not ready"}
        if detail:
            body["upstream"] = upstream.url
            if ready:
                if (reason := degraded()) is not None:
                    body["degraded"] = reason
            else:
                body["reason"] = upstream.not_ready_reason or "upstream not reached yet"
        return web.json_response(body, status=200 if ready else 503)

    return readyz
