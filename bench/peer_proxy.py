"""The Python peer proxy baseline: FastMCP's proxy (`fastmcp.server.create_proxy`) in front of an upstream.

Usage: ``python -m bench.peer_proxy --port P --upstream http://127.0.0.1:U/mcp [--reuse-session]``

By default FastMCP opens a fresh backend client for every request (its documented, context-safe default).
With ``--reuse-session`` the proxy is given one connected ``Client`` that every request shares (FastMCP warns
that this may mix request contexts); it is the fastest way the peer can forward.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

__all__ = ["main"]


async def _serve(port: int, upstream: str, reuse: bool) -> None:
    from fastmcp import Client
    from fastmcp.server import create_proxy

    async def run(target: str | Client[Any]) -> None:
        proxy = create_proxy(target, name="bench-peer-proxy")
        await proxy.run_http_async(
            show_banner=False, transport="http", host="127.0.0.1", port=port, path="/mcp", log_level="warning"
        )

    if not reuse:
        await run(upstream)
        return
    async with Client(upstream, mode="2026-07-28") as client:
        await run(client)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bench: FastMCP proxy in front of an upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--reuse-session", action="store_true", help="share one connected backend client")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.upstream, args.reuse_session))


if __name__ == "__main__":
    main()
