"""The HTTP leg to the upstream: exchanges with its endpoint on the wire pool (`wire.py`), reading JSON or SSE
answers, and the shutdown's abort."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping

import aiohttp
import orjson

from sidecar.config import UpstreamConfig
from sidecar.protocol import (
    JsonObject,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamRpcError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from sidecar.tls import upstream_context
from sidecar.upstream.answers import json_object
from sidecar.upstream.http.wire import Answer, WirePool
from sidecar.upstream.sse import SSE_CONTENT_TYPE, SSEDecoder, SSETooLarge

__all__ = ["UpstreamHTTP", "iter_messages", "raise_for_status", "read_limited", "status_error"]

logger = logging.getLogger(__name__)


_DRAIN_MARGIN_S = 1.0
"""Time kept at the end of the shutdown grace for answering aborted requests and closing down."""
_MAX_SSE_EVENT_BYTES = 16 * 1_048_576


@contextlib.contextmanager
def _translate_errors(upstream: str) -> Iterator[None]:
    """Map aiohttp and asyncio failures to the UpstreamError subtree, most specific first (`get` only: the
    endpoint's exchanges go through the wire pool, which raises UpstreamErrors itself)."""
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


class _Exchange:
    """`UpstreamHTTP.send`'s block: the answer inside it, released when it ends (a plain class: entered on every
    forwarded request and poll, where a generator-based context manager costs more than the rest of the glue)."""

    __slots__ = ("_answer", "_body", "_headers", "_idempotent", "_method", "_pool", "_within_s")

    def __init__(
        self,
        pool: WirePool,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        within_s: float | None,
        idempotent: bool,
    ) -> None:
        self._pool = pool
        self._method = method
        self._body = body
        self._headers = headers
        self._within_s = within_s
        self._idempotent = idempotent
        self._answer: Answer | None = None

    async def __aenter__(self) -> Answer:
        self._answer = await self._pool.exchange(
            self._method, self._body, self._headers, within_s=self._within_s, idempotent=self._idempotent
        )
        return self._answer

    async def __aexit__(self, *_: object) -> None:
        if self._answer is not None:
            self._answer.release()


class UpstreamHTTP:
    """Owns the connections to the upstream; every exchange with its endpoint goes through `send`."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.url = config.display_url
        """The upstream as it may be shown (credentials masked); requests go to the configured URL."""
        self._config = config
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s, connect=config.connect_timeout_s)
        self._static_headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        self._pool: WirePool | None = None
        self._session: aiohttp.ClientSession | None = None
        """For `get` only (another URL of the upstream's host, rarely): the endpoint's exchanges use the pool."""
        self._drain_timer: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None

    @property
    def max_response_bytes(self) -> int:
        return self._config.max_response_bytes

    @property
    def timeout_s(self) -> float:
        return self._config.timeout_s

    async def start(self) -> None:
        config = self._config
        tls = upstream_context(config.tls) if config.url.startswith("https://") else None
        if tls is not None and not config.tls.verify:
            logger.warning(
                "upstream.tls.verify is false: any certificate is accepted, so anyone on the way to the upstream "
                "can read and change its traffic, credentials included",
                extra={"upstream": self.url},
            )
        self._pool = WirePool(
            config.url,
            self.url,
            max_connections=config.max_connections,
            connect_timeout_s=config.connect_timeout_s,
            tls=tls,
            server_name=config.tls.server_name,
        )
        self._tls = tls
        self._session = aiohttp.ClientSession(skip_auto_headers=("User-Agent",))

    def use_tls(self, context: ssl.SSLContext) -> None:
        """New connections to the upstream use `context` (its certificate files were read again)."""
        self._tls = context
        if self._pool is not None:
            self._pool.use_tls(context)

    async def aclose(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
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
        if self._pool is not None:
            self._pool.abort_all()

    async def open(
        self, method: str, body: bytes | None, headers: Mapping[str, str], *, idempotent: bool = False
    ) -> Answer:
        """`send` without the block: the caller releases the answer (or hands it on to something that will)."""
        pool = self._started("open")
        within_s = self._config.timeout_s
        return await pool.exchange(method, body, self._with_static(headers), within_s=within_s, idempotent=idempotent)

    def post(self, body: bytes, headers: Mapping[str, str], *, idempotent: bool = False) -> _Exchange:
        """POST to the upstream, the whole answer within `timeout_s`; released when the block ends."""
        return self.send("POST", body, headers, idempotent=idempotent)

    def send(
        self,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        long_lived: bool = False,
        idempotent: bool = False,
    ) -> _Exchange:
        """One HTTP exchange with the upstream endpoint; the answer is released when the block ends.

        The whole answer must arrive within `timeout_s` unless the caller declares it a stream
        (`Answer.unbounded`); `long_lived`: a notification stream, unbounded once connected. `idempotent`: a
        request that may be sent again when a kept-alive connection turns out closed before it was answered.
        """
        pool = self._started("send")
        within_s = None if long_lived else self._config.timeout_s
        return _Exchange(pool, method, body, self._with_static(headers), within_s, idempotent)

    def _started(self, caller: str) -> WirePool:
        if self._pool is None:
            raise RuntimeError(f"UpstreamHTTP.{caller}() called before start() or after aclose()")
        return self._pool

    def _with_static(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The request's headers with `upstream.headers` over them (no copy when there are none)."""
        return {**headers, **self._static_headers} if self._static_headers else headers

    async def get(self, url: str, limit: int) -> tuple[int, bytes]:
        """A plain GET of another URL on the upstream's host (its OAuth metadata); (status, body)."""
        if self._session is None:
            raise RuntimeError("UpstreamHTTP.get() called before start() or after aclose()")
        with _translate_errors(self.url):
            async with self._session.get(
                url, headers=self._static_headers, timeout=self._timeout, ssl=self._tls if self._tls else True
            ) as response:
                body = await _read_within(response.content.iter_any(), response.content_length, limit, self.url)
                return response.status, body

    async def send_quietly(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Fire a message upstream and drop the answer (a notification, a reply to a server request)."""
        with contextlib.suppress(UpstreamError):
            async with self.post(body, headers) as response:
                await response.read()


async def read_limited(response: Answer, limit: int, upstream: str) -> bytes:
    """The whole body, or UpstreamBadResponse when it exceeds `limit` bytes."""
    return await _read_within(response.iter_any(), response.content_length, limit, upstream)


async def _read_within(body: AsyncIterator[bytes], content_length: int | None, limit: int, upstream: str) -> bytes:
    if content_length is not None and content_length > limit:
        raise UpstreamBadResponse(upstream, f"response larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise UpstreamBadResponse(upstream, f"response larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def iter_messages(response: Answer, limit: int, upstream: str) -> AsyncIterator[JsonObject]:
    """JSON-RPC messages of an upstream answer, whether it is one JSON body or an SSE stream (events without
    data, such as a resumable server's priming event, carry no message)."""
    content_type = response.headers.get("Content-Type", "")
    if not content_type.startswith(SSE_CONTENT_TYPE):
        body = await read_limited(response, limit, upstream)
        yield _decode(body, upstream)
        return
    decoder = SSEDecoder(min(limit, _MAX_SSE_EVENT_BYTES))
    async for chunk in response.iter_any():
        try:
            events = decoder.feed(chunk)
        except SSETooLarge as exc:
            raise UpstreamBadResponse(upstream, str(exc)) from exc
        for event in events:
            yield _decode(event.data.encode(), upstream)


async def raise_for_status(response: Answer, http: UpstreamHTTP) -> None:
    """Non-2xx: a JSON-RPC error body passes through as UpstreamRpcError, anything else is an HTTP error."""
    if 200 <= response.status < 300:
        return
    raise status_error(response, await read_limited(response, http.max_response_bytes, http.url), http)


def status_error(response: Answer, body: bytes, http: UpstreamHTTP) -> UpstreamError:
    """The error a non-2xx answer whose body was `body` is: see `raise_for_status`."""
    message = json_object(body)
    if message is not None and isinstance(message.get("error"), dict) and response.status not in (401, 403):
        return UpstreamRpcError(http.url, message["error"], http_status=response.status)
    challenge = {k: v for k, v in response.headers.items() if k.lower() == "www-authenticate"}
    return UpstreamHTTPError(http.url, response.status, response.reason or "", challenge)


def _decode(body: bytes, upstream: str) -> JsonObject:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamBadResponse(upstream, "answer is not JSON") from exc
    if not isinstance(message, dict):
        raise UpstreamBadResponse(upstream, "answer is not a JSON-RPC object")
    return message
