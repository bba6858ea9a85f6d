"""The one writer of text/event-stream responses: listen streams, 2025-11-25 GET streams, relayed answers.

As in aiohttp-sse, one small class is the whole SSE response: its headers, its framing of events and comments,
its end. Unlike aiohttp-sse (which this project used before), it can be written to without a task or an await
of its own: a frame goes straight into the connection's send buffer while that buffer is below `high_water`,
and only a client that reads slowly makes its stream's handler await (`drain`). So a change fans out to
thousands of listen streams in one pass over them, and a quiet stream costs no task: keep-alive comments come
from one ticker for every stream (`KeepAliveTicker`). aiohttp-sse's response starts a ping task per stream in
`prepare()` (the interval cannot be turned off) and every `send()` awaits under a timeout of its own: on the
fan-out's path that is a task and an await per stream per change.

A stream served by a handler of its own (a 2025-11-25 GET stream, a relayed answer) awaits each write
(`send`), as aiohttp's own `write` does. With `stall_timeout_s`, what aiohttp-sse did for a hung peer is kept:
TCP_USER_TIMEOUT makes the kernel drop a connection whose data goes unacknowledged for that long, and a write
that cannot drain for that long aborts it; without it a slow client is waited for, as aiohttp waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

__all__ = [
    "COMMENT",
    "DEFAULT_HIGH_WATER",
    "EventStream",
    "KeepAliveTarget",
    "KeepAliveTicker",
    "StreamStalled",
    "message_event",
]

_TCP_USER_TIMEOUT: int | None = getattr(socket, "TCP_USER_TIMEOUT", None)
_CONTENT_TYPE = "text/event-stream"
_NOT_BUFFERED = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Neither a cache nor a proxy (nginx) may hold frames back."""
DEFAULT_HIGH_WATER = 65_536
"""asyncio's own high-water mark of a transport's send buffer: what a stream with no bound of its own keeps."""
COMMENT = b": ping\r\n\r\n"
"""The keep-alive comment."""
_TICKER_SLICE = 512
"""Streams the keep-alive ticker writes to before it lets the event loop run other work."""


def message_event(data: bytes) -> bytes:
    """An SSE event named `message` (as a 2025-11-25 GET stream writes them; `data` is one line of JSON)."""
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


class StreamStalled(Exception):
    """The client read nothing for `stall_timeout_s` while its buffer was full: the connection was aborted."""


class EventStream:
    """One SSE response: `open`, then `write_event`/`write_comment` (synchronous) and `drain` when not `writable`,
    or `send` (awaited); `close` ends the body.

    `headers` are added to the stream's own (a relayed answer keeps the upstream's Content-Type and challenge)."""

    def __init__(
        self,
        request: web.Request,
        *,
        high_water: int = DEFAULT_HIGH_WATER,
        stall_timeout_s: float | None = None,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        own: CIMultiDict[str] = CIMultiDict({"Content-Type": _CONTENT_TYPE})
        own.update(headers or {})
        own.update(_NOT_BUFFERED)
        self.response = web.StreamResponse(status=status, headers=own)
        self.quiet = True
        """Nothing written since the keep-alive ticker last looked."""
        self._request = request
        self._high_water = high_water
        self._stall_timeout_s = stall_timeout_s
        self._transport: asyncio.Transport | None = None
        self._writer: AbstractStreamWriter | None = None
        self._chunked = False
        self._saved_user_timeout: int | None = None

    async def open(self) -> None:
        """Send the status line and headers."""
        request = self._request
        # HTTP/1.1 frames the body in chunks (we write them ourselves, below); HTTP/1.0 ends it by closing.
        self._chunked = request.version >= (1, 1)
        if self._chunked:
            self.response.enable_chunked_encoding()
        else:
            self.response.force_close()
        self._set_user_timeout()
        self._writer = await self.response.prepare(request)  # StreamResponse sends its headers here
        # uvloop's transports are not asyncio.Transport subclasses, so this is a None check, not an isinstance one.
        transport = request.transport
        if transport is not None:
            # aiohttp's drain waits while the transport has paused the protocol, which it does past this mark:
            # the same mark as `writable`'s, so a stream that may not write always has something to wait for.
            transport.set_write_buffer_limits(high=self._high_water)
            self._transport = transport

    @property
    def writable(self) -> bool:
        """Connected, and the send buffer not past its high-water mark."""
        transport = self._transport
        return (
            transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= self._high_water
        )

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def write_event(self, data: bytes) -> None:
        """One `data:` event (`data` is one line of JSON); nothing once the client is gone."""
        self._write(b"data: " + data + b"\r\n\r\n")

    def write_comment(self) -> None:
        self._write(COMMENT)

    async def send(self, payload: bytes) -> None:
        """Write whole SSE frames (`message_event`, `COMMENT`, or bytes relayed as they came) and wait while the
        client is behind; ConnectionResetError once it is gone (its handler stops reading what it relays)."""
        if not self.connected:
            raise ConnectionResetError("the client went away")
        self._write(payload)
        await self.drain()

    def _write(self, payload: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the client is gone; its handler is ending the stream
        if not payload:
            return  # an empty chunk would end a chunked body
        self.quiet = False
        if self._chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))
        else:
            transport.write(payload)

    async def drain(self) -> None:
        """Wait until the client has taken enough of the buffer; abort it after `stall_timeout_s` of nothing."""
        if self.writable or not self.connected:
            return
        assert self._writer is not None
        if self._stall_timeout_s is None:
            await self._writer.drain()
            return
        try:
            async with asyncio.timeout(self._stall_timeout_s):
                await self._writer.drain()  # aiohttp's flow control: resumes when the kernel takes more
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()
            raise StreamStalled from None

    async def close(self) -> None:
        """End the body (the last chunk) and give the connection back its own timeout."""
        try:
            if self.connected:
                await self.response.write_eof()
        finally:
            self._restore_user_timeout()

    def _set_user_timeout(self) -> None:
        if _TCP_USER_TIMEOUT is None or self._stall_timeout_s is None or self._request.transport is None:
            return
        sock = self._request.transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        with contextlib.suppress(OSError):
            self._saved_user_timeout = sock.getsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, int(self._stall_timeout_s * 1000))

    def _restore_user_timeout(self) -> None:
        # The connection may serve further requests (keep-alive): they get the kernel's usual behaviour back.
        saved, self._saved_user_timeout = self._saved_user_timeout, None
        if saved is None or _TCP_USER_TIMEOUT is None or self._request.transport is None:
            return
        sock = self._request.transport.get_extra_info("socket")
        if sock is not None and sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, saved)


class KeepAliveTarget(Protocol):
    def keepalive(self) -> bool:
        """Write a comment if quiet since the last tick; True if one was written."""
        ...


class KeepAliveTicker:
    """One task for every stream's keep-alive comments: each tick, a comment to each stream quiet since the
    last (so a quiet stream hears one every `interval_s`, a busy one none)."""

    def __init__(
        self, interval_s: float, streams: Callable[[], Iterable[KeepAliveTarget]], on_sent: Callable[[int], None]
    ) -> None:
        self._interval_s = interval_s
        self._streams = streams
        self._on_sent = on_sent
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sse-keepalive")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            sent = 0
            for index, stream in enumerate(list(self._streams()), 1):
                sent += stream.keepalive()
                if index % _TICKER_SLICE == 0:
                    await asyncio.sleep(0)  # thousands of streams: let requests in between slices
            if sent:
                self._on_sent(sent)
