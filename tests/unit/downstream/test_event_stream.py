"""The listen stream's SSE writer on a real connection: what a client reads, and what a client that stops
reading costs (a bounded buffer, then a disconnect)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from sidecar.downstream.event_stream import EventStream, StreamStalled
from sidecar.downstream.listen_stream import ListenStream
from sidecar.observability.metrics import Metrics

FRAME = b'{"method":"notifications/resources/updated","params":{"uri":"x://1"}}'
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def test_a_client_reads_events_and_comments_as_sse_then_the_end_of_the_body() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        events = EventStream(request, high_water=65536, stall_timeout_s=5)
        await events.open()
        events.write_event(b'{"n":1}')
        events.write_comment()
        events.write_event(b'{"n":2}')
        await events.close()
        return events.response

    async with serving(handler) as url, aiohttp.ClientSession() as http, http.post(url) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Transfer-Encoding"] == "chunked"
        body = await response.text()
    assert body == 'data: {"n":1}\r\n\r\n: ping\r\n\r\ndata: {"n":2}\r\n\r\n'


async def test_a_client_that_stops_reading_fills_a_bounded_buffer_then_is_disconnected() -> None:
    outcome: asyncio.Future[tuple[int, int, BaseException | None]] = asyncio.get_running_loop().create_future()
    stream = ListenStream("l-1", Metrics(), on_pending=lambda s: None, on_written=lambda method, at: None)

    async def handler(request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        assert sock is not None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # fill the kernel's side fast
        events = EventStream(request, high_water=16 * 1024, stall_timeout_s=0.5)
        await events.open()
        written, error = 0, None
        for i in range(10_000):  # signals while the client reads nothing: they pend, merging per key
            stream.signal("notifications/resources/updated", f"x://{i % 10}", 0.0)
        while error is None:  # what the stream's handler does: write while there is room, else wait for room
            while events.writable:
                events.write_event(FRAME)
                written += 1
            try:
                await events.drain()
            except StreamStalled as exc:
                error = exc
        outcome.set_result((written, stream.pending_count, error))
        return events.response

    async with serving(handler) as url:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        await asyncio.get_running_loop().sock_connect(client, (host, int(port)))
        request = f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode()
        await asyncio.get_running_loop().sock_sendall(client, request)
        try:
            written, pending, error = await asyncio.wait_for(outcome, 30)
        finally:
            client.close()
    assert isinstance(error, StreamStalled)
    assert pending == 10, "10,000 signals on 10 keys are 10 pending signals"
    # What was written stopped at the buffer's bound plus what the two (small) socket buffers hold.
    assert 0 < written * len(FRAME) < 256 * 1024


@pytest.mark.parametrize("version", ["HTTP/1.0"])
async def test_an_http_1_0_client_gets_the_stream_ended_by_the_close(version: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        events = EventStream(request, high_water=65536, stall_timeout_s=5)
        await events.open()
        events.write_event(b'{"n":1}')
        await events.close()
        return events.response

    async with serving(handler) as url:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST / {version}\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closes
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"chunked" not in head.lower()
    assert body == b'data: {"n":1}\r\n\r\n'
