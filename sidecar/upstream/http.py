"""The HTTP leg to the upstream: one pooled aiohttp session, error translation, reading JSON or SSE answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import orjson

from sidecar.config import UpstreamConfig
from sidecar.protocol.errors import (
    ShuttingDown,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from sidecar.upstream.sse import SSEDecoder, SSETooLarge

__all__ = ["UpstreamHTTP", "iter_messages", "raise_for_status", "read_limited", "translate_errors"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

SSE_CONTENT_TYPE = "text/event-stream"
_DRAIN_MARGIN_S = 1.0
"""Time kept at the end of the shutdown grace for answering aborted requests and closing down."""
_MAX_SSE_EVENT_BYTES = 16 * 1_048_576


@contextlib.contextmanager
def translate_errors(upstream: str) -> Iterator[None]:
    """Map aiohttp and asyncio failures to the UpstreamError subtree, most specific first."""
    try:
        yield
    except UpstreamError:
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeout(upstream, "no answer in time") from exc
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamUnavailable(upstream, f"cannot connect: {exc.strerror or exc.os_error}") from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise UpstreamUnavailable(upstream, "connection closed before the answer was complete") from exc
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamBadResponse(upstream, "truncated or malformed body") from exc
    except aiohttp.ClientResponseError as exc:
        raise UpstreamBadResponse(upstream, f"bad HTTP response: {exc.message}") from exc
    except aiohttp.ClientOSError as exc:
        raise UpstreamUnavailable(upstream, f"connection error: {exc.strerror or exc}") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamBadResponse(upstream, f"{type(exc).__name__}") from exc


class UpstreamHTTP:
    """Owns the connection pool; every request to the upstream goes through `post`."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.url = config.display_url
        """The upstream as it may be shown (credentials masked); requests go to the configured URL."""
        self._target = config.url
        self._config = config
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s, connect=config.connect_timeout_s)
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout_s, sock_read=config.timeout_s
        )
        # A notification stream may rightly stay silent for hours: only connecting is bounded.
        self._long_lived_timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout_s)
        self._static_headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        self._session: aiohttp.ClientSession | None = None
        self._exchanges: set[asyncio.Timeout] = set()
        """The deadline of every exchange in flight (none, until `abort_all` brings them forward to now)."""
        self._aborted = False
        self._drain_timer: asyncio.TimerHandle | None = None

    @property
    def max_response_bytes(self) -> int:
        return self._config.max_response_bytes

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._config.max_connections, enable_cleanup_closed=True)
        # auto_decompress stays on: the body we relay is re-framed, never byte-copied with its encoding.
        self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))

    async def aclose(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: exchanges still in flight near the end of `grace_s` are ended (`abort_all`), so
        their clients get an error answer before the process exits instead of a cut connection."""
        window = grace_s - min(_DRAIN_MARGIN_S, grace_s / 4)
        self._drain_timer = asyncio.get_running_loop().call_later(window, self.abort_all)

    def abort_all(self) -> None:
        """End every exchange in flight now, and refuse new ones (shutdown): each fails with ShuttingDown, which
        its caller answers as a JSON-RPC error, instead of being cut when the process exits."""
        self._aborted = True
        now = asyncio.get_running_loop().time()
        for deadline in list(self._exchanges):
            deadline.reschedule(now)

    def post(
        self, body: bytes, headers: Mapping[str, str], *, streaming: bool = False
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """POST to the upstream; the response is released when the block ends."""
        return self.send("POST", body, headers, streaming=streaming)

    @contextlib.asynccontextmanager
    async def send(
        self,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        streaming: bool = False,
        long_lived: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One HTTP exchange with the upstream endpoint; the response is released when the block ends.

        `streaming`: the answer may be a stream, each read bounded by `timeout_s`; `long_lived`: a notification
        stream, unbounded once connected.
        """
        if self._session is None:
            raise RuntimeError("UpstreamHTTP.send() called before start() or after aclose()")
        if self._aborted:
            raise ShuttingDown(self.url, "the sidecar is shutting down")
        merged = {**headers, **self._static_headers}
        timeout = self._long_lived_timeout if long_lived else self._stream_timeout if streaming else self._timeout
        with translate_errors(self.url):
            deadline = asyncio.timeout(None)
            try:
                async with deadline:
                    self._exchanges.add(deadline)
                    try:
                        async with self._session.request(
                            method,
                            self._target,
                            data=body,
                            headers=merged,
                            timeout=timeout,
                            allow_redirects=False,
                        ) as response:
                            yield response
                    finally:
                        self._exchanges.discard(deadline)
            except TimeoutError as exc:
                if deadline.expired():  # only abort_all sets a deadline
                    raise ShuttingDown(self.url, "the sidecar is shutting down") from exc
                raise

    async def get(self, url: str, limit: int) -> tuple[int, bytes]:
        """A plain GET of another URL on the upstream's host (its OAuth metadata); (status, body)."""
        if self._session is None:
            raise RuntimeError("UpstreamHTTP.get() called before start() or after aclose()")
        with translate_errors(self.url):
            async with self._session.get(url, headers=self._static_headers, timeout=self._timeout) as response:
                return response.status, await read_limited(response, limit, self.url)

    async def send_quietly(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Fire a message upstream and drop the answer (a notification, a reply to a server request)."""
        with contextlib.suppress(UpstreamError):
            async with self.post(body, headers) as response:
                await response.read()


async def read_limited(response: aiohttp.ClientResponse, limit: int, upstream: str) -> bytes:
    """The whole body, or UpstreamBadResponse when it exceeds `limit` bytes."""
    if response.content_length is not None and response.content_length > limit:
        raise UpstreamBadResponse(upstream, f"response larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    with translate_errors(upstream):
        async for chunk in response.content.iter_chunked(65536):
            size += len(chunk)
            if size > limit:
                raise UpstreamBadResponse(upstream, f"response larger than {limit} bytes")
            chunks.append(chunk)
    return b"".join(chunks)


async def iter_messages(response: aiohttp.ClientResponse, limit: int, upstream: str) -> AsyncIterator[JsonObject]:
    """JSON-RPC messages of an upstream answer, whether it is one JSON body or an SSE stream (events without
    data, such as a resumable server's priming event, carry no message)."""
    content_type = response.headers.get("Content-Type", "")
    if not content_type.startswith(SSE_CONTENT_TYPE):
        body = await read_limited(response, limit, upstream)
        yield _decode(body, upstream)
        return
    decoder = SSEDecoder(min(limit, _MAX_SSE_EVENT_BYTES))
    with translate_errors(upstream):
        async for chunk in response.content.iter_any():
            try:
                events = decoder.feed(chunk)
            except SSETooLarge as exc:
                raise UpstreamBadResponse(upstream, str(exc)) from exc
            for event in events:
                yield _decode(event.data.encode(), upstream)


async def raise_for_status(response: aiohttp.ClientResponse, http: UpstreamHTTP) -> None:
    """Non-2xx: a JSON-RPC error body passes through as UpstreamRpcError, anything else is an HTTP error."""
    if 200 <= response.status < 300:
        return
    body = await read_limited(response, http.max_response_bytes, http.url)
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        message = None
    if isinstance(message, dict) and isinstance(message.get("error"), dict) and response.status not in (401, 403):
        raise UpstreamRpcError(http.url, message["error"], http_status=response.status)
    challenge = {k: v for k, v in response.headers.items() if k.lower() == "www-authenticate"}
    raise UpstreamHTTPError(http.url, response.status, response.reason or "", challenge)


def _decode(body: bytes, upstream: str) -> JsonObject:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamBadResponse(upstream, "answer is not JSON") from exc
    if not isinstance(message, dict):
        raise UpstreamBadResponse(upstream, "answer is not a JSON-RPC object")
    return message
