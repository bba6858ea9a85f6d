"""2025-11-25 clients: sessions minted by the sidecar, relayed to the upstream, with synthesised subscriptions.

A legacy session is the upstream's session under a name of our own (random, unguessable): requests
travel on the upstream session as they are (progress, logs and server requests on the POST stream
reach the client untouched), while `resources/subscribe`, `resources/unsubscribe` and `ping` are
served here on the watch engine, and the session's GET stream carries our `notifications/resources/
updated` and `*/list_changed`, merged with whatever the upstream's own GET stream sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import orjson
from aiohttp import web

from sidecar.config import StreamsConfig
from sidecar.downstream.event_stream import EventStream
from sidecar.downstream.legacy_session import LegacySession
from sidecar.downstream.listen import StreamHub
from sidecar.downstream.listen_filter import LeftOut, log_left_out
from sidecar.fair_share import FairShare
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol import (
    HEADER_SESSION_ID,
    LIST_KIND_OF_PRIMITIVE,
    InvalidParams,
    InvalidRequest,
    JsonObject,
    Message,
    Overloaded,
    RpcError,
    TooManyRequests,
    UpstreamError,
    UpstreamHTTPError,
    error_response,
    result_response,
    synthesise_capabilities,
)
from sidecar.upstream.answers import Reply
from sidecar.upstream.base import Relay
from sidecar.upstream.sse import SSEDecoder, SSETooLarge
from sidecar.watch.registry import Handle, WatchRegistry

__all__ = ["LegacySession", "LegacySessions"]

logger = logging.getLogger(__name__)

_LOCAL_METHODS = ("ping", "resources/subscribe", "resources/unsubscribe")
_MAX_INITIALIZE_BYTES = 1_048_576
_REFUSED = "resources/subscribe refused"
"""The log line of a refused subscribe, counted as a listen's left-out URIs are."""
_UPSTREAM_FRAMES = 256
"""Frames from the upstream's GET stream waiting for the client; a slow client slows that stream down."""


