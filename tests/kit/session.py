"""The one raw 2025-11-25 session client of the tests: `initialize` through the sidecar, then its GET stream read as
frames arrive (comments too), and requests on the session by hand, as a 2025-11-25 client sends them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from tests.kit.sse import read_events
from tests.kit.waiting import WAIT_S
from tests.kit.wire import LEGACY_HEADERS, LEGACY_INITIALIZE, UPDATED

__all__ = ["Session", "sessions"]


class Session:
    """One 2025-11-25 session through the sidecar (as the client holding bearer `token`, if any)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.comment_times: list[float] = []
        """Loop time of each keep-alive comment line on the GET stream."""
        self.headers: dict[str, str] = {}
        """What every request on the session carries (its id and revision), once open."""
        self._http = http
        self._url = url
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._ids = 1

    async def open(self, *, get_stream: bool = True) -> None:
        """Initialize (and send `notifications/initialized`); open the GET stream unless told not to."""
        async with self._http.post(self._url, json=LEGACY_INITIALIZE, headers={**LEGACY_HEADERS, **self._auth}) as r:
            assert r.status == 200, await r.text()
            session_id = r.headers["Mcp-Session-Id"]
        self.headers = {
            **LEGACY_HEADERS,
            **self._auth,
            "Mcp-Session-Id": session_id,
            "MCP-Protocol-Version": "2025-11-25",
        }
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self._http.post(self._url, json=initialized, headers=self.headers) as r:
            assert r.status == 202, await r.text()
        if get_stream:
            await self.open_get_stream()

    async def open_get_stream(self) -> None:
        response = await self._http.get(
            self._url,
            headers={**self.headers, "Accept": "text/event-stream"},
            timeout=aiohttp.ClientTimeout(total=None),
        )
        assert response.status == 200, await response.text()
        self._reader = asyncio.get_running_loop().create_task(self._read(response))

    @property
    def streaming(self) -> bool:
        """Its GET stream is open (the sidecar has not ended it)."""
        return self._reader is not None and not self._reader.done()

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        try:
            await read_events(response, self.frames, self.comment_times, self._arrived)
        finally:
            response.release()

    async def call(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One request on the session: (HTTP status, JSON-RPC answer)."""
        self._ids += 1
        body = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        async with self._http.post(self._url, json=body, headers=self.headers) as r:
            return r.status, await r.json(content_type=None)

    async def subscribe(self, uri: str) -> None:
        """`resources/subscribe`, checked to be answered with an empty result."""
        status, answer = await self.call("resources/subscribe", {"uri": uri})
        assert status == 200 and answer == {"jsonrpc": "2.0", "id": self._ids, "result": {}}, answer

    def updates(self) -> list[dict[str, Any]]:
        return [frame for frame in self.frames if frame.get("method") == UPDATED]

    async def wait_until(self, done: Any, within_s: float = WAIT_S) -> None:
        """Until `done()` is true, checked on each frame or comment that arrives (bounded wait)."""
        async with asyncio.timeout(within_s):
            while not done():
                self._arrived.clear()
                await self._arrived.wait()

    async def wait_updates(self, count: int, within_s: float = WAIT_S) -> list[dict[str, Any]]:
        """Until `count` updates arrived (bounded wait): all of them."""
        await self.wait_until(lambda: len(self.updates()) >= count, within_s)
        return self.updates()

    async def close(self) -> None:
        """Drop the GET stream and end the session (DELETE)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.headers:
            async with self._http.delete(self._url, headers=self.headers):
                pass


@contextlib.asynccontextmanager
async def sessions(http: aiohttp.ClientSession, url: str, *tokens: str | None) -> AsyncIterator[list[Session]]:
    """One open session (GET stream and all) per token (None: anonymous), all ended on the way out."""
    opened = [Session(http, url, token) for token in tokens]
    try:
        for session in opened:
            await session.open()
        yield opened
    finally:
        for session in opened:
            await session.close()
