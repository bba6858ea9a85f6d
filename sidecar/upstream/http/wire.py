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
The connection, its parser and timers, and the `Answer` are `connection.py`: an exchange costs no task and no
context manager.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from sidecar.protocol import ShuttingDown, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from sidecar.upstream.http.connection import Answer, UpstreamConnection, short_reason, tls_reason

__all__ = ["Answer", "WirePool"]

_IDLE_KEEP_S = 15.0
"""An idle connection older than this is closed instead of reused (servers drop theirs after 5-75 s)."""


class WirePool:
    """Connections to one origin: at most `max_connections`, the most recently used reused first."""

    def __init__(
        self,
        url: str,
        display_url: str,
        *,
        max_connections: int,
        connect_timeout_s: float,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
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
        self._ssl = (tls or ssl.create_default_context()) if self._tls else None
        self._server_name = server_name or self._host
        self._connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[UpstreamConnection] = []
        self._busy: set[UpstreamConnection] = set()
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
        self._refuse_if_aborted()
        request = self._request(method, body, headers)
        await self._slots.acquire()
        try:
            for attempt in (1, 2):
                connection = self._reuse() or await self._connect()
                if self._aborted is not None:  # aborted while this exchange waited for its slot or connection
                    connection.close()
                    self._refuse_if_aborted()
                head: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
                self._busy.add(connection)
                connection.start(request, head, within_s)
                try:
                    return await head
                except BaseException as exc:
                    if not isinstance(exc, UpstreamError):  # cancelled: the answer would arrive for nobody
                        connection.fail_head(UpstreamUnavailable(self.url, "exchange abandoned"))
                    self.release(connection, slot=False)
                    # A kept-alive connection the upstream had closed before this request reached it:
                    stale = (
                        isinstance(exc, UpstreamUnavailable) and connection.exchanges > 1 and not connection.got_bytes
                    )
                    if idempotent and attempt == 1 and stale and self._aborted is None:
                        continue
                    raise
            raise AssertionError("unreachable")
        except BaseException:
            self._slots.release()
            raise

    def use_tls(self, context: ssl.SSLContext) -> None:
        """Connections made from now on use `context`; those already open keep theirs until they close."""
        if self._tls:
            self._ssl = context

    def _refuse_if_aborted(self) -> None:
        # A method, not an inline test: the pool may be aborted at any await of `exchange`.
        if self._aborted is not None:
            raise self._aborted

    def release(self, connection: UpstreamConnection, *, slot: bool = True) -> None:
        self._busy.discard(connection)
        if connection.finish():
            self._idle.append(connection)
        if slot:
            self._slots.release()

    def discard(self, connection: UpstreamConnection) -> None:
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
            connection.close()
        self._idle.clear()
        self._busy.clear()

    def _reuse(self) -> UpstreamConnection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < _IDLE_KEEP_S:
                return connection
            connection.close()
        return None

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self.url, self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._server_name if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(self.url, "no answer in time") from exc
        except ssl.SSLError as exc:
            raise UpstreamUnavailable(self.url, f"TLS failed: {tls_reason(exc)}") from exc
        except OSError as exc:
            raise UpstreamUnavailable(self.url, f"cannot connect: {exc.strerror or short_reason(exc)}") from exc
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
