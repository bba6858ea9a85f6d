"""One keep-alive HTTP/1.1 connection to the upstream as an asyncio Protocol, its answers parsed by httptools
(llhttp, the parser of Node.js and of aiohttp's own C speed-ups), and the `Answer` a caller reads from it.

Timing is the connection's own: one timer for the whole answer, then, for a stream, one for silence. Every
failure comes out as the sidecar's UpstreamError for it. The pool that owns connections is `wire.py`.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.protocol import UpstreamBadResponse, UpstreamError, UpstreamTimeout, UpstreamUnavailable

__all__ = ["Answer", "Pool", "UpstreamConnection", "short_reason", "tls_reason"]

_PAUSE_BYTES = 1_048_576
"""Unread body bytes at which the connection stops reading from the socket (a slow client downstream)."""
_RESUME_BYTES = _PAUSE_BYTES // 4


class Pool(Protocol):
    """What a connection tells its owner."""

    def release(self, connection: UpstreamConnection) -> None:
        """The caller is done with the connection's answer."""

    def discard(self, connection: UpstreamConnection) -> None:
        """The connection is closing: never hand it out again."""


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


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream; at most one exchange at a time."""

    def __init__(self, url: str, pool: Pool) -> None:
        self._url = url
        self.pool = pool
        """Its owner, told when the connection closes and when its answer is done with."""
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
            self.close()  # bytes nobody asked for: this connection can no longer be trusted
            return
        self.got_bytes = True
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamBadResponse(self._url, "bad HTTP response: unexpected upgrade"))
        except httptools.HttpParserError as exc:
            # A callback below that raised an UpstreamError surfaces as the parser's error, with it as context.
            cause = exc.__context__
            if isinstance(cause, UpstreamError):
                self._fail(cause)
            else:
                self._fail(UpstreamBadResponse(self._url, f"bad HTTP response: {short_reason(exc)}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        self.pool.discard(self)
        exchange = self._exchange
        if exchange is None or exchange.complete or exchange.failure is not None:
            return
        if exchange.until_close:  # a body delimited by the end of the connection: this is its end
            self._finish_body(exchange)
            return
        if exchange.answer is None:
            reason = "connection closed before the answer was complete"
            if exc is not None:
                reason = f"connection error: {short_reason(exc)}"
            self._fail(UpstreamUnavailable(self._url, reason))
        else:
            self._fail(UpstreamBadResponse(self._url, "truncated or malformed body"))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # Each message of the exchange (a 1xx, then the answer) has its own status line and headers.
        self._headers = []
        if self._exchange is not None:
            self._exchange.reason = b""

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
            raise UpstreamBadResponse(self._url, f"unsupported Content-Encoding {encoding[:20]}")
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
                raise UpstreamBadResponse(self._url, "truncated or malformed body") from exc
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
            self.close()
        self.idle_since = self._loop.time()
        return reusable

    def fail_head(self, failure: UpstreamError) -> None:
        """The caller stopped waiting for the head (cancelled): the connection cannot be reused."""
        exchange = self._exchange
        if exchange is not None:
            exchange.failure = exchange.failure or failure
        self.close()

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
        self.close(abort=True)  # nothing more is wanted from it, and a hung peer must not hold it

    def _whole_timeout(self, within_s: float) -> None:
        self._timer = None
        exchange = self._exchange
        if exchange is not None and exchange.answer is None:
            self._fail(UpstreamTimeout(self._url, "no answer in time"))
        else:  # the head came, the body did not end: an upstream dripping its answer
            self._fail(UpstreamTimeout(self._url, f"no complete answer within {within_s:g} s"))

    def _check_silence(self) -> None:
        self._timer = None
        assert self._silence_s is not None
        due = self._last_data + self._silence_s
        if self._loop.time() >= due:
            self._fail(UpstreamTimeout(self._url, "no answer in time"))
        else:  # bytes came meanwhile: look again when the silence would have lasted long enough
            self._timer = self._loop.call_at(due, self._check_silence)

    def _wake(self, exchange: _Exchange) -> None:
        if exchange.waiter is not None and not exchange.waiter.done():
            exchange.waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, *, abort: bool = False) -> None:
        """Never to be used again: closed (after what is written), or `abort`ed (at once)."""
        self.closed = True
        self.pool.discard(self)
        if self._transport is not None:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()


class Answer:
    """The upstream's answer: status, reason and headers at once, the body as it arrives."""

    __slots__ = ("_connection", "_released", "content_length", "headers", "reason", "status")

    def __init__(
        self,
        connection: UpstreamConnection,
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
            self._connection.pool.release(self._connection)


def short_reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def tls_reason(exc: ssl.SSLError) -> str:
    """A TLS failure whole, in OpenSSL's own short words (never cut, unlike `short_reason`: the words that say
    which check failed come last), with where to look when the upstream's certificate is not trusted."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return (
            f"certificate verify failed: {exc.verify_message} (the upstream's certificate must chain to "
            "upstream.tls.ca_file, or to the system's trust store when that is not set)"
        )
    if exc.reason:
        return exc.reason.lower().replace("_", " ")  # WRONG_VERSION_NUMBER, TLSV1_ALERT_UNKNOWN_CA, ...
    return str(exc) or type(exc).__name__
