"""A minimal real MCP upstream on the SDK's lowlevel ``Server``: resources and tools, no prompts at all.

    python -m tests.peers.bare_server --port P --era modern|legacy [--read-ttl-ms N] [--list-ttl-ms N]

Only ``on_list_resources``, ``on_read_resource``, ``on_list_tools`` and ``on_call_tool`` are
registered, so ``server/discover`` (and ``initialize``) advertise ``resources`` and ``tools`` but
no ``prompts``: the upstream a listen asking for ``promptsListChanged`` cannot be honoured for.

Resources (text/plain, ``cacheScope: public``): ``bare://note``. Tools: ``echo(text)``. Unknown
URIs get -32602. The same ASGI front as the shop server (request log, optional legacy-era guard)
and a subset of its admin routes: ``GET /admin/log``, ``POST /admin/reset-log``, ``GET /admin/health``.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from starlette.routing import Router
from starlette.types import ASGIApp

from tests.peers.front import AdminLog, Front, log_routes, peer_parser, serve

__all__ = ["NOTE_URI", "build_app", "main"]

NOTE_URI = "bare://note"


def build_app(era: str, *, read_ttl_ms: int = 1000, list_ttl_ms: int = 1000) -> ASGIApp:
    """Build the bare server for ``era`` ("modern" or "legacy") as one ASGI app."""
    if era not in ("modern", "legacy"):
        raise ValueError(f"era must be 'modern' or 'legacy', got {era!r}")
    log = AdminLog()

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[types.Resource(name="note", uri=NOTE_URI, mime_type="text/plain")],
            ttl_ms=list_ttl_ms,
            cache_scope="public",
        )

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if str(params.uri) != NOTE_URI:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown resource: {params.uri}")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=NOTE_URI, mime_type="text/plain", text="a bare note")],
            ttl_ms=read_ttl_ms,
            cache_scope="public",
        )

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return types.ListToolsResult(
            tools=[types.Tool(name="echo", description="echo the text", input_schema=schema)],
            ttl_ms=list_ttl_ms,
            cache_scope="public",
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != "echo":
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server: Server[Any] = Server(
        f"bare-{era}",
        version="0.1.0",
        cache_hints={"resources/read": CacheHint(ttl_ms=read_ttl_ms, scope="public")},
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

    admin = Router(
        routes=[
            *log_routes(log, {"ok": True, "era": era}),
        ]
    )
    return Front(server.streamable_http_app(), admin, log, legacy=era == "legacy")


def main(argv: list[str] | None = None) -> None:
    args = peer_parser(__doc__).parse_args(argv)
    app = build_app(args.era, read_ttl_ms=args.read_ttl_ms, list_ttl_ms=args.list_ttl_ms)
    serve(app, args.port)


if __name__ == "__main__":
    main()
