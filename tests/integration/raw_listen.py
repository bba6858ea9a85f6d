"""Raw listen streams for the integration tests of who shares a watch and who is told what, and what to read
in the upstream's log (its own times: `at` when a request arrived, `done` when it was answered)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from sidecar.app import METRICS, REGISTRY
from sidecar.changes import WatchKind
from sidecar.watch.poller import Watch
from tests.helpers import (
    SUB_ID_KEY,
    Sidecar,
    eventually,
    headers,
    request,
    rpc,
    sse_messages,
)

TTL_MS = 300
"""read and list ttlMs of the upstreams: the sidecar polls each watch about every 300 ms."""
POLLING = {"min_interval_ms": 100, "default_interval_ms": TTL_MS, "linger_ms": 100}
WAIT_S = 10.0
"""Upper bound for anything that should happen within a poll or two."""

PRICE = "catalog://price"
PROFILE = "catalog://profile"
ACK = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
RESOURCES_CHANGED = "notifications/resources/list_changed"


__all__ = [
    "ACK",
    "POLLING",
    "PRICE",
    "PROFILE",
    "PROMPTS_CHANGED",
    "RESOURCES_CHANGED",
    "TOOLS_CHANGED",
    "TTL_MS",
    "UPDATED",
    "WAIT_S",
    "Listen",
    "answered",
    "listening",
    "most_in_flight",
    "polled",
    "polls",
    "read_text",
    "reads_of",
    "watch_count",
    "watch_polled_twice",
    "watches",
]


class Listen:
    """One raw listen stream: `open` returns the ack; a reader task queues every later frame."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        sidecar: Sidecar,
        request_id: Any,
        notifications: dict[str, Any],
        authorization: str | None = None,
    ) -> None:
        self.request_id = request_id
        self._http = http
        self._url = sidecar.url
        self._notifications = notifications
        self._authorization = authorization
        self._frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._response: aiohttp.ClientResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> dict[str, Any]:
        extra = {"Authorization": self._authorization} if self._authorization else {}
        self._response = await self._http.post(
            self._url,
            json=request("subscriptions/listen", {"notifications": self._notifications}, self.request_id),
            headers=headers("subscriptions/listen", **extra),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        assert self._response.status == 200, await self._response.text()
        frames = sse_messages(self._response)
        async with asyncio.timeout(WAIT_S):
            ack = await anext(frames)
        assert ack["method"] == ACK, ack
        assert ack["params"]["_meta"][SUB_ID_KEY] == self.request_id
        self._reader = asyncio.get_running_loop().create_task(self._read(frames))
        return ack

    async def _read(self, frames: AsyncIterator[dict[str, Any]]) -> None:
        async for frame in frames:
            self._frames.put_nowait(frame)

    async def next(self) -> dict[str, Any]:
        """The next frame after the ack; every one must carry this stream's id."""
        async with asyncio.timeout(WAIT_S):
            frame = await self._frames.get()
        assert frame["params"]["_meta"][SUB_ID_KEY] == self.request_id, frame
        return frame

    def received(self) -> list[dict[str, Any]]:
        """Every frame that arrived and was not taken by `next` yet (emptying the queue)."""
        frames = []
        while not self._frames.empty():
            frames.append(self._frames.get_nowait())
        return frames

    async def close(self) -> None:
        """Close the connection: the client cancels its subscription."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await self._reader
        if self._response is not None:
            self._response.close()


@contextlib.asynccontextmanager
async def listening(*streams: Listen) -> AsyncIterator[list[dict[str, Any]]]:
    """Open every stream (concurrently), yield their acks, close them all on the way out."""
    try:
        yield list(await asyncio.gather(*(stream.open() for stream in streams)))
    finally:
        for stream in streams:
            await stream.close()


def polls(sidecar: Sidecar, kind: WatchKind) -> float:
    """Successful polls of watches of this kind so far."""
    value: float = sidecar.app[METRICS].polls.labels(kind, "ok")._value.get()
    return value


def watch_count(sidecar: Sidecar, kind: WatchKind) -> float:
    value: float = sidecar.app[METRICS].watches.labels(kind)._value.get()
    return value


def watches(sidecar: Sidecar) -> list[Watch]:
    return list(sidecar.app[REGISTRY].watches())


async def polled(sidecar: Sidecar, kind: WatchKind, times: int) -> None:
    """Wait until the sidecar has polled watches of `kind` `times` more times (from now)."""
    start = polls(sidecar, kind)
    await eventually(lambda: polls(sidecar, kind) >= start + times, within_s=WAIT_S)


async def watch_polled_twice(watch: Watch) -> None:
    """Wait until this one watch has finished two more polls (the second started after now)."""
    for _ in range(2):
        last = watch.last_poll_at
        await eventually(lambda: watch.last_poll_at != last, within_s=WAIT_S)  # noqa: B023


async def read_text(http: aiohttp.ClientSession, sidecar: Sidecar, uri: str, authorization: str | None = None) -> str:
    extra = {"Authorization": authorization} if authorization else None
    status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": uri}, extra_headers=extra)
    assert status == 200, reply
    text: str = reply["result"]["contents"][0]["text"]
    return text


def reads_of(log: list[dict[str, Any]], uri: str) -> list[dict[str, Any]]:
    return [entry for entry in log if entry["method"] == "resources/read" and entry["uri"] == uri]


def most_in_flight(entries: list[dict[str, Any]]) -> int:
    """The most of these requests the upstream had in hand at once, by its own times (arrived, answered)."""
    edges = sorted([(entry["at"], 1) for entry in entries] + [(entry["done"], -1) for entry in entries])
    most = held = 0
    for _, step in edges:  # an answer at the very time of an arrival counts first (sorted -1 before 1)
        held += step
        most = max(most, held)
    return most


def answered(entries: list[dict[str, Any]]) -> bool:
    return all(entry["done"] is not None for entry in entries)
