"""The stdio transport: an MCP server the sidecar starts as a child process and speaks to on its stdin and stdout.

One child session serves every client: a stdio server has no HTTP, so it has one authorization context, and
clients' `Authorization` goes nowhere. A request that asked for progress is answered as an SSE stream, its
progress as it comes and then the answer, as an HTTP upstream's SSE answer is relayed. 2025-11-25 client
sessions are names only: a client's `initialize` is answered from the child's own handshake,
`notifications/initialized` goes nowhere, `notifications/cancelled` reaches the child with the child-side id of
the request it names, and a request to a 2026-07-28 child gains the `_meta` it needs. The child process, its
pipes and restarts live in `child.py` and `supervisor.py`; the supervisor tells reachability.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from functools import partial

from sidecar.config import UpstreamConfig
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol import (
    HANDSHAKE_VERSIONS,
    HEADER_SESSION_ID,
    LEGACY_VERSION,
    SERVER_INFO,
    Era,
    InvalidRequest,
    JsonObject,
    Message,
    RequestId,
    UpstreamError,
    UpstreamTimeout,
    error_response,
)
from sidecar.upstream.answers import Reply, UpstreamInfo, json_object, whole
from sidecar.upstream.base import Headers, NotificationListener
from sidecar.upstream.era import checked, response, with_modern_meta
from sidecar.upstream.reachability import Exchanging, Reachability
from sidecar.upstream.sse import SSE_CONTENT_TYPE
from sidecar.upstream.stdio.child import InFlight, StdioChild
from sidecar.upstream.stdio.frames import event, for_subscription, streamed, until_ended
from sidecar.upstream.stdio.supervisor import StdioSupervisor
from sidecar.upstream.transport import AnswerShaper

__all__ = ["StdioTransport"]

logger = logging.getLogger(__name__)


_DRAIN_MARGIN_S = 1.0
_MAX_QUEUED_NOTIFICATIONS = 1024
"""Progress notifications of one request waiting for its client; beyond, the oldest are dropped (the newest
progress says the most)."""
_JSON = {"Content-Type": "application/json"}


class StdioTransport:
    """A child process on stdin and stdout: the `Transport` of `StdioUpstream`."""

    def __init__(self, config: UpstreamConfig, metrics: Metrics, reachability: Reachability) -> None:
        self.url = config.display_url
        self._config = config
        self._reach = reachability
        self._supervisor = StdioSupervisor(config, metrics, reachability)
        self._relayed: dict[tuple[str, RequestId], tuple[StdioChild, InFlight]] = {}
        """Legacy sessions' requests in flight, by (session, the client's id): where `notifications/cancelled` goes."""
        self._drain_timer: asyncio.TimerHandle | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id (its process group's too), while one runs."""
        return self._supervisor.child_pid

    def add_notification_listener(self, listener: NotificationListener) -> Callable[[], None]:
        """Hand `listener` each notification the child sends on its own (list changes, resource updates, log
        messages); returns an idempotent remover. Progress goes to the request that asked for it instead."""
        return self._supervisor.add_listener(listener)

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

    # -- the era and liveness ------------------------------------------------------------------------------

    def heard_at(self) -> float | None:
        child = self._supervisor.child
        return child.last_heard_at if child is not None else None

    async def era(self, identity: Identity, *, wait: bool = True) -> UpstreamInfo:
        """What the child's handshake said, waiting for it while the child starts unless not `wait`. The
        supervisor tells reachability; nothing here is asked of the child."""
        return (await self._supervisor.session(wait=wait))[1]

    def exchanging(self, method: str, era: Callable[[], Awaitable[UpstreamInfo]]) -> Exchanging:
        """`method`'s exchange counted for the block, in the era of the child that takes it: its handshake, waited
        for within the exchange (a child not ready fails this exchange), not `era`, the one the bridge learned."""
        return Exchanging(self._reach.observe(method), self._child_era, era_first=False)

    async def _child_era(self) -> UpstreamInfo:
        return await self.era(ANONYMOUS_IDENTITY)

    async def liveness(self, info: UpstreamInfo) -> None:
        await self._supervisor.probe()  # one that does not answer is ended and started again

    # -- exchanges -----------------------------------------------------------------------------------------

    async def exchange(
        self, identity: Identity, era: Era, method: str, params: JsonObject, client_headers: Headers | None = None
    ) -> JsonObject:
        with self._suspecting():
            child, _ = await self._supervisor.session()
            return await child.request(method, params, timeout_s=self._config.timeout_s)

    async def reply(
        self,
        identity: Identity,
        era: Era,
        method: str,
        params: JsonObject,
        request_id: RequestId | None,
        client_headers: Headers,
        shape: AnswerShaper,
    ) -> Reply:
        """A client's request, answered whole; a listen, or a request that asked for progress, as an SSE stream:
        its notifications as they come, then its answer."""
        if not streamed(method, params):
            return whole(response(request_id, shape(await self.exchange(identity, era, method, params))))
        with self._suspecting():
            child, _ = await self._supervisor.session()
            return await self._stream(child, method, params, request_id, shape)

    async def pass_through(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A 2026-07-28 client's request to a 2026-07-28 child: a child has no HTTP answer to pass on, so it is
        answered from its session, the answer checked."""
        shape = partial(checked, self.url)
        return await self.reply(identity, "modern", message.method, message.params, message.id, client_headers, shape)

    # -- 2025-11-25 client sessions -------------------------------------------------------------------------

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None,
        http_method: str,
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
        with self._reach.observe("legacy-session"), self._suspecting():
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
            return whole(response(request_id, checked(self.url, answer)))

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
            owner.cancel(call, str(params.get("reason") or "cancelled by the client"))

    @contextlib.asynccontextmanager
    async def open_stream(
        self, identity: Identity, era: Era, params: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """The child's own notifications while the block runs: a 2026-07-28 child's listen with `params` (its ack
        first), or every notification a 2025-11-25 child sends on its own. It ends when the child does (a
        restarted child has forgotten its subscriptions: the caller opens it again)."""
        child, _ = await self._supervisor.session()
        queue: asyncio.Queue[JsonObject] = asyncio.Queue(maxsize=_MAX_QUEUED_NOTIFICATIONS)

        def put(notification: JsonObject) -> None:
            if queue.full():
                queue.get_nowait()  # the newest say the most; these are hints, not content
            queue.put_nowait(notification)

        if era == "modern":
            call = await child.send("subscriptions/listen", params, on_notification=put)
            try:
                yield until_ended(queue, child, call.answer)
            finally:
                child.cancel(call, "the sidecar stopped listening")
        else:
            remove = self.add_notification_listener(put)
            try:
                yield until_ended(queue, child, None)
            finally:
                remove()

    # -- streams -------------------------------------------------------------------------------------------

    async def _stream(
        self,
        child: StdioChild,
        method: str,
        params: JsonObject,
        client_id: RequestId | None,
        shape: AnswerShaper,
    ) -> Reply:
        queue: asyncio.Queue[JsonObject] = asyncio.Queue(maxsize=_MAX_QUEUED_NOTIFICATIONS)

        def on_notification(notification: JsonObject) -> None:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(notification)

        call = await child.send(method, params, on_notification=on_notification)
        frames = self._frames(child, call, queue, client_id, shape, listen=method == "subscriptions/listen")
        return Reply(200, {"Content-Type": SSE_CONTENT_TYPE}, stream=frames)

    async def _frames(
        self,
        child: StdioChild,
        call: InFlight,
        queue: asyncio.Queue[JsonObject],
        client_id: RequestId | None,
        shape: AnswerShaper,
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
                    yield event(response(client_id, shape(call.answer.result())))
                    return
        except UpstreamError as exc:
            yield event(error_response(client_id, exc.to_rpc()))  # to_rpc logs the details with the error id
        finally:
            if getter is not None:
                getter.cancel()
            if not answered:
                child.cancel(call, "the client went away")

    @contextlib.contextmanager
    def _suspecting(self) -> Iterator[None]:
        """A request that timed out makes the supervisor check that the child still answers."""
        try:
            yield
        except UpstreamTimeout:
            self._supervisor.suspect()
            raise
