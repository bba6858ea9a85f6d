"""Liveness and readiness endpoints: the same answer on both listeners, the reasons on the admin one only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

__all__ = ["Readiness", "add_probes", "healthz", "make_readyz"]


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
    *,
    detail: bool,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """`GET /readyz`. With `detail` (the admin listener): the upstream as it may be shown, why it is not ready, and
    whether Redis is lost. Without (the client listener): ready or not, and nothing about the upstream, which
    anyone who can reach the MCP port could read."""
    asking: set[asyncio.Task[bool]] = set()

    def answer(ready: bool, reason: str | None = None, degraded_reason: str | None = None) -> web.Response:
        body: dict[str, str] = {"status": "ready" if ready else "not ready"}
        if detail:
            body["upstream"] = upstream.url
            if reason is not None:
                body["reason"] = reason
            if degraded_reason is not None:
                body["degraded"] = degraded_reason
        return web.json_response(body, status=200 if ready else 503)

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
            return answer(False, why_moved)
        if await upstream.check():
            return answer(True, degraded_reason=degraded())
        return answer(False, upstream.not_ready_reason or "upstream not reached yet")

    return readyz


def add_probes(
    router: web.UrlDispatcher,
    upstream: Readiness,
    degraded: Callable[[], str | None],
    moved: Callable[[], str | None],
    *,
    detail: bool,
) -> None:
    """`/healthz` and `/readyz` on a listener (`detail`: with the reasons, see `make_readyz`)."""
    router.add_get("/healthz", healthz)
    router.add_get("/readyz", make_readyz(upstream, degraded, moved, detail=detail))
