"""Helpers for the observability tests: a parsed `/metrics` scrape and a raw listen stream that reads its frames."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import headers, request, sse_messages

ACK = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"
WAIT_S = 15.0
"""Upper bound for anything that should happen within a poll or two."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    """One `/metrics` answer, parsed by prometheus_client's own parser."""

    families: dict[str, str] = field(default_factory=dict)
    """Family name -> type (counter, gauge, histogram)."""
    samples: list[Sample] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample `name` whose labels are exactly `labels`; None when it is not exposed."""
        for sample in self.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
        return None

    def labelled(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of `name`, keyed by its sorted label pairs."""
        return {tuple(sorted(s.labels.items())): s.value for s in self.samples if s.name == name}


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        scrape.families[family.name] = family.type
        scrape.samples.extend(Sample(s.name, dict(s.labels), s.value) for s in family.samples)
    return scrape


async def scrape(http: aiohttp.ClientSession, base_url: str, path: str = "/metrics") -> Scrape:
    async with http.get(f"{base_url}{path}") as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(await resp.text())


class ListenStream:
    """One raw listen stream: `open` returns the ack; a reader task queues every later frame."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        request_id: Any,
        uris: Iterable[str] = (),
        *,
        authorization: str | None = None,
        **lists: bool,
    ) -> None:
        self.request_id = request_id
        self._http = http
        self._url = url
        self._notifications: dict[str, Any] = {"resourceSubscriptions": list(uris), **lists}
        self._authorization = authorization
        self._frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._response: aiohttp.ClientResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def response(self) -> aiohttp.ClientResponse:
        """The HTTP response of the stream (its headers), once open."""
        assert self._response is not None, "not open"
        return self._response

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
        self._reader = asyncio.get_running_loop().create_task(self._read(frames))
        return ack

    async def _read(self, frames: AsyncIterator[dict[str, Any]]) -> None:
        with contextlib.suppress(aiohttp.ClientError):
            async for frame in frames:
                self._frames.put_nowait(frame)

    async def next(self, within_s: float = WAIT_S) -> dict[str, Any]:
        """The next frame after the ack (bounded wait)."""
        async with asyncio.timeout(within_s):
            return await self._frames.get()

    async def close(self) -> None:
        """Drop the connection, as a client that stops listening does."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._response is not None:
            self._response.close()
            self._response = None


@contextlib.asynccontextmanager
async def listening(*streams: ListenStream) -> AsyncIterator[list[dict[str, Any]]]:
    """Open every stream, yield their acks, close them all on the way out."""
    try:
        yield [await stream.open() for stream in streams]
    finally:
        for stream in streams:
            await stream.close()
