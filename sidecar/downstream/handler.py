"""The MCP endpoint: reads a POST, validates its envelope, and routes it to discover, listen, or the upstream."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web
from cachetools import LRUCache

from sidecar.config import SidecarConfig
from sidecar.downstream.client_address import ClientAddresses
from sidecar.downstream.discover import build_discover_result
from sidecar.downstream.event_stream import EventStream
from sidecar.downstream.guards import check_host_and_origin, read_body
from sidecar.downstream.legacy import LegacySessions
from sidecar.downstream.readthrough import ReadThrough, is_shareable
from sidecar.fair_share import FairShare
from sidecar.identity import Identity, IdentityRule
from sidecar.observability.metrics import Metrics, method_label
from sidecar.observability.tracing import tracing
from sidecar.protocol import (
    HEADER_SESSION_ID,
    REMOVED_METHODS,
    InternalError,
    JsonObject,
    Message,
    MethodNotFound,
    RequestId,
    RpcError,
    TooManyRequests,
    UpstreamError,
    UpstreamHTTPError,
    detect_era,
    error_response,
    parse_message,
    result_response,
    validate_modern,
)
from sidecar.upstream.answers import Reply
from sidecar.upstream.base import Forward

__all__ = [
    "ForwardObserver",
    "ListenHandler",
    "McpEndpoint",
    "json_response",
    "no_tracebacks",
]

logger = logging.getLogger(__name__)

ListenHandler = Callable[[web.Request, Message, Identity], Awaitable[web.StreamResponse]]

# Typed keys: a plain string key makes aiohttp warn (NotAppKeyWarning), an error under our test settings.
_METHOD_KEY = web.RequestKey("mcp_sidecar.method", str)
_OUTCOME_KEY = web.RequestKey("mcp_sidecar.outcome", str)
_TRACE_KEY = web.RequestKey("mcp_sidecar.trace_id", str)
"""The request's trace id while tracing is on: its duration's exemplar."""

_ACCEPTED_CONTEXTS = 10_000
"""Accepted credentials remembered (least recently used go first, and count against their address again)."""


class ForwardObserver(Protocol):
    """Told about every forwarded request that succeeded (the watch engine learns from them)."""

    def ticket(self) -> int:
        """Taken before forwarding, so what the answer shows is ordered against concurrent polls."""
        ...

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None: ...

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` this request with 401/403."""
        ...