class LegacySessions:
    """Every legacy session of this process, with its idle expiry."""

    def __init__(
        self,
        upstream: Relay,
        registry: WatchRegistry,
        hub: StreamHub,
        config: StreamsConfig,
        metrics: Metrics,
        fair_share: FairShare,
        queue_wait_s: float,
    ) -> None:
        self._upstream = upstream
        self._fair_share = fair_share
        self._queue_wait_s = queue_wait_s
        """A request's own deadline (upstream.timeout_s) bounds its wait for a slot too."""
        self._registry = registry
        self._hub = hub
        self._config = config
        self._metrics = metrics
        self._sessions: dict[str, LegacySession] = {}
        self._opening = 0
        """Initializes in flight: each holds a slot under streams.max_sessions."""
        self._per_client: Counter[str] = Counter()
        """Sessions open or opening, by client (the unit of fair share)."""
        self._reaper: asyncio.Task[None] | None = None

    @property
    def count(self) -> int:
        return len(self._sessions)

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self.end_all()

    def end_all(self) -> None:
        """Every session ends (its GET streams with it): its client's next request is answered 404 and it
        initializes again, through the load balancer, perhaps on another replica."""
        for session_id in list(self._sessions):
            self._end(session_id)

    # -- POST --------------------------------------------------------------------------------------------

    async def handle_post(
        self, request: web.Request, body: bytes, message: Message | None, identity: Identity
    ) -> web.StreamResponse | Reply:
        """A legacy-era POST (`message`: its body parsed, None when it is no JSON-RPC request or notification);
        returns either our own response or the upstream's reply to relay."""
        if request.headers.get(HEADER_SESSION_ID) is None:
            if message is not None and message.method == "initialize":
                return await self._initialize(request, body, message, identity)
            raise InvalidRequest("Bad Request: Mcp-Session-Id header is required", http_status=400)
        session = self._session_of(request, identity)
        if message is None or not message.is_notification:
            session.used = True  # `notifications/initialized` alone does not keep a session
        if message is not None and message.method in _LOCAL_METHODS and not message.is_notification:
            return await self._serve_locally(session, message)
        return await self._relay_post(body, request, identity, session.upstream_session)

    def _relay_post(
        self, body: bytes, request: web.Request, identity: Identity, upstream_session: str | None
    ) -> Awaitable[Reply]:
        # In the client's turn: over its fair share it waits in its own queue (invariant 20). A session's GET
        # stream is not counted (one per session, and sessions are capped).
        return self._fair_share.run(
            identity.client,
            lambda: self._upstream.relay(body, request.headers, identity, session_id=upstream_session),
            within_s=self._queue_wait_s,
            lane=identity.lane,
        )

    async def _initialize(
        self, request: web.Request, body: bytes, message: Message, identity: Identity
    ) -> web.StreamResponse:
        client = _session_owner(identity)
        # Slots are taken before the first await: a thousand initializes at once cannot all pass the check.
        if len(self._sessions) + self._opening >= self._config.max_sessions:
            self._metrics.limit_rejections.labels("max_sessions").inc()
            raise Overloaded(f"this sidecar already holds {self._config.max_sessions} sessions; retry later")
        if self._per_client[client] >= self._config.max_sessions_per_client:
            self._metrics.limit_rejections.labels("max_sessions_per_client").inc()
            raise TooManyRequests(f"this client already holds {self._config.max_sessions_per_client} sessions")
        self._opening += 1
        self._per_client[client] += 1
        opened = False
        try:
            reply = await self._relay_post(body, request, identity, None)
            answer = await _first_response(reply)
            if answer is None or reply.status >= 300 or not isinstance(answer.get("result"), dict):
                payload = answer or error_response(message.id, InvalidRequest("upstream refused initialize"))
                return web.json_response(payload, status=reply.status if reply.status >= 400 else 502)
            opened = True
            return self._opened(answer, reply, identity)
        finally:
            self._opening -= 1
            if not opened:
                self._forget(client)

    def _opened(self, answer: JsonObject, reply: Reply, identity: Identity) -> web.StreamResponse:
        result = answer["result"]
        capabilities = result.get("capabilities")
        if isinstance(capabilities, dict):
            synthesise_capabilities(capabilities)
        session_id = secrets.token_urlsafe(24)
        upstream_session = reply.headers.get(HEADER_SESSION_ID)
        self._sessions[session_id] = LegacySession(session_id, upstream_session, identity, self._metrics)
        self._metrics.legacy_sessions.set(len(self._sessions))
        logger.info("legacy session opened")
        return web.json_response(answer, headers={HEADER_SESSION_ID: session_id}, dumps=_dumps)

    async def _serve_locally(self, session: LegacySession, message: Message) -> web.StreamResponse:
        try:
            result = await self._local_result(session, message)
        except RpcError as exc:
            return web.json_response(error_response(message.id, exc), dumps=_dumps)
        except UpstreamHTTPError as exc:
            if not exc.is_auth_failure:
                return web.json_response(error_response(message.id, exc.to_rpc()), dumps=_dumps)
            # A refused credential keeps its status and challenge, so the client re-authenticates.
            headers = self._upstream.public_headers(exc.headers)
            return web.json_response(error_response(message.id, exc.to_rpc()), status=exc.status, headers=headers)
        except UpstreamError as exc:
            # What went wrong upstream (down, a bad answer, its own error), never "not found".
            return web.json_response(error_response(message.id, exc.to_rpc()), dumps=_dumps)
        return web.json_response(result_response(message.id, result), dumps=_dumps)

    async def _local_result(self, session: LegacySession, message: Message) -> JsonObject:
        if message.method == "ping":
            return {}
        uri = message.params.get("uri")
        if not isinstance(uri, str) or not uri:
            raise InvalidParams("params.uri must be a URI")
        if message.method == "resources/unsubscribe":
            handle = session.subscriptions.pop(uri, None)
            if handle is not None:
                self._hub.detach(session, handle)
                handle.release()
            return {}
        # A subscribe of a URI the session holds is a sync point all the same (invariant 16): it joins the watch's
        # look below, and the extra hold is let go at the end.
        if uri not in session.subscriptions and len(session.subscriptions) >= self._config.max_uris_per_stream:
            self._metrics.limit_rejections.labels("max_uris_per_stream").inc()
            over = InvalidParams(
                f"a session may subscribe to at most {self._config.max_uris_per_stream} URIs", {"uri": uri}
            )
            log_left_out(_REFUSED, [LeftOut.answered("max_uris_per_stream", over, uri)], session.identity)
            raise over
        try:
            handle = await self._registry.acquire("resource", uri, session.identity)
        except (UpstreamError, RpcError) as exc:  # said as it is: the upstream's error, never "not found"
            log_left_out(_REFUSED, [LeftOut.refused(exc, uri)], session.identity)
            raise
        if handle is None:  # -32002: the 2025-11-25 code (a listen's ack says -32602, its revision's)
            missing = RpcError("Resource not found", {"uri": uri}, code=-32002)
            log_left_out(_REFUSED, [LeftOut.answered("not_found", missing, uri)], session.identity)
            raise missing
        if session.session_id not in self._sessions:  # ended while the baseline was read
            handle.release()
            raise _session_not_found()
        if uri in session.subscriptions:  # held already (the same subscribe again, or a concurrent one got there first)
            handle.release()
            return {}
        session.subscriptions[uri] = handle
        self._hub.attach(session, handle)
        return {}

    # -- GET and DELETE ------------------------------------------------------------------------------------

    async def handle_get(self, request: web.Request, identity: Identity) -> web.StreamResponse:
        session = self._session_of(request, identity)
        session.used = True
        if not session.lists_watched:
            session.lists_watched = True  # once per session, kept until it ends: reconnects add nothing
            try:
                await self._watch_lists(session)
            except BaseException:
                session.lists_watched = False
                raise
        session.get_streams += 1
        events = EventStream(request)
        frames: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_UPSTREAM_FRAMES)
        relay = asyncio.get_running_loop().create_task(self._pump_upstream(request, session, frames))
        try:
            await events.open()
            await session.serve_get(events, frames, self._config.keepalive_s)
            await events.close()
        except ConnectionResetError:
            pass
        finally:
            relay.cancel()
            session.get_streams -= 1
        return events.response

    async def _pump_upstream(self, request: web.Request, session: LegacySession, frames: asyncio.Queue[bytes]) -> None:
        """Merge the upstream's own GET stream (logs, list changes it does send) into the client's."""
        with contextlib.suppress(Exception):  # boundary: the upstream may have no GET stream; ours goes on
            reply = await self._upstream.relay(
                None, request.headers, session.identity, session_id=session.upstream_session, http_method="GET"
            )
            if reply.stream is None:
                return
            async with contextlib.aclosing(reply.stream) as chunks:
                async for chunk in chunks:
                    await frames.put(chunk)

    async def handle_delete(self, request: web.Request, identity: Identity) -> web.StreamResponse:
        session = self._session_of(request, identity)
        with contextlib.suppress(Exception):  # boundary: ending our side must not depend on the upstream
            await self._upstream.relay(
                None, request.headers, session.identity, session_id=session.upstream_session, http_method="DELETE"
            )
        self._end(session.session_id)
        return web.Response(status=200)

    def _session_of(self, request: web.Request, identity: Identity) -> LegacySession:
        session_id = request.headers.get(HEADER_SESSION_ID)
        if session_id is None:
            raise InvalidRequest("Bad Request: Mcp-Session-Id header is required", http_status=400)
        session = self._sessions.get(session_id)
        if session is None or session.identity.context != identity.context:
            # A session belongs to whoever opened it: presented by anyone else (another token, none) it does not
            # exist, so a leaked session id carries no one's identity, and a client whose token changed
            # initializes again.
            raise _session_not_found()
        session.last_seen = time.monotonic()
        return session

    async def _watch_lists(self, session: LegacySession) -> None:
        # Legacy sessions get list changes whenever the capability is on: watch the lists the upstream has.
        # As the session's client: a protected upstream refuses an anonymous probe.
        capabilities = (await self._upstream.ensure_info(session.identity)).capabilities
        kinds = [kind for primitive, kind in LIST_KIND_OF_PRIMITIVE.items() if primitive in capabilities]
        handles = await asyncio.gather(
            *(self._registry.acquire(kind, None, session.identity) for kind in kinds), return_exceptions=True
        )
        alive = session.session_id in self._sessions  # a DELETE or the reaper may have ended it meanwhile
        for handle in handles:
            if isinstance(handle, Handle):
                if alive:
                    session.list_handles.append(handle)
                    self._hub.attach(session, handle)
                else:
                    handle.release()

    # -- lifetime -------------------------------------------------------------------------------------------

    def _end(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        for handle in session.handles:
            self._hub.detach(session, handle)
            handle.release()
        session.subscriptions.clear()
        session.list_handles.clear()
        session.close("ended")
        self._forget(_session_owner(session.identity))
        self._metrics.legacy_sessions.set(len(self._sessions))
        logger.info("legacy session ended")

    def _forget(self, client: str) -> None:
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    async def _reap(self) -> None:
        idle_s, unused_s = self._config.session_idle_s, self._config.session_unused_s
        while True:
            await asyncio.sleep(max(min(idle_s, unused_s) / 4, 0.05))
            now = time.monotonic()
            for session_id, session in list(self._sessions.items()):
                idle = session.get_streams == 0 and now - session.last_seen > idle_s
                if idle or (not session.used and now - session.opened_at > unused_s):
                    self._end(session_id)


def _session_owner(identity: Identity) -> str:
    """Whom streams.max_sessions_per_client counts a session against: its context, or an anonymous client's
    address. Not the fair-share client of a credential the upstream has not accepted yet (its address): a
    2025-11-25 client's first request is its initialize, so a new user behind a busy address would never get in."""
    return identity.context if not identity.is_anonymous else identity.client


def _session_not_found() -> InvalidRequest:
    return InvalidRequest("Session not found", http_status=404)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _first_response(reply: Reply) -> JsonObject | None:
    """The JSON-RPC response in an upstream answer (JSON body, or the first response event of an SSE stream)."""
    if reply.stream is None:
        return reply.message if isinstance(reply.message, dict) else None
    decoder = SSEDecoder(_MAX_INITIALIZE_BYTES)
    async with contextlib.aclosing(reply.stream) as chunks:
        async for chunk in chunks:
            try:
                events = decoder.feed(chunk)
            except SSETooLarge:
                return None
            for event in events:
                with contextlib.suppress(orjson.JSONDecodeError):
                    message = orjson.loads(event.data)
                    if isinstance(message, dict) and ("result" in message or "error" in message):
                        return message
    return None
