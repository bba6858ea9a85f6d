"""A deliberately naive aiohttp proxy: the floor a plain Python hop reaches on this machine.

    python -m bench.naive_proxy --port P --upstream http://127.0.0.1:U/mcp [--loop uvloop]

Per request it reads the body, parses it (orjson), posts it upstream with one shared aiohttp
`ClientSession` (keep-alive pool), and returns the answer's bytes. No validation, no identity, no cache,
no metrics, no streaming: what is left when the sidecar's own per-request work is taken away. The bench
measures it beside the sidecar in the same run (issue 17: its throughput is the sidecar's floor target).
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import orjson
from aiohttp import web

from bench.common import serve_until_signalled

__all__ = ["build_app", "main"]

_FORWARDED = ("Content-Type", "Accept", "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def handle_mcp(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        orjson.loads(body)  # parsed, as any proxy that looks at JSON-RPC must
    except orjson.JSONDecodeError:
        return web.Response(status=400, text="not JSON")
    headers = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
    async with request.app[SESSION].post(request.app[UPSTREAM], data=body, headers=headers) as response:
        answer = await response.read()
        return web.Response(body=answer, status=response.status, content_type=response.content_type)


async def handle_health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream

    async def session_context(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_context)
    app.router.add_post("/mcp", handle_mcp)
    app.router.add_get("/healthz", handle_health)
    return app


async def _serve(port: int, upstream: str) -> None:
    await serve_until_signalled(build_app(upstream), port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench: a deliberately naive aiohttp proxy")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(_serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