def json_response(payload: JsonObject, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    response = web.Response(body=orjson.dumps(payload), status=status, headers=headers)
    response.content_type = "application/json"
    return response


class McpEndpoint:
    """POST {listen.path}: the whole downstream request path, except the listen stream itself."""

    def __init__(
        self,
        config: SidecarConfig,
        upstream: Forward,
        *,
        identities: IdentityRule,
        listen: ListenHandler | None = None,
        observer: ForwardObserver | None = None,
        readthrough: ReadThrough | None = None,
        metrics: Metrics | None = None,
        legacy: LegacySessions,
        fair_share: FairShare,
    ) -> None:
        self._legacy = legacy
        self._fair_share = fair_share
        self._addresses = ClientAddresses(config.listen.trusted_proxies, config.listen.forwarded_header)
        self._queue_wait_s = config.upstream.timeout_s
        """A request's own deadline bounds its wait for a slot too."""
        self._accepted: LRUCache[str, bool] = LRUCache(maxsize=_ACCEPTED_CONTEXTS)
        """Contexts whose credential the upstream accepted (answered below 400): each is a client of its own."""
        self._identities = identities
        self._metrics = metrics or Metrics()
        self._config = config
        self._upstream = upstream
        self._listen = listen
        self._observer = observer
        self._readthrough = readthrough
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}
        """(method label, outcome) -> the labelled request counter and duration histogram, resolved once."""

    async def handle_post(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        status: int | None = None
        try:
            response = await self._handle(request)
            status = response.status
            return response
        finally:
            # Counted in `finally`: a listen stream ends with the client going away, which cancels us.
            method = method_label(request.get(_METHOD_KEY, "other"))
            if status is None:
                outcome = "ok" if method == "subscriptions/listen" else "cancelled"
            else:
                outcome = request.get(_OUTCOME_KEY) or ("ok" if status < 400 else "error")
            counter, duration = self._request_series(method, outcome)
            counter.inc()
            if method != "subscriptions/listen":  # a stream's life is not a request's latency
                trace_id = request.get(_TRACE_KEY)
                exemplar = {"trace_id": trace_id} if trace_id else None
                duration.observe(time.monotonic() - started, exemplar)

    def _identity(self, request: web.Request) -> Identity:
        address = self._addresses.of(request)
        identity = self._identities.of(request.headers, address)
        if not identity.is_anonymous and identity.context not in self._accepted:
            # Until the upstream has accepted this credential once, it counts against its address: made-up
            # tokens, one per request, would otherwise each bring a fair share of their own. Within the
            # address's turn it has a lane of its own, so a newcomer does not wait behind a stranger's queue.
            identity = dataclasses.replace(identity, client=f"addr-{address}", lane=identity.context)
        return identity

    def _accepted_by_upstream(self, identity: Identity, status: int) -> None:
        if not identity.is_anonymous and status < 400:
            self._accepted[identity.context] = True

    def _request_series(self, method: str, outcome: str) -> tuple[Any, Any]:
        # Resolving labelled children costs more than the observation itself (labels come from small fixed sets).
        key = (method, outcome)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = (
                self._metrics.requests.labels(method, outcome),
                self._metrics.request_duration.labels(method),
            )
        return series

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        request_id: RequestId | None = None
        try:
            refused = check_host_and_origin(request, self._config.listen)
            if refused is not None:
                raise refused
            identity = self._identity(request)  # once per request; a repeated identity header: 400
            body = await read_body(request, self._config.listen.max_body_bytes, self._config.listen.body_timeout_s)
            message: Message | None = None
            if HEADER_SESSION_ID not in request.headers:
                message = parse_message(body)
                request_id = message.id
                request[_METHOD_KEY] = message.method
            if message is None or detect_era(message, request.headers) == "legacy":
                return await self._legacy_post(request, body, message, identity)
            validate_modern(message, request.headers)
            if message.is_notification:
                return web.Response(status=202)
            del body  # a listen stream outlives its request by hours: the bytes it was parsed from are not kept
            return await self._route(request, message, identity)
        except RpcError as exc:
            return self._error(exc.request_id if exc.request_id is not None else request_id, exc)
        except UpstreamHTTPError as exc:
            return self._error(request_id, exc.to_rpc(), self._upstream.public_headers(exc.headers))
        except UpstreamError as exc:
            return self._error(request_id, exc.to_rpc())
        except Exception:  # boundary: a bug handling one request must not reach the client as a traceback
            logger.exception("unexpected failure handling a request")
            return self._error(request_id, InternalError("internal error"))

    async def _legacy_post(
        self, request: web.Request, body: bytes, message: Message | None, identity: Identity
    ) -> web.StreamResponse:
        # Legacy sessions are served by the sidecar, riding on an upstream session of their own.
        ticket = self._observer.ticket() if self._observer is not None else 0
        if message is None:  # a session's request: `_handle` left parsing it to here (a bad body is relayed)
            with contextlib.suppress(RpcError):
                message = parse_message(body)
        answer = await self._legacy.handle_post(request, body, message, identity)
        if isinstance(answer, web.StreamResponse):
            return answer  # served here (initialize, subscribe, ping): nothing went upstream
        try:
            return await self._write_reply(request, answer)
        finally:
            self._accepted_by_upstream(identity, answer.status)
            # What a 2026-07-28 client's request teaches the watches, a 2025 client's teaches them too (a write),
            # even when the client closes as soon as it has its result, before the relayed stream has ended.
            if self._observer is not None and message is not None and not message.is_notification:
                if answer.status < 500:
                    self._observer.after_forward(message.method, message.params, identity, {}, ticket)

    async def handle_protected_resource_metadata(self, request: web.Request) -> web.Response:
        """GET /.well-known/oauth-protected-resource[/path]: the upstream's metadata, naming the sidecar."""
        public_url = self._config.upstream.public_url or f"{request.scheme}://{request.host}{self._config.listen.path}"
        document = await self._upstream.protected_resource_metadata(public_url)
        if document is None:
            return web.json_response({"error": "the upstream publishes no protected-resource metadata"}, status=404)
        return json_response(document)

    async def handle_get(self, request: web.Request) -> web.StreamResponse:
        """GET: a legacy session's SSE stream; without a session, 405 (the modern era has no GET)."""
        if HEADER_SESSION_ID not in request.headers:
            return web.Response(status=405, headers={"Allow": "POST"})
        return await self._legacy_call(request, self._legacy.handle_get)

    async def handle_delete(self, request: web.Request) -> web.StreamResponse:
        """DELETE: end a legacy session; without a session, 405."""
        if HEADER_SESSION_ID not in request.headers:
            return web.Response(status=405, headers={"Allow": "POST"})
        return await self._legacy_call(request, self._legacy.handle_delete)

    async def _legacy_call(
        self, request: web.Request, call: Callable[[web.Request, Identity], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = check_host_and_origin(request, self._config.listen)
        try:
            if refused is not None:
                raise refused
            return await call(request, self._identity(request))
        except RpcError as exc:
            return self._error(None, exc)
        except UpstreamError as exc:
            return self._error(None, exc.to_rpc())

    async def _route(self, request: web.Request, message: Message, identity: Identity) -> web.StreamResponse:
        method = message.method
        if method in REMOVED_METHODS:
            raise MethodNotFound("Method not found", method)
        if method == "server/discover":
            # During an outage, the last discovery this context was given: a client can connect and listen.
            info, cached = await self._upstream.discovery(identity)
            result = build_discover_result(info, subscriptions=self._listen is not None, cached=cached)
            return json_response(result_response(message.id, result))
        if method == "subscriptions/listen":
            if self._listen is None:
                raise MethodNotFound("Method not found", method)
            return await self._listen(request, message, identity)
        with tracing().request(method, request.headers, message.meta):
            trace_id = tracing().trace_id()
            if trace_id is not None:
                request[_TRACE_KEY] = trace_id
            return await self._forward_and_answer(request, message, identity)

    async def _forward_and_answer(
        self, request: web.Request, message: Message, identity: Identity
    ) -> web.StreamResponse:
        method = message.method
        ticket = self._observer.ticket() if self._observer is not None else 0
        try:
            reply, shared = await self._forward(request, message, identity, ticket)
        except UpstreamHTTPError as exc:
            if exc.is_auth_failure:
                self._refused(message, identity)
            raise
        if shared is not None:
            return json_response({**shared, "id": message.id})
        try:
            return await self._write_reply(request, reply)
        finally:
            self._accepted_by_upstream(identity, reply.status)
            # Also when the client leaves mid-answer (an SSE client may close once it has its result, and the
            # handler is cancelled): the upstream did the work, so a write still revalidates the watches.
            if reply.status in (401, 403):
                self._refused(message, identity)
            elif self._observer is not None and reply.status < 500:
                self._observer.after_forward(method, message.params, identity, reply.message or {}, ticket)

    async def _forward(
        self, request: web.Request, message: Message, identity: Identity, ticket: int
    ) -> tuple[Reply, JsonObject | None]:
        """The upstream's reply to this request, or a ready answer: a cached one, or the one an identical request
        in flight got (its id is replaced by this request's)."""

        def send(started: Callable[[], None] = _nothing) -> Awaitable[Reply]:
            async def exchange() -> Reply:
                started()  # it holds its slot: others may now wait on its answer
                with tracing().upstream(message.method):
                    return await self._upstream.forward(message, request.headers, identity)

            # In the client's turn: over its fair share it waits in its own queue (invariant 20).
            return self._fair_share.run(identity.client, exchange, within_s=self._queue_wait_s, lane=identity.lane)

        if self._readthrough is None or not is_shareable(message.method, message.params):
            return await send(), None
        cached = self._readthrough.lookup(message.method, message.params, identity.context)
        if cached is not None:
            # Answered as it is: an older answer is no evidence for the watches (see `after_forward`'s ticket).
            return Reply(200), result_response(message.id, cached)
        reply, shared = await self._readthrough.fetch(
            message.method, message.params, identity.context, send, ticket, identity.client
        )
        if reply is None and shared is None:
            reply = await send()
        return (reply, None) if reply is not None else (Reply(200), shared)

    def _refused(self, message: Message, identity: Identity) -> None:
        # The upstream refused this client: nothing shared or watched may keep reaching it on someone else's word.
        if self._readthrough is not None:
            self._readthrough.refused(message.method, message.params, identity.context)
        if self._observer is not None:
            self._observer.refused(message.method, message.params, identity)

    async def _write_reply(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        if reply.stream is None:
            if reply.body is not None:
                return web.Response(body=reply.body, status=reply.status, headers=reply.headers)
            if reply.message is None:
                return web.Response(status=reply.status, headers=reply.headers)
            if "error" in reply.message:
                request[_OUTCOME_KEY] = "error"
            return json_response(reply.message, reply.status, reply.headers)
        events = EventStream(request, status=reply.status, headers=reply.headers)
        try:
            async with contextlib.aclosing(reply.stream) as chunks:
                await events.open()
                async for chunk in chunks:
                    await events.send(chunk)
            await events.close()
        except ConnectionResetError:
            # The client went away mid-stream (a client may stop reading once it has its answer): an ordinary
            # end, not an unexpected failure to log with a traceback and answer with an error nobody can read.
            pass
        return events.response

    def _error(
        self, request_id: RequestId | None, error: RpcError, headers: dict[str, str] | None = None
    ) -> web.Response:
        told = isinstance(error.data, dict) and "error_id" in error.data  # logged with its details already
        if error.status >= 500 and not told:
            logger.warning("request failed: %s", error.message)
        if isinstance(error, TooManyRequests):
            headers = {**(headers or {}), "Retry-After": str(error.retry_after_s)}
        return json_response(error_response(request_id, error), error.status, headers)


def _nothing() -> None:
    return None


@web.middleware
async def no_tracebacks(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """Boundary: an unexpected failure becomes a JSON-RPC internal error, logged, never shown to the client."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:  # boundary: one bad request must never take the process or other clients down
        logger.exception("unexpected failure handling %s %s", request.method, request.path)
        return json_response(error_response(None, InternalError("internal error")), 500)
