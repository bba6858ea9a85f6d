"""The one listen-stream client of the tests: a raw `subscriptions/listen` POST whose frames are read as they come.

    stream = ListenStream(http, url, "listen-1", [uri], authorization="Bearer alice")
    ack = await stream.open()                      # the ack, the first frame (bounded wait)
    frame = await stream.next()                    # frames in order, each once
    mark = stream.mark(); ...; await stream.wait_update(uri, 5.0, since=mark)   # or look back by position
    await stream.close()

The ack is checked to carry the stream's id (invariant 3); `next_stamped` checks each later notification too.

Every frame is kept (`frames`, the ack first) and every keep-alive comment's loop time (`comment_times`);
`next` takes the frames after the ack one by one, `pending` takes what has arrived and was not taken yet,
`wait_for` looks at the frames after a mark without taking them. `ended` says the server or a proxy went away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import aiohttp

from tests.kit.sse import read_events
from tests.kit.waiting import WAIT_S
from tests.kit.wire import ACK, SUB_ID_KEY, UPDATED, headers, listen_request

__all__ = ["ListenStream", "Streams", "all_updated", "listening"]

_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=None)


class ListenStream:
    """One raw listen stream of `uris` (and the list kinds in `lists`) by a client sending `authorization`."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        request_id: Any,
        uris: Iterable[str] | None = (),
        *,
        authorization: str | None = None,
        **lists: bool,
    ) -> None:
        """`uris` None sends no `resourceSubscriptions` field (lists only), where `()` sends an empty one."""
        self.request_id = request_id
        self.label = f"{url}#{request_id}"
        self.frames: list[dict[str, Any]] = []
        self.comment_times: list[float] = []
        """Loop time of each keep-alive comment line."""
        self.ended = False
        self._http = http
        self._url = url
        self._asked = None if uris is None else list(uris)
        self._uris = self._asked or []
        self._lists = lists
        self._authorization = authorization
        self._taken = 1  # `next` starts after the ack
        self._arrived = asyncio.Event()
        self._response: aiohttp.ClientResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        http: aiohttp.ClientSession,
        url: str,
        request_id: Any,
        uris: Iterable[str],
        within_s: float = WAIT_S,
        *,
        authorization: str | None = None,
    ) -> ListenStream:
        """A stream opened, its ack checked to honour every one of `uris`."""
        stream = cls(http, url, request_id, uris, authorization=authorization)
        ack = await stream.open(within_s)
        assert ack["params"]["notifications"].get("resourceSubscriptions") == stream._uris, ack
        return stream

    @property
    def response(self) -> aiohttp.ClientResponse:
        """The HTTP response of the stream (its headers), once open."""
        assert self._response is not None, "not open"
        return self._response

    async def open(self, within_s: float = WAIT_S) -> dict[str, Any]:
        """POST the listen request; the ack, the first frame (bounded wait)."""
        extra = {"Authorization": self._authorization} if self._authorization else {}
        self._response = await self._http.post(
            self._url,
            json=listen_request(self._asked, self.request_id, **self._lists),
            headers=headers("subscriptions/listen", **extra),
            timeout=_STREAM_TIMEOUT,
        )
        if self._response.status != 200:
            text = await self._response.text()
            self._response.release()
            raise AssertionError(f"listen via {self._url} answered {self._response.status}: {text}")
        self._reader = asyncio.get_running_loop().create_task(self._read(self._response))
        ack = await self.wait_for(lambda frame: True, within_s)
        assert ack.get("method") == ACK, f"{self.label}: first frame is not the ack: {ack}"
        assert ack["params"]["_meta"][SUB_ID_KEY] == self.request_id, ack
        return ack

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        try:
            await read_events(response, self.frames, self.comment_times, self._arrived)
        finally:
            self.ended = True
            self._arrived.set()

    def mark(self) -> int:
        """A position in the frames: `wait_for(..., since=mark)` looks only at frames after it."""
        return len(self.frames)

    def updates(self, since: int = 0) -> list[dict[str, Any]]:
        return [frame for frame in self.frames[since:] if frame.get("method") == UPDATED]

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], within_s: float = WAIT_S, since: int = 0
    ) -> dict[str, Any]:
        """The first frame after `since` matching `predicate`; fails when the stream ends or `within_s` passes."""
        seen = since
        try:
            async with asyncio.timeout(within_s):
                while True:
                    for frame in self.frames[seen:]:
                        if predicate(frame):
                            return frame
                    seen = len(self.frames)
                    if self.ended:
                        raise AssertionError(f"{self.label}: ended before the frame came; frames: {self.frames}")
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            raise AssertionError(f"{self.label}: no such frame within {within_s} s; frames: {self.frames}") from None

    async def wait_update(self, uri: str, within_s: float = WAIT_S, since: int = 0) -> dict[str, Any]:
        return await self.wait_for(
            lambda frame: frame.get("method") == UPDATED and frame["params"]["uri"] == uri, within_s, since
        )

    async def next(self, within_s: float = WAIT_S) -> dict[str, Any]:
        """The next frame not taken yet (the first after the ack to begin with), bounded wait."""
        frame = await self.wait_for(lambda frame: True, within_s, since=self._taken)
        self._taken += 1
        return frame

    async def next_stamped(self, within_s: float = WAIT_S) -> dict[str, Any]:
        """The next frame, checked to be a notification carrying this stream's id."""
        frame = await self.next(within_s)
        assert frame["params"]["_meta"][SUB_ID_KEY] == self.request_id, frame
        return frame

    async def next_update(self, within_s: float = WAIT_S) -> dict[str, Any]:
        """The next frame, checked to be an update of one of this stream's URIs carrying its id."""
        frame = await self.next(within_s)
        assert frame["method"] == UPDATED, frame
        assert frame["params"]["uri"] in self._uris, frame
        assert frame["params"]["_meta"][SUB_ID_KEY] == self.request_id, frame
        return frame

    def pending(self) -> list[dict[str, Any]]:
        """The frames that arrived and were not taken by `next` (taking them)."""
        taken, self._taken = self._taken, max(self._taken, len(self.frames))
        return self.frames[taken:]

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

    aclose = close


