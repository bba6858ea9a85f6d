"""A fast, minimal 2026-07-28 upstream: one aiohttp handler answering JSON-RPC with precomputed shapes.

    python -m bench.fast_upstream --port P

It answers `server/discover`, `resources/read` (any URI; `resultType: complete`, `ttlMs: 0`,
`cacheScope: public`), `resources/list`, `resources/templates/list`, `tools/list` and
`tools/call` (tool `bump` with `{"uri": ...}` changes that resource). It is the baseline "direct"
target of the forwarding scenario and the upstream of the scenarios that need many cheap polls.

Admin routes: `GET /admin/health`, `GET /admin/stats` (reads in total), `POST /admin/bump {"uri"}`.
`--read-delay-ms N` makes every read take N ms (a slow upstream, for the fair-share tests and bench).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson
from aiohttp import web

from bench.common import serve_until_signalled

__all__ = ["build_app", "main"]

VERSION = "2026-07-28"
TEMPLATE = "bench://items/{id}"

_DISCOVER: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": [VERSION],
    "capabilities": {"resources": {}, "tools": {}},
    "ttlMs": 0,
    "cacheScope": "public",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "bench-fast-upstream", "version": "0"}},
}
_LIST: dict[str, Any] = {
    "resultType": "complete",
    "resources": [{"uri": "bench://items/0", "name": "item-0", "mimeType": "text/plain"}],
    "ttlMs": 0,
    "cacheScope": "public",
}
_TEMPLATES: dict[str, Any] = {
    "resultType": "complete",
    "resourceTemplates": [{"uriTemplate": TEMPLATE, "name": "items", "mimeType": "text/plain"}],
    "ttlMs": 0,
    "cacheScope": "public",
}
_TOOLS: dict[str, Any] = {
    "resultType": "complete",
    "tools": [
        {
            "name": "bump",
            "description": "change a resource",
            "inputSchema": {"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]},
        }
    ],
    "ttlMs": 0,
    "cacheScope": "public",
}


class State:
    def __init__(self, read_delay_s: float = 0.0) -> None:
        self.reads = 0
        self.versions: dict[str, int] = {}
        self.read_delay_s = read_delay_s


STATE = web.AppKey("state", State)


def _answer(request_id: Any, result: dict[str, Any]) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return web.Response(body=body, content_type="application/json")


def _error(request_id: Any, code: int, message: str) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
    return web.Response(body=body, content_type="application/json")


async def handle_mcp(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        message = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _error(None, -32700, "Parse error")
    if not isinstance(message, dict):
        return _error(None, -32600, "Invalid Request")
    request_id = message.get("id")
    method = message.get("method")
    raw_params = message.get("params")
    params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    if "id" not in message:
        return web.Response(status=202)
    if method == "resources/read":
        uri = params.get("uri")
        if not isinstance(uri, str):
            return _error(request_id, -32602, "uri required")
        state.reads += 1
        if state.read_delay_s:
            await asyncio.sleep(state.read_delay_s)
        text = f"{uri} v{state.versions.get(uri, 0)}"
        result = {
            "resultType": "complete",
            "contents": [{"uri": uri, "mimeType": "text/plain", "text": text}],
            "ttlMs": 0,
            "cacheScope": "public",
        }
        return _answer(request_id, result)
    if method == "server/discover":
        return _answer(request_id, _DISCOVER)
    if method == "resources/list":
        return _answer(request_id, _LIST)
    if method == "resources/templates/list":
        return _answer(request_id, _TEMPLATES)
    if method == "tools/list":
        return _answer(request_id, _TOOLS)
    if method == "tools/call" and params.get("name") == "bump":
        uri = str((params.get("arguments") or {}).get("uri", ""))
        state.versions[uri] = state.versions.get(uri, 0) + 1
        content = [{"type": "text", "text": f"{uri} v{state.versions[uri]}"}]
        return _answer(request_id, {"resultType": "complete", "content": content, "isError": False})
    return _error(request_id, -32601, "Method not found")


async def handle_health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def handle_stats(request: web.Request) -> web.Response:
    return web.json_response({"reads": request.app[STATE].reads})


async def handle_bump(request: web.Request) -> web.Response:
    state = request.app[STATE]
    uri = str((await request.json())["uri"])
    state.versions[uri] = state.versions.get(uri, 0) + 1
    return web.json_response({"uri": uri, "version": state.versions[uri]})


def build_app(read_delay_s: float = 0.0) -> web.Application:
    app = web.Application()
    app[STATE] = State(read_delay_s)
    app.router.add_post("/mcp", handle_mcp)
    app.router.add_get("/admin/health", handle_health)
    app.router.add_get("/admin/stats", handle_stats)
    app.router.add_post("/admin/bump", handle_bump)
    return app


async def _serve(port: int, read_delay_s: float) -> None:
    await serve_until_signalled(build_app(read_delay_s), port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench: a fast minimal 2026-07-28 upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--read-delay-ms", type=float, default=0.0, help="every read takes this long")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.read_delay_ms / 1000))


if __name__ == "__main__":
    main()
