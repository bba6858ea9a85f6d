"""A stdio MCP server on the official SDK (mcp 2.3) whose resource is a file, as legacy servers often are.

    python -m tests.peers.stdio_notes_server --file PATH [--read-ttl-ms N] [--write-lag-ms N] [--announce]

Started by the sidecar as `upstream.command`; it speaks 2026-07-28 or 2025-11-25, whichever its first
message asks for (the SDK's dual-era stdio server), and has no `subscriptions/listen`
(`subscriptions=False`): the sidecar synthesises every notification.

Resources: `notes://current` (text/plain: the file's content, read on every request; `cacheScope:
public`, `ttlMs` --read-ttl-ms at 2026-07-28). Tools: `write_note(text)` writes the file;
`add_tool(name)` registers a tool (a tools list change); `server_pid()` answers the process id (tests
kill it); `slow(steps)` reports progress `steps` times before answering. Prompt: `summarize(topic)`.
The test changes the file behind the server's back (out of band) or through `write_note`.

`--write-lag-ms N`: `write_note` answers at once and its write shows in reads N ms later, as a server that
re-indexes after a save does. `--announce`: once a write of `write_note` shows, the server sends
`notifications/resources/updated` for the note on its own, without declaring `resources.subscribe` (as the
reference SQLite server does).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer

__all__ = ["NOTE_URI", "build_server", "main"]

NOTE_URI = "notes://current"


def build_server(path: Path, read_ttl_ms: int = 1000, *, write_lag_ms: int = 0, announce: bool = False) -> MCPServer:
    hint = CacheHint(ttl_ms=read_ttl_ms, scope="public")
    mcp = MCPServer(
        "stdio-notes",
        version="0.1.0",
        subscriptions=False,
        warn_on_duplicate_tools=False,
        cache_hints={
            "resources/read": hint,
            "resources/list": hint,
            "resources/templates/list": hint,
            "tools/list": hint,
            "prompts/list": hint,
        },
    )

    @mcp.resource(NOTE_URI, mime_type="text/plain", description="the note file, as it is now")
    def note() -> str:
        return path.read_text(encoding="utf-8")

    pending: set[asyncio.Task[None]] = set()

    def write(text: str) -> None:
        path.write_text(text, encoding="utf-8")  # a few bytes: the loop is not held up

    async def save(text: str, ctx: Context) -> None:
        await asyncio.sleep(write_lag_ms / 1000)
        write(text)
        if announce:
            await ctx.session.send_resource_updated(NOTE_URI)

    @mcp.tool()
    async def write_note(text: str, ctx: Context) -> str:
        if not write_lag_ms:
            await save(text, ctx)
        else:  # shown later: the answer does not wait for it
            task = asyncio.get_running_loop().create_task(save(text, ctx))
            pending.add(task)
            task.add_done_callback(pending.discard)
        return f"wrote {len(text)} characters"

    @mcp.tool()
    def add_tool(name: str) -> str:
        def added() -> str:
            return f"tool {name}"

        mcp.add_tool(added, name=name, description=f"added tool {name}")
        return f"added tool {name}"

    @mcp.tool()
    def server_pid() -> int:
        return os.getpid()

    @mcp.tool()
    async def slow(steps: int, ctx: Context) -> str:
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}")
        return f"done after {steps} steps"

    @mcp.prompt()
    def summarize(topic: str) -> str:
        return f"Summarize the notes about {topic}."

    return mcp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="tests: an SDK stdio server whose resource is a file")
    parser.add_argument("--file", type=Path, required=True)
    parser.add_argument("--read-ttl-ms", type=int, default=1000)
    parser.add_argument("--write-lag-ms", type=int, default=0, help="a write_note shows in reads this much later")
    parser.add_argument("--announce", action="store_true", help="send resources/updated once a write shows")
    args = parser.parse_args(argv)
    build_server(args.file, args.read_ttl_ms, write_lag_ms=args.write_lag_ms, announce=args.announce).run("stdio")


if __name__ == "__main__":
    main()
