"""The HTTP/1.1 wire to the upstream endpoint: a bounded pool of keep-alive connections, each an asyncio
Protocol whose answers httptools parses (llhttp, the parser of Node.js and of aiohttp's own C speed-ups).

Why not aiohttp's client, which the sidecar used before (and still uses for the one GET of another URL, the
OAuth metadata): every forwarded request and every poll is one exchange with one origin, and aiohttp's client
machinery (request and response objects, cookie jar, connector, a task per request body, a timer per read)
was 110 us of CPU an exchange, the largest part of both paths. Measured side by side (bench/PROFILE.md):
this wire is 35-40 us; aiosonic, the maintained alternative on PyPI, 320 us. So the request path is written
here, small, and the parsing, which is the part that is easy to get wrong, is llhttp's.

An exchange: `WirePool.exchange` writes the request on an idle connection (or a new one, within
`max_connections`) and returns the `Answer` once its head has arrived; its body is read from the `Answer`,
which must then be `release`d (the connection goes back to the pool only if the answer was read to its end).
Every failure comes out as the sidecar's UpstreamError for it, raised where it happens; timing is the
connection's own (one timer for the whole answer, then, for a stream, one for silence), so an exchange costs
no task and no context manager.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import unquote, urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.protocol.errors import (
    ShuttingDown,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = ["Answer", "WirePool"]

_PAUSE_BYTES = 1_048_576
"""Unread body bytes at which the connection stops reading from the socket (a slow client downstream)."""
_RESUME_BYTES = _PAUSE_BYTES // 4
_IDLE_KEEP_S = 15.0
"""An idle connection older than this is closed instead of reused (servers drop theirs after 5-75 s)."""


class _Exchange:
    """The state of the exchange in progress on a connection."""

    __slots__ = (
        "answer",
        "chunks",
        "complete",
        "decoder",
        "failure",
        "head",
        "reason",
        "size",
        "until_close",
        "waiter",
    )

    def __init__(self, head: asyncio.Future[Answer]) -> None:
        self.head = head
        self.answer: Answer | None = None
        self.reason = b""
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.complete = False
        self.until_close = False
        self.failure: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.decoder: zlib._Decompress | None = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection to the upstream; at most one exchange at a time."""

    def __init__(self, pool: WirePool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._headers: list[tuple[str, str]] = []
        self._exchange: _Exchange | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._silence_s: float | None = None
        self._last_data = 0.0
        self._paused = False
        self._keep_alive = True
        self.closed = False
        self.exchanges = 0
        self.idle_since = 0.0
        self.got_bytes = False
        """A byte of the current exchange's answer arrived (then a failure is no stale connection's)."""

    # -- asyncio.Protocol -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, without subclassing it

    def attach(self, transport: asyncio.BaseTransport) -> None:
        """The transport `create_connection` returned: uvloop calls connection_made a loop turn after it."""
        if self._transport is None:
            self.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None or exchange.complete:
            self._close()  # bytes nobody asked for: this connection can no longer be trusted
            return
        self.got_bytes = True
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamBadResponse(self._pool.url, "bad HTTP response: unexpected upgrade"))
        except httptools.HttpParserError as exc:
            # A callback below that raised an UpstreamError surfaces as the parser's error, with it as context.
            cause = exc.__context__
            if isinstance(cause, UpstreamError):
                self._fail(cause)
            else:
                self._fail(UpstreamBadResponse(self._pool.url, f"bad HTTP response: {_short(exc)}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        self._pool.discard(self)
        exchange = self._exchange
        if exchange is None or exchange.complete or exchange.failure is not None:
            return
        if exchange.until_close:  # a body delimited by the end of the connection: this is its end
            self._finish_body(exchange)
            return
        if exchange.answer is None:
            reason = "connection closed before the answer was complete"
            if exc is not None:
                reason = f"connection error: {_short(exc)}"
            self._fail(UpstreamUnavailable(self._pool.url, reason))
        else:
            self._fail(UpstreamBadResponse(self._pool.url, "truncated or malformed body"))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers = []

    def on_status(self, reason: bytes) -> None:
        assert self._exchange is not None
        self._exchange.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        exchange = self._exchange
        assert exchange is not None
        status = self._parser.get_status_code()
        if status < 200:
            return  # 100 Continue, 103 Early Hints: the answer follows
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            exchange.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            exchange.decoder = zlib.decompressobj()
        elif encoding != "identity":
            raise UpstreamBadResponse(self._pool.url, f"unsupported Content-Encoding {encoding[:20]}")
        length = headers.get("Content-Length")
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        exchange.until_close = length is None and not chunked and status not in (204, 304)
        content_length = int(length) if length is not None and length.isdigit() else None
        answer = Answer(self, status, exchange.reason.decode("latin-1").strip(), headers, content_length)
        exchange.answer = answer
        if not exchange.head.done():
            exchange.head.set_result(answer)

    def on_body(self, body: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        if exchange.decoder is not None:
            try:
                body = exchange.decoder.decompress(body)
            except zlib.error as exc:
                raise UpstreamBadResponse(self._pool.url, "truncated or malformed body") from exc
            if not body:
                return
        exchange.chunks.append(body)
        exchange.size += len(body)
        if exchange.size > _PAUSE_BYTES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake(exchange)

    def on_message_complete(self) -> None:
        exchange = self._exchange
        assert exchange is not None
        if exchange.answer is None:
            return  # the end of an informational (1xx) answer
        exchange.until_close = False
        self._keep_alive = self._parser.should_keep_alive()
        self._finish_body(exchange)

    # -- one exchange ---------------------------------------------------------------------------------------

    def start(self, request: bytes, head: asyncio.Future[Answer], within_s: float | None) -> None:
        assert self._transport is not None
        self.exchanges += 1
        self.got_bytes = False
        self._exchange = _Exchange(head)
        self._silence_s = None
        if within_s is not None:
            self._timer = self._loop.call_at(self._loop.time() + within_s, self._whole_timeout, within_s)
        self._transport.write(request)

    def unbounded(self, silence_s: float | None) -> None:
        """The answer is a stream: no deadline for the whole of it; `silence_s` without a byte ends it."""
        self._cancel_timer()
        self._silence_s = silence_s
        if silence_s is not None:
            self._timer = self._loop.call_at(self._last_data + silence_s, self._check_silence)

    def abort(self, failure: UpstreamError) -> None:
        """End the exchange in progress with `failure` (the sidecar is shutting down)."""
        exchange = self._exchange
        if exchange is not None and not exchange.complete:
            self._fail(failure)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end; the exchange's failure if it broke off."""
        exchange = self._exchange
        assert exchange is not None
        while True:
            if exchange.chunks:
                chunk = exchange.chunks.popleft()
                exchange.size -= len(chunk)
                if self._paused and exchange.size < _RESUME_BYTES and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                return chunk
            if exchange.failure is not None:
                raise exchange.failure
            if exchange.complete:
                return None
            exchange.waiter = self._loop.create_future()
            try:
                await exchange.waiter
            finally:
                exchange.waiter = None

    def finish(self) -> bool:
        """The caller is done with the answer: True if this connection may serve another exchange."""
        exchange, self._exchange = self._exchange, None
        self._cancel_timer()
        reusable = (
            exchange is not None
            and exchange.complete
            and exchange.failure is None
            and not exchange.chunks
            and not self.closed
            and not self._paused
            and self._keep_alive
        )
        if not reusable:
            self._close()
        self.idle_since = self._loop.time()
        return reusable

    def fail_head(self, failure: UpstreamError) -> None:
        """The caller stopped waiting for the head (cancelled): the connection cannot be reused."""
        exchange = self._exchange
        if exchange is not None:
            exchange.failure = exchange.failure or failure
        self._close()

    def _finish_body(self, exchange: _Exchange) -> None:
        if exchange.decoder is not None:
            rest = exchange.decoder.flush()
            if rest:
                exchange.chunks.append(rest)
                exchange.size += len(rest)
        exchange.complete = True
        if self._silence_s is None:
            self._cancel_timer()
        self._wake(exchange)

    def _fail(self, failure: UpstreamError) -> None:
        exchange = self._exchange
        if exchange is not None and exchange.failure is None and not exchange.complete:
            exchange.failure = failure
            if not exchange.head.done():
                exchange.head.set_exception(failure)
            self._wake(exchange)
        self._cancel_timer()
        if self._transport is not None:
            self._transport.abort()  # nothing more is wanted from it, and a hung peer must not hold it
        self.closed = True
        self._pool.discard(self)

    def _whole_timeout(self, within_s: float) -> None:
        self._timer = None
        exchange = self._exchange
        if exchange is not None and exchange.answer is None:
            self._fail(UpstreamTimeout(self._pool.url, "no answer in time"))
        else:  # the head came, the body did not end: an upstream dripping its answer
            self._fail(UpstreamTimeout(self._pool.url, f"no complete answer within {within_s:g} s"))

    def _check_silence(self) -> None:
        self._timer = None
        assert self._silence_s is not None
        due = self._last_data + self._silence_s
        if self._loop.time() >= due:
            self._fail(UpstreamTimeout(self._pool.url, "no answer in time"))
        else:  # bytes came meanwhile: look again when the silence would have lasted long enough
            self._timer = self._loop.call_at(due, self._check_silence)

    def _wake(self, exchange: _Exchange) -> None:
        if exchange.waiter is not None and not exchange.waiter.done():
            exchange.waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        self.closed = True
        self._pool.discard(self)
        if self._transport is not None:
            self._transport.close()


class Answer:
    """The upstream's answer: status, reason and headers at once, the body as it arrives."""

    __slots__ = ("_connection", "_released", "content_length", "headers", "reason", "status")

    def __init__(
        self,
        connection: _Connection,
        status: int,
        reason: str,
        headers: CIMultiDictProxy[str],
        content_length: int | None,
    ) -> None:
        self._connection = connection
        self._released = False
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content_length = content_length

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body, a piece at a time as it arrives (decoded if the upstream compressed it)."""
        while True:
            chunk = await self._connection.next_chunk()
            if chunk is None:
                return
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_any()])

    def unbounded(self, silence_s: float | None) -> None:
        """This answer is a stream: it may last; `silence_s` (None: any) without a byte ends it."""
        self._connection.unbounded(silence_s)

    def release(self) -> None:
        """Done with it (idempotent): a connection whose answer was read to its end serves the next exchange."""
        if not self._released:
            self._released = True
            self._connection._pool.release(self._connection)


class WirePool:
    """Connections to one origin: at most `max_connections`, the most recently used reused first."""

    def __init__(self, url: str, display_url: str, *, max_connections: int, connect_timeout_s: float) -> None:
        parts = urlsplit(url)
        self.url = display_url
        self._host = parts.hostname or "localhost"
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        self._path = path
        host = self._host if ":" not in self._host else f"[{self._host}]"
        self._host_header = host if parts.port is None else f"{host}:{parts.port}"
        self._basic: str | None = None
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._basic = "Basic " + base64.b64encode(secret.encode()).decode("ascii")
        self._ssl = ssl.create_default_context() if self._tls else None
        self._connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._aborted: ShuttingDown | None = None

    async def exchange(
        self,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        within_s: float | None,
        idempotent: bool = False,
    ) -> Answer:
        """Send one request; the answer once its head arrived. `within_s`: the whole answer's deadline (None:
        unbounded); `idempotent`: may be sent again once on a fresh connection when a reused one turns out to
        have been closed by the upstream before it answered (RFC 9112 section 9.3.1)."""
        if self._aborted is not None:
            raise self._aborted
        request = self._request(method, body, headers)
        await self._slots.acquire()
        try:
            for attempt in (1, 2):
                connection = self._reuse() or await self._connect()
                head: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
                self._busy.add(connection)
                connection.start(request, head, within_s)
                try:
                    return await head
                except UpstreamUnavailable:
                    retry = idempotent and attempt == 1 and connection.exchanges > 1 and not connection.got_bytes
                    self.release(connection, slot=False)
                    if retry and self._aborted is None:
                        continue
                    raise
                except UpstreamError:
                    self.release(connection, slot=False)
                    raise
                except BaseException:  # cancelled while waiting: the answer would arrive for nobody
                    connection.fail_head(UpstreamUnavailable(self.url, "exchange abandoned"))
                    self.release(connection, slot=False)
                    raise
            raise AssertionError("unreachable")
        except BaseException:
            self._slots.release()
            raise

    def release(self, connection: _Connection, *, slot: bool = True) -> None:
        self._busy.discard(connection)
        if connection.finish():
            self._idle.append(connection)
        if slot:
            self._slots.release()

    def discard(self, connection: _Connection) -> None:
        """`connection` is closing: never hand it out again."""
        if connection in self._idle:
            self._idle.remove(connection)

    def abort_all(self) -> None:
        """Shutdown: every exchange in flight ends now with ShuttingDown, and new ones are refused with it."""
        self._aborted = ShuttingDown(self.url, "the sidecar is shutting down")
        for connection in list(self._busy):
            connection.abort(self._aborted)

    def close(self) -> None:
        for connection in [*self._idle, *self._busy]:
            connection.abort(ShuttingDown(self.url, "the sidecar is shutting down"))
            connection.finish()
        self._idle.clear()
        self._busy.clear()

    def _reuse(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < _IDLE_KEEP_S:
                return connection
            connection.finish()  # closes it
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, connection = await loop.create_connection(
                    lambda: _Connection(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(self.url, "no answer in time") from exc
        except ssl.SSLError as exc:
            raise UpstreamUnavailable(self.url, f"TLS failed: {_short(exc)}") from exc
        except OSError as exc:
            raise UpstreamUnavailable(self.url, f"cannot connect: {exc.strerror or _short(exc)}") from exc
        connection.attach(transport)
        return connection

    def _request(self, method: str, body: bytes | None, headers: Mapping[str, str]) -> bytes:
        lines = [f"{method} {self._path} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        has_authorization = has_encoding = False
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name[:40]!r} contains a line break")
            lower = name.lower()
            if lower in ("host", "content-length", "transfer-encoding", "connection"):
                continue  # framing is this client's to set
            has_authorization = has_authorization or lower == "authorization"
            has_encoding = has_encoding or lower == "accept-encoding"
            lines.append(f"{name}: {value}\r\n")
        if self._basic is not None and not has_authorization:
            lines.append(f"Authorization: {self._basic}\r\n")
        if not has_encoding:
            lines.append("Accept-Encoding: identity\r\n")  # an answer is re-framed anyway: no need to compress
        if body is not None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        # Header values as aiohttp's server decoded them (UTF-8, undecodable bytes kept as surrogates): the
        # same bytes go on.
        head = "".join(lines).encode("utf-8", "surrogateescape")
        return head + body if body else head


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."
