"""Liveness and readiness endpoints."""

from __future__ import annotations

import asyncio
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
    upstream: Readiness,
    degraded: Callable[[], str | None] = lambda: None,
    moved: Callable[[], str | None] = lambda: None,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    asking: set[asyncio.Task[bool]] = set()

    async def readyz(request: web.Request) -> web.Response:
        """200 once the upstream answers (with `degraded` when Redis is lost); 503 while it does not, and at once
        while this replica's clients are `moved` to a replica that reads (the upstream is asked all the same, in
        the background, so that it learns when it reads again)."""
        why_moved = moved()
        if why_moved is not None:
            if not asking:
                task = asyncio.get_running_loop().create_task(upstream.check())
                asking.add(task)
                task.add_done_callback(asking.discard)
            return web.json_response({"status": "not ready", "upstream": upstream.url, "reason": why_moved}, status=503)
        if await upstream.check():
            body: dict[str, str] = {"status": "ready", "upstream": upstream.url}
            reason = degraded()
            if reason is not None:
                body["degraded"] = reason
            return web.json_response(body)
        reason = upstream.not_ready_reason or "upstream not reached yet"
        return web.json_response({"status": "not ready", "upstream": upstream.url, "reason": reason}, status=503)

    return readyz
