"""The upstream surface over a stdio server: what `UpstreamClient` does over HTTP, for a child process.

A sibling of `UpstreamClient` with the same surface (`sidecar.upstream.base.Upstream`), chosen by
`app.py` when `upstream.command` is set. One child session serves every client: a stdio server has no
HTTP, so it has one authorization context, and clients' `Authorization` goes nowhere. The era bridge
works both ways over that session: a 2026-07-28 client's request to a 2025-11-25 child loses the
modern `_meta` keys, and its result is stamped (`resultType`, `ttlMs`, `cacheScope`) and its errors
mapped, as `LegacyBridge` does over HTTP; a 2025-11-25 client session's request to a 2026-07-28 child
gains the modern `_meta` the child needs. A 2025-11-25 client's `initialize` is answered from the
child's own handshake, `notifications/initialized` goes nowhere, and `notifications/cancelled` reaches
the child with the child-side id of the request it names. A request that asked for progress is
answered as an SSE stream, its progress as it comes and then the answer, as an HTTP upstream's SSE
answer is relayed. The child process, its pipes and restarts live in `stdio` and `stdio_supervisor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

from sidecar.config import CacheConfig, UpstreamConfig
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics, method_label
from sidecar.protocol.constants import HANDSHAKE_VERSIONS, HEADER_SESSION_ID, LEGACY_VERSION
from sidecar.protocol.envelope import Message, RequestId
from sidecar.protocol.errors import (
    InvalidRequest,
    UpstreamError,
    UpstreamRpcError,
    UpstreamTimeout,
)
from sidecar.protocol.frames import SERVER_INFO, error_response, modern_request_meta, stamp_result
from sidecar.upstream.answers import Reply, UpstreamInfo
from sidecar.upstream.base import Headers, NotificationListener
from sidecar.upstream.era import map_legacy_error, strip_modern_meta
from sidecar.upstream.sse import SSE_CONTENT_TYPE
from sidecar.upstream.stdio.child import InFlight, StdioChild
from sidecar.upstream.stdio.frames import (
    checked,
    event,
    for_subscription,
    json_object,
    response,
    streamed,
    until_ended,
    with_modern_meta,
)
from sidecar.upstream.stdio.supervisor import StdioSupervisor

__all__ = ["StdioUpstream"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

_READY_FRESH_S = 2.0
"""A readiness check trusts a child heard from this recently; otherwise it is probed (a liveness check too)."""
_DRAIN_MARGIN_S = 1.0
_MAX_QUEUED_NOTIFICATIONS = 1024
"""Progress notifications of one request waiting for its client; beyond, the oldest are dropped (the newest
progress says the most)."""
_JSON = {"Content-Type": "application/json"}


class StdioUpstream:
    """The upstream, when it is a child process the sidecar starts and speaks to on its stdin and stdout."""

    def __init__(self, config: UpstreamConfig, cache: CacheConfig, metrics: Metrics | None = None) -> None:
        self.url = config.display_url
        self._config = config
        self._cache = cache
        self._metrics = metrics or Metrics()
        self._supervisor = StdioSupervisor(config, self._metrics, on_ready=self._child_ready)
        self._readies = 0
        self._series_cache: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._relayed: dict[tuple[str, RequestId], tuple[StdioChild, InFlight]] = {}
        """Legacy sessions' requests in flight, by (session, the client's id): where `notifications/cancelled` goes."""
        self._drain_timer: asyncio.TimerHandle | None = None
        self.on_recovered: Callable[[], None] | None = None
        """Called when the child answers its handshake again after a restart."""
        self._ready = asyncio.Event()
        """Set when a child answers its handshake: what `reached` waits for."""

    # -- state ---------------------------------------------------------------------------------------------

    @property
    def info(self) -> UpstreamInfo | None:
        return self._supervisor.info

    @property
    def up(self) -> bool | None:
        """True while the child is ready; False while it is down or restarting; None before its first start."""
        if self._supervisor.state == "ready":
            return True
        return False if self._readies or self._supervisor.state == "down" else None

    @property
    def last_error(self) -> str | None:
        return None if self._supervisor.state == "ready" else self._supervisor.reason

    @property
    def pid(self) -> int | None:
        """The child's process id (its process group's too), while one runs."""
        return self._supervisor.child_pid

    def add_notification_listener(self, listener: NotificationListener) -> Callable[[], None]:
        """Hand `listener` each notification the child sends on its own (list changes, resource updates, log
        messages); returns an idempotent remover. Progress goes to the request that asked for it instead."""
        return self._supervisor.add_listener(listener)

    def _child_ready(self) -> None:
        self._readies += 1
        self._ready.set()
        if self._readies > 1:
            logger.info("upstream reachable again", extra={"upstream": self.url})
            if self.on_recovered is not None:
                self.on_recovered()

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child (StdioStartError when it cannot run at all); its handshake completes behind."""
        await self._supervisor.start()

    async def aclose(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        await self._supervisor.aclose()

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: requests still waiting near the end of `grace_s` are answered with an error."""
        window = grace_s - min(_DRAIN_MARGIN_S, grace_s / 4)
        self._drain_timer = asyncio.get_running_loop().call_later(window, self._supervisor.abort_all)

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        """What the child's handshake said (waiting for it while the child starts)."""
        return (await self._supervisor.session())[1]

    async def reached(self) -> UpstreamInfo:
        """What a child's handshake said, once one has answered it (waiting through restarts)."""
        while True:
            info = self.info
            if self.up and info is not None:
                return info
            self._ready.clear()
            await self._ready.wait()

    @property
    def retry_in_s(self) -> float | None:
        return None  # the supervisor's reason says when the child is started again

    @property
    def unusable(self) -> str | None:
        return None  # a child that writes no MCP fails its handshake: it is down (and restarted), not unusable

    @property
    def not_ready_reason(self) -> str | None:
        if self.up:
            return None
        return self.last_error or "the stdio server is starting"

    async def check(self) -> bool:
        """Readiness: the child is ready and answered lately; when it has been quiet, it is probed first."""
        child = self._supervisor.child
        if self._supervisor.state == "ready" and child is not None:
            if time.monotonic() - child.last_heard_at > _READY_FRESH_S:
                await self._supervisor.probe()
        return self.up is True

    # -- what an HTTP upstream has and a stdio one does not ----------------------------------------------------

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return headers

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        return None  # no HTTP, no OAuth: there is nothing to protect the child with

    # -- modern clients -------------------------------------------------------------------------------------

    async def forward(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A 2026-07-28 client's request, answered in its era whatever the child speaks."""
        with self._observe(message.method):
            child, info = await self._supervisor.session()
            method, params = message.method, message.params
            sent = strip_modern_meta(params) if info.era == "legacy" else params

            def for_client(answer: JsonObject) -> JsonObject:
                return self._translated(method, params, answer) if info.era == "legacy" else checked(self.url, answer)

            if streamed(method, sent):
                return await self._stream(child, method, sent, message.id, for_client)
            answer = await child.request(method, sent, timeout_s=self._config.timeout_s)
            return Reply(200, dict(_JSON), message=response(message.id, for_client(answer)))

    # -- 2025-11-25 client sessions -------------------------------------------------------------------------

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None = None,
        http_method: str = "POST",
    ) -> Reply:
        """A 2025-11-25 client session's message. Sessions are names only: they all ride the child's one session,
        so a GET has no stream of the child's to merge (its notifications are hints, not client traffic) and a
        DELETE ends nothing there."""
        if http_method == "GET":
            return Reply(405, {"Allow": "POST"})
        if http_method != "POST":
            return Reply(200)
        message = json_object(body)
        if message is None:
            return Reply(400, dict(_JSON), message=error_response(None, InvalidRequest("not a JSON-RPC message")))
        method = message.get("method")
        if not isinstance(method, str):
            return Reply(202)  # the client's answer to a request of the child's, which was answered already
        raw_params = message.get("params")
        params: JsonObject = raw_params if isinstance(raw_params, dict) else {}
        session = session_id or ""
        with self._observe("legacy-session"):
            child, info = await self._supervisor.session()
            if "id" not in message:
                self._relay_notification(child, session, method, params)
                return Reply(202)
            request_id: RequestId = message["id"]
            if method == "initialize":
                return self._initialize_reply(request_id, params, info)
            sent = with_modern_meta(params) if info.era == "modern" else params
            if streamed(method, sent):
                return await self._stream(child, method, sent, request_id, lambda answer: checked(self.url, answer))
            key = (session, request_id)

            def cancellable(call: InFlight) -> None:
                self._relayed[key] = (child, call)

            try:
                answer = await child.request(method, sent, timeout_s=self._config.timeout_s, on_sent=cancellable)
            finally:
                self._relayed.pop(key, None)
            return Reply(200, dict(_JSON), message=response(request_id, checked(self.url, answer)))

    def _initialize_reply(self, request_id: RequestId, params: JsonObject, info: UpstreamInfo) -> Reply:
        if info.era == "legacy":
            result = copy.deepcopy(self._supervisor.handshake)  # the caller adds its own capabilities to it
        else:
            requested = params.get("protocolVersion")
            result = {
                "protocolVersion": requested if requested in HANDSHAKE_VERSIONS else LEGACY_VERSION,
                "capabilities": copy.deepcopy(info.capabilities),
                "serverInfo": dict(info.server_info or SERVER_INFO),
            }
            if info.instructions is not None:
                result["instructions"] = info.instructions
        headers = {**_JSON, HEADER_SESSION_ID: f"stdio-{secrets.token_urlsafe(12)}"}
        return Reply(200, headers, message={"jsonrpc": "2.0", "id": request_id, "result": result})

    def _relay_notification(self, child: StdioChild, session: str, method: str, params: JsonObject) -> None:
        # Only cancellation reaches the shared session: the child-side id of that client's own request. The
        # rest (initialized, roots changes) describes one client's session, which the child's is not.
        if method != "notifications/cancelled":
            return
        request_id = params.get("requestId")
        if not isinstance(request_id, str | int):
            return
        target = self._relayed.get((session, request_id))
        if target is not None:
            owner, call = target
            owner.forget(call, str(params.get("reason") or "cancelled by the client"))

    # -- the sidecar's own calls -----------------------------------------------------------------------------

    async def call(self, method: str, params: JsonObject, identity: Identity = ANONYMOUS_IDENTITY) -> JsonObject:
        """One request on the sidecar's behalf (a poll); returns the result or raises an UpstreamError."""
        with self._observe(method):
            child, info = await self._supervisor.session()
            sent = {**params, "_meta": modern_request_meta()} if info.era == "modern" else params
            answer = await child.request(method, sent, timeout_s=self._config.timeout_s)
        answer = self._translated(method, params, answer) if info.era == "legacy" else checked(self.url, answer)
        if "error" in answer:
            raise UpstreamRpcError(self.url, answer["error"])
        result: JsonObject = answer["result"]
        return result

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """The child's own notifications while the block runs: a 2026-07-28 child's listen with the filter
        `wanted` (its ack first), or every notification a 2025-11-25 child sends on its own. It ends when the
        child does (a restarted child has forgotten its subscriptions: the caller opens it again)."""
        child, info = await self._supervisor.session()
        queue: asyncio.Queue[JsonObject] = asyncio.Queue(maxsize=_MAX_QUEUED_NOTIFICATIONS)

        def put(notification: JsonObject) -> None:
            if queue.full():
                queue.get_nowait()  # the newest say the most; these are hints, not content
            queue.put_nowait(notification)

        if info.era == "modern":
            params = {"notifications": wanted, "_meta": modern_request_meta()}
            call = await child.send("subscriptions/listen", params, on_notification=put)
            try:
                yield until_ended(queue, child, call.answer)
            finally:
                child.forget(call, "the sidecar stopped listening")
        else:
            remove = self.add_notification_listener(put)
            try:
                yield until_ended(queue, child, None)
            finally:
                remove()

    # -- helpers ---------------------------------------------------------------------------------------------

    def _translated(self, method: str, params: JsonObject, answer: JsonObject) -> JsonObject:
        """A 2025-11-25 child's answer as a 2026-07-28 client needs it: stamped result or mapped error."""
        answer = checked(self.url, answer)
        if "error" in answer:
            return {"error": map_legacy_error(method, params, answer["error"])}
        ttl_ms, scope = self._cache.default_ttl_ms, self._cache.default_scope
        return {"result": stamp_result(method, answer["result"], ttl_ms=ttl_ms, scope=scope)}

    async def _stream(
        self,
        child: StdioChild,
        method: str,
        params: JsonObject,
        client_id: RequestId | None,
        for_client: Callable[[JsonObject], JsonObject],
    ) -> Reply:
        queue: asyncio.Queue[JsonObject] = asyncio.Queue(maxsize=_MAX_QUEUED_NOTIFICATIONS)

        def on_notification(notification: JsonObject) -> None:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(notification)

        call = await child.send(method, params, on_notification=on_notification)
        frames = self._frames(child, call, queue, client_id, for_client, listen=method == "subscriptions/listen")
        return Reply(200, {"Content-Type": SSE_CONTENT_TYPE}, stream=frames)

    async def _frames(
        self,
        child: StdioChild,
        call: InFlight,
        queue: asyncio.Queue[JsonObject],
        client_id: RequestId | None,
        for_client: Callable[[JsonObject], JsonObject],
        *,
        listen: bool,
    ) -> AsyncGenerator[bytes, None]:
        """The call's notifications as they come, then its answer; an error event if the answer never comes."""
        answered = False
        getter: asyncio.Future[JsonObject] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                timeout = None if listen else self._config.timeout_s  # a listen stream may be quiet for long
                done, _ = await asyncio.wait(
                    {getter, call.answer}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    self._supervisor.suspect()
                    raise UpstreamTimeout(self.url, "no answer in time")
                if getter in done:
                    yield event(for_subscription(getter.result(), call.id, client_id))
                else:
                    getter.cancel()
                if call.answer in done:
                    while not queue.empty():
                        yield event(for_subscription(queue.get_nowait(), call.id, client_id))
                    answered = True
                    yield event(response(client_id, for_client(call.answer.result())))
                    return
        except UpstreamError as exc:
            logger.warning("request failed: %s", exc)
            yield event(error_response(client_id, exc.to_rpc()))
        finally:
            if getter is not None:
                getter.cancel()
            if not answered:
                child.forget(call, "the client went away")

    @contextlib.contextmanager
    def _observe(self, method: str) -> Iterator[None]:
        """Count and time one exchange; a timeout makes the supervisor check that the child still answers."""
        started = time.monotonic()
        outcome = "ok"
        try:
            yield
        except UpstreamError as exc:
            outcome = "unreachable" if exc.is_transport_failure else "error"
            if isinstance(exc, UpstreamTimeout):
                self._supervisor.suspect()
            raise
        finally:
            key = (method_label(method), outcome)
            series = self._series_cache.get(key)
            if series is None:
                series = (
                    self._metrics.upstream_requests.labels(*key),
                    self._metrics.upstream_duration.labels(key[0]),
                )
                self._series_cache[key] = series
            series[0].inc()
            series[1].observe(time.monotonic() - started)
