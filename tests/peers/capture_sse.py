"""Capture the SSE bytes third-party servers really send, as fixtures for the upstream SSE parser's tests.

    python -m tests.peers.capture_sse tests/unit/upstream/sse_fixtures [--get-window-s 17]

Starts server-everything (streamable HTTP) and the FastMCP 1.x server with and without an EventStore (see
`tests.peers.thirdparty`; needs `bash .ci/install-peers`), runs one 2025-11-25 session against each with raw
aiohttp requests, and writes each SSE response body exactly as it arrived (after HTTP chunking is undone, before
any decoding) to `<server>-<version>_<exchange>.sse`. Exchanges: `initialize`, `ping`, for server-everything
`resources-subscribe` (a POST answer that carries a log notification before its result), and the session's
`get-stream` (read for `--get-window-s` seconds while the server sends on it: server-everything its simulated
`resources/updated` every 5 s, FastMCP a `resources/list_changed`, then its keep-alive comment after 15 s).
FastMCP runs three ways: with an EventStore, with one and `--retry-ms 3000`, and without one.
Prints each response's status and headers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.peers.thirdparty import (
    EVERYTHING_VERSION,
    MCP1_VERSION,
    ThirdPartyServer,
    missing,
    start_everything,
    start_fastmcp1,
)

__all__ = ["main"]

PROTOCOL = "2025-11-25"
RETRY_MS = 3000
"""The FastMCP variant started with `--retry-ms`: its priming events carry `retry: 3000`."""
SSE_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "capture", "version": "0"}},
}


class _Session:
    """One 2025-11-25 session with raw requests; every SSE body is written to `out` under `prefix`."""

    def __init__(self, http: aiohttp.ClientSession, server: ThirdPartyServer, out: Path, prefix: str) -> None:
        self.http = http
        self.server = server
        self.out = out
        self.prefix = prefix
        self.headers: dict[str, str] = dict(SSE_ACCEPT)
        self.next_id = 1

    def _report(self, exchange: str, resp: aiohttp.ClientResponse) -> None:
        shown = {k: v for k, v in resp.headers.items() if k.lower() not in ("date", "mcp-session-id")}
        print(f"{self.prefix}_{exchange}: {resp.status} {shown}")

    async def _save(self, exchange: str, resp: aiohttp.ClientResponse, window_s: float | None = None) -> None:
        body = bytearray()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window_s):
                async for chunk in resp.content.iter_any():
                    body += chunk
        (self.out / f"{self.prefix}_{exchange}.sse").write_bytes(bytes(body))

    async def initialize(self) -> None:
        async with self.http.post(self.server.url, json=INITIALIZE, headers=self.headers) as resp:
            self._report("initialize", resp)
            self.headers["Mcp-Session-Id"] = resp.headers["Mcp-Session-Id"]
            self.headers["MCP-Protocol-Version"] = PROTOCOL
            await self._save("initialize", resp)
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self.http.post(self.server.url, json=initialized, headers=self.headers) as resp:
            assert resp.status == 202, resp.status

    async def call(self, exchange: str | None, method: str, params: dict[str, Any] | None = None) -> None:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            body["params"] = params
        self.next_id += 1
        async with self.http.post(self.server.url, json=body, headers=self.headers) as resp:
            if exchange is None:
                await resp.read()
                return
            self._report(exchange, resp)
            await self._save(exchange, resp)

    @contextlib.asynccontextmanager
    async def get_stream(self, window_s: float) -> AsyncIterator[asyncio.Task[None]]:
        """Open the GET stream; inside the block make the server send on it; the capture ends after `window_s`."""
        headers = {k: v for k, v in self.headers.items() if k != "Content-Type"}
        headers["Accept"] = "text/event-stream"
        async with self.http.get(self.server.url, headers=headers) as resp:
            self._report("get-stream", resp)
            reader = asyncio.get_running_loop().create_task(self._save("get-stream", resp, window_s))
            yield reader
            await reader


async def _capture(out: Path, window_s: float) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
        with tempfile.TemporaryDirectory(prefix="capture-sse-") as scratch:
            workdir = Path(scratch)
            async with start_everything(workdir) as everything:
                session = _Session(http, everything, out, f"server-everything-{EVERYTHING_VERSION}")
                await session.initialize()
                await session.call("ping", "ping")
                async with session.get_stream(window_s):
                    await asyncio.sleep(0.5)  # let the stream open first: the server sends on it, not on the POST
                    await session.call(
                        "resources-subscribe", "resources/subscribe", {"uri": "demo://resource/dynamic/text/1"}
                    )
                    await session.call(None, "tools/call", {"name": "toggle-subscriber-updates", "arguments": {}})
            # Resumable, resumable with a retry hint in its priming events, and plain (no event ids at all).
            for suffix, event_store, retry_ms, get_window_s in (
                ("-eventstore", True, None, window_s),
                ("-eventstore-retry", True, RETRY_MS, 1.0),
                ("", False, None, 1.0),
            ):
                notes = workdir / "notes.txt"
                notes.write_text("hello\n", encoding="utf-8")
                async with start_fastmcp1(workdir, notes, event_store=event_store, retry_ms=retry_ms) as fastmcp:
                    session = _Session(http, fastmcp, out, f"fastmcp-{MCP1_VERSION}{suffix}")
                    await session.initialize()
                    await session.call("ping", "ping")
                    async with session.get_stream(get_window_s):
                        await asyncio.sleep(0.5)  # as above: the notification must find the stream open
                        await session.call(None, "tools/call", {"name": "notify_resources_changed", "arguments": {}})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="the fixture directory")
    parser.add_argument("--get-window-s", type=float, default=17.0, help="how long each GET stream is read")
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        raise SystemExit(reason)
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(_capture(args.out, args.get_window_s))


if __name__ == "__main__":
    main()
