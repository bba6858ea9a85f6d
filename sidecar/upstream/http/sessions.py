"""The sidecar's 2025-11-25 sessions with an HTTP upstream, one per authorization context: opened with
`initialize`, opened again when the upstream forgets one (a request or the GET stream it refuses on a session is
sent once more on a new one: see `session_refusal`), ids of the sidecar's own, and the upstream's requests to a
client that has none here refused. The answers come back as the upstream gave them (the bridge translates)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from sidecar.protocol import (
    HEADER_PROTOCOL_VERSION,
    HEADER_SESSION_ID,
    READ_ONLY_METHODS,
    JsonObject,
    UpstreamBadResponse,
)
from sidecar.upstream.era import checked, reply_to_server_request, strip_modern_meta
from sidecar.upstream.http.endpoint import UpstreamHTTP, iter_messages, raise_for_status, read_limited, status_error
from sidecar.upstream.http.session_refusal import refuses_session
from sidecar.upstream.http.wire import Answer
from sidecar.upstream.probe import INITIALIZE_PARAMS, initialize_result
from sidecar.upstream.sse import SSE_CONTENT_TYPE

__all__ = ["UpstreamSession", "UpstreamSessions"]

logger = logging.getLogger(__name__)

NotificationSink = Callable[[JsonObject], None]

MAX_SESSIONS = 10_000
"""Upstream sessions kept at once (one per authorization context); the least recently used is dropped."""


@dataclass(slots=True)
class UpstreamSession:
    """One session the sidecar `initialize`d with a 2025-11-25 upstream."""

    session_id: str | None
    protocol_version: str
    initialize_result: JsonObject
    outages_seen: int = 0
    """The upstream's outages counted when the session was opened or last answered: fewer than now, and the
    upstream may have forgotten it (restarted meanwhile)."""


class UpstreamSessions:
    """Speaks 2025-11-25 to the upstream on behalf of modern clients and the sidecar, one session per context."""

    def __init__(self, http: UpstreamHTTP, outages: Callable[[], int] = lambda: 0) -> None:
        self._http = http
        self._outages = outages
        """How many outages of the upstream began so far (its reachability counts them)."""
        self._sessions: LRUCache[str, UpstreamSession] = LRUCache(maxsize=MAX_SESSIONS)
        self._locks: LRUCache[str, asyncio.Lock] = LRUCache(maxsize=MAX_SESSIONS)
        self._ids = itertools.count(1)

    async def initialize(self, context: str, headers: Mapping[str, str]) -> UpstreamSession:
        """The context's session, opening one with `initialize` when there is none."""
        session = self._sessions.get(context)
        if session is not None:
            return session
        lock = self._locks.get(context)
        if lock is None:
            lock = self._locks[context] = asyncio.Lock()
        async with lock:
            session = self._sessions.get(context)
            if session is None:
                session = await self._open_session(headers)
                self._sessions[context] = session
        return session

    async def reach(self, context: str, headers: Mapping[str, str]) -> UpstreamSession:
        """The context's session, after an exchange with the upstream: opened now, or the one it has answering a
        `ping` (an error answer is an answer too; an expired session is opened again)."""
        if self._sessions.get(context) is None:
            return await self.initialize(context, headers)
        checked(self._http.url, await self.request(context, "ping", {}, headers))
        return await self.initialize(context, headers)

    async def _open_session(self, headers: Mapping[str, str]) -> UpstreamSession:
        request_id = f"sidecar-{next(self._ids)}"
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": INITIALIZE_PARAMS,
        }
        async with self._http.post(orjson.dumps(body), _base_headers(headers)) as response:
            await raise_for_status(response, self._http)
            session_id = response.headers.get(HEADER_SESSION_ID)
            reply = await self._final_message(response, request_id, None, session_id)
        result = initialize_result(self._http.url, reply)
        session = UpstreamSession(session_id, str(result["protocolVersion"]), result, self._outages())
        notify = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self._http.send_quietly(orjson.dumps(notify), self._session_headers(headers, session))
        logger.info("upstream session opened", extra={"protocol_version": session.protocol_version})
        return session

    async def request(
        self,
        context: str,
        method: str,
        params: JsonObject,
        headers: Mapping[str, str],
        *,
        on_notification: NotificationSink | None = None,
    ) -> JsonObject:
        """Send one request; the answer is the upstream's JSON-RPC response, as it came.

        A session the upstream refuses (forgotten, expired: see `session_refusal`) is opened again once and the
        request retried on the new one.
        """
        for attempt in (1, 2):
            session = await self.initialize(context, headers)
            request_id = f"sidecar-{next(self._ids)}"
            body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": strip_modern_meta(params)}
            idempotent = method in READ_ONLY_METHODS
            async with self._http.post(
                orjson.dumps(body), self._session_headers(headers, session), idempotent=idempotent
            ) as response:
                if on_notification is not None and response.headers.get("Content-Type", "").startswith(
                    SSE_CONTENT_TYPE
                ):
                    response.unbounded(self._http.timeout_s)  # progress may go on: only silence ends it
                if await self._refused(context, session, response, retry=attempt == 1):
                    continue
                return await self._final_message(response, request_id, on_notification, session.session_id)
        raise AssertionError("unreachable: the retry loop returns or raises")

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, context: str, headers: Mapping[str, str]
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """The context session's GET stream: the upstream's notifications unrelated to any request (list
        changes; updates of what the session subscribed to). Open once the block is entered; a session the
        upstream refuses is opened again once and the stream asked for on the new one."""
        for attempt in (1, 2):
            session = await self.initialize(context, headers)
            sent = self._session_headers(headers, session)
            sent.pop("Content-Type", None)
            sent["Accept"] = SSE_CONTENT_TYPE
            async with self._http.send("GET", None, sent, long_lived=True) as response:
                if await self._refused(context, session, response, retry=attempt == 1):
                    continue
                yield (
                    message
                    async for message in iter_messages(response, self._http.max_response_bytes, self._http.url)
                    if "method" in message and "id" not in message
                )
                return

    async def _refused(self, context: str, session: UpstreamSession, response: Answer, *, retry: bool) -> bool:
        """True when the upstream refused the session (dropped: the next request opens a new one) and the
        request may go again (`retry`); an answer of 2xx is False; any other raises as the upstream's error."""
        if 200 <= response.status < 300:
            session.outages_seen = self._outages()
            return False
        body = await read_limited(response, self._http.max_response_bytes, self._http.url)
        suspect = session.session_id is not None and session.outages_seen < self._outages()
        if refuses_session(response.status, body, suspect=suspect):
            self._drop(context, session)
            if retry:
                logger.info("upstream refused its session; opening a new one", extra={"status": response.status})
                return True
        raise status_error(response, body, self._http)

    async def _final_message(
        self, response: Any, request_id: str, on_notification: NotificationSink | None, session_id: str | None
    ) -> JsonObject:
        async for message in iter_messages(response, self._http.max_response_bytes, self._http.url):
            if message.get("id") == request_id and ("result" in message or "error" in message):
                return message
            if "method" in message and "id" in message:
                # A server-to-client request (sampling, elicitation, roots, ping) has no modern client to
                # reach; answer it so the upstream does not wait forever.
                await self._refuse(message, session_id)
            elif "method" in message and on_notification is not None:
                on_notification(message)
        raise UpstreamBadResponse(self._http.url, "stream ended without a response")

    async def _refuse(self, request: JsonObject, session_id: str | None) -> None:
        reply = reply_to_server_request(request)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if session_id is not None:
            headers[HEADER_SESSION_ID] = session_id
        asyncio.get_running_loop().create_task(self._http.send_quietly(orjson.dumps(reply), headers))

    def forget(self, context: str) -> None:
        """The context's next request opens a new session (the one it has is not asked again)."""
        self._sessions.pop(context, None)

    def _drop(self, context: str, session: UpstreamSession) -> None:
        if self._sessions.get(context) is session:
            del self._sessions[context]

    def _session_headers(self, headers: Mapping[str, str], session: UpstreamSession) -> dict[str, str]:
        merged = _base_headers(headers)
        merged[HEADER_PROTOCOL_VERSION] = session.protocol_version
        if session.session_id is not None:
            merged[HEADER_SESSION_ID] = session.session_id
        return merged


def _base_headers(forwarded: Mapping[str, str]) -> dict[str, str]:
    return {
        **forwarded,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