@contextlib.asynccontextmanager
async def listening(*streams: ListenStream, at_once: bool = False) -> AsyncIterator[list[dict[str, Any]]]:
    """Open every stream (one after the other, or all `at_once`, as joiners racing one another), yield their
    acks in the streams' order, close them all on the way out."""
    try:
        if at_once:
            yield list(await asyncio.gather(*(stream.open() for stream in streams)))
        else:
            yield [await stream.open() for stream in streams]
    finally:
        for stream in streams:
            await stream.close()


async def all_updated(
    streams: Sequence[ListenStream], uri: str, within_s: float = WAIT_S, marks: Sequence[int] | None = None
) -> None:
    """Until every one of `streams` was told of `uri` after its mark (from its start without `marks`)."""
    marks = marks if marks is not None else [0] * len(streams)
    await asyncio.gather(
        *(stream.wait_update(uri, within_s, since=mark) for stream, mark in zip(streams, marks, strict=True))
    )


class Streams:
    """Opens listen streams (`connect`: each ack checked) and closes every one of them in `aclose`."""

    def __init__(self, http: aiohttp.ClientSession, uris: Sequence[str]) -> None:
        self.http = http
        self.uris = list(uris)
        """What `open` listens to unless told otherwise."""
        self.opened: list[ListenStream] = []

    async def open(self, url: str, request_id: Any, uris: Sequence[str] | None = None) -> ListenStream:
        stream = await ListenStream.connect(self.http, url, request_id, self.uris if uris is None else uris)
        self.opened.append(stream)
        return stream

    async def open_many(self, url: str, prefix: str, count: int) -> list[ListenStream]:
        """`count` streams at once, ids `prefix-0`, `prefix-1`..."""
        return list(await asyncio.gather(*(self.open(url, f"{prefix}-{n}") for n in range(count))))

    async def aclose(self) -> None:
        await asyncio.gather(*(stream.aclose() for stream in self.opened))
