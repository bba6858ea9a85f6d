"""A real upstream on the official SDK: `MCPServer(subscriptions=False)` over uvicorn, as tests/peers/shop_server.py.

    python -m bench.sdk_upstream --port P [--read-ttl-ms 1000]

Resources `bench://values/{name}` (text `name=<value>`, `cacheScope: public`, `ttlMs` = --read-ttl-ms);
tool `set_value(name, value)` changes one through MCP. Admin routes on the same port:
`POST /admin/set {"name", "value"}` (an out-of-band change), `GET /admin/stats?uri=U` (reads of U with
their monotonic times, and reads in total), `GET /admin/health`.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["build_app", "main"]

_TIMES_KEPT = 4096


class _State:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.reads_total = 0
        self.reads: collections.Counter[str] = collections.Counter()
        self.times: dict[str, collections.deque[float]] = {}

    def record_read(self, uri: str) -> None:
        self.reads_total += 1
        self.reads[uri] += 1
        self.times.setdefault(uri, collections.deque(maxlen=_TIMES_KEPT)).append(time.monotonic())


class _Front:
    """/admin/* to the admin router, everything else to the SDK's streamable HTTP app."""

    def __init__(self, app: ASGIApp, admin: ASGIApp) -> None:
        self.app = app
        self.admin = admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/admin/"):
            await self.admin(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def build_app(read_ttl_ms: int) -> ASGIApp:
    state = _State()

    async def count_reads(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "resources/read":
            state.record_read(str((ctx.params or {}).get("uri", "")))
        return await call_next(ctx)

    list_hint = CacheHint(ttl_ms=read_ttl_ms, scope="public")
    mcp = MCPServer(
        "bench-sdk-upstream",
        version="0.1.0",
        subscriptions=False,
        cache_hints={
            "resources/read": CacheHint(ttl_ms=read_ttl_ms, scope="public"),
            "resources/list": list_hint,
            "resources/templates/list": list_hint,
            "tools/list": list_hint,
            "prompts/list": list_hint,
        },
        middleware=[count_reads],
    )

    @mcp.resource("bench://values/{name}", mime_type="text/plain")
    def value(name: str) -> str:
        return f"{name}={state.values.get(name, 0)}"

    @mcp.tool()
    def set_value(name: str, value: int) -> str:
        state.values[name] = value
        return f"{name}={value}"

    async def admin_set(request: Request) -> Response:
        body = await request.json()
        state.values[str(body["name"])] = int(body["value"])
        return JSONResponse({"ok": True})

    async def admin_stats(request: Request) -> Response:
        uri = request.query_params.get("uri", "")
        times = list(state.times.get(uri, ()))
        return JSONResponse({"reads_total": state.reads_total, "reads": state.reads[uri], "times": times})

    async def admin_health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    admin = Router(
        routes=[
            Route("/admin/set", admin_set, methods=["POST"]),
            Route("/admin/stats", admin_stats, methods=["GET"]),
            Route("/admin/health", admin_health, methods=["GET"]),
        ]
    )
    return _Front(mcp.streamable_http_app(), admin)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench: an SDK MCPServer upstream without subscriptions")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--read-ttl-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    config = uvicorn.Config(
        build_app(args.read_ttl_ms),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=1,
        backlog=4096,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
