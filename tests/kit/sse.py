"""The one SSE parser of the tests: lines in, JSON messages (and keep-alive comments) out.

A stream read as it arrives (`sse_messages`), a whole body read at once (`parse_sse`) and the listen client
(`tests.kit.listen`) all feed the same `SseParser`, so the tests agree on what a frame is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp

__all__ = ["COMMENT", "SseParser", "parse_sse", "read_events", "sse_messages"]

COMMENT: Final = ":"
"""What `SseParser.feed` returns for a comment line (a keep-alive)."""


class SseParser:
    """Fed one line at a time (without its line break); an empty line ends an event."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> dict[str, Any] | str | None:
        """The JSON message the line completes, `COMMENT` for a comment line, None for anything else."""
        if line.startswith(":"):
            return COMMENT
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
        elif line == "" and self._data:
            data, self._data = "\n".join(self._data), []
            if data.strip():  # an event with empty data (a priming event) carries no message
                message: dict[str, Any] = json.loads(data)
                return message
        return None


def parse_sse(body: str | bytes) -> list[dict[str, Any]]:
    """Every JSON message of a whole SSE body (an answer read to its end)."""
    text = body.decode() if isinstance(body, bytes) else body
    parser = SseParser()
    found = (parser.feed(line) for line in [*text.replace("\r\n", "\n").split("\n"), ""])
    return [message for message in found if isinstance(message, dict)]


async def sse_messages(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """JSON messages of an SSE response as they arrive, one per event; comment lines are skipped."""
    parser = SseParser()
    async for raw in resp.content:
        found = parser.feed(raw.decode().rstrip("\r\n"))
        if isinstance(found, dict):
            yield found


async def read_events(
    response: aiohttp.ClientResponse, frames: list[dict[str, Any]], comment_times: list[float], arrived: asyncio.Event
) -> None:
    """Read a live event stream into `frames` (each event's JSON) and `comment_times` (the loop's time of each
    comment), setting `arrived` after each; returns when the server or a proxy ends the stream."""
    parser = SseParser()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(aiohttp.ClientError, ConnectionError):  # gone: the caller's `ended` says so
        async for raw in response.content:
            found = parser.feed(raw.decode().rstrip("\r\n"))
            if found == COMMENT:
                comment_times.append(loop.time())
            elif isinstance(found, dict):
                frames.append(found)
            else:
                continue
            arrived.set()
