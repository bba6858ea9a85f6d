"""The HTTP transport: the upstream's MCP endpoint over the wire pool, one session per authorization context when
it speaks 2025-11-25, a modern client's request passed as it came; the OAuth metadata and challenges it serves,
rewritten to name the sidecar, are its `protection` (`auth.py`).

Every exchange tells reachability. The era is probed when it is needed and not known (a probe is an exchange of
its own, before the one that needs it), and learned afresh after an outage."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import orjson

from sidecar.config import UpstreamConfig
from sidecar.identity import ANONYMOUS_IDENTITY, Identity, IdentityRule
from sidecar.observability.tracing import tracing
from sidecar.protocol import (
    HEADER_METHOD,
    HEADER_NAME,
    HEADER_PROTOCOL_VERSION,
    HEADER_SESSION_ID,
    MODERN_VERSION,
    NAMED_METHODS,
    READ_ONLY_METHODS,
    Era,
    JsonObject,
    Message,
    RequestId,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamRpcError,
    encode_header_value,
)
from sidecar.upstream.answers import Reply, UpstreamInfo, whole
from sidecar.upstream.base import Headers
from sidecar.upstream.era import checked, own_request_params, response, result_of
from sidecar.upstream.http.auth import OAuthProtection
from sidecar.upstream.http.endpoint import UpstreamHTTP, iter_messages, raise_for_status
from sidecar.upstream.http.passthrough import pass_request
from sidecar.upstream.http.relay import request_id_of
from sidecar.upstream.http.sessions import UpstreamSessions
from sidecar.upstream.probe import learn_era
from sidecar.upstream.reachability import Exchanging, Reachability
from sidecar.upstream.transport import AnswerShaper

__all__ = ["HTTPTransport"]

logger = logging.getLogger(__name__)


_MCP_REQUEST_HEADERS = frozenset(name.lower() for name in (HEADER_PROTOCOL_VERSION, HEADER_METHOD, HEADER_NAME))
"""The client's 2026-07-28 headers that go upstream as they came (validated equal to the body's values), and
its `Mcp-Param-*` headers."""
_GATEWAY_STATUSES = (502, 503, 504)
"""What a proxy in front says for an upstream it cannot reach, or one not up yet: the upstream said nothing."""


class HTTPTransport:
    """An MCP server over HTTP: the `Transport` of `UpstreamClient`."""

    def __init__(
        self, config: UpstreamConfig, reachability: Reachability, identities: IdentityRule | None = None
    ) -> None:
        self.url = config.display_url
        self._config = config
        self._reach = reachability
        self._identities = identities or IdentityRule(config.forward_headers, config.non_identity_headers)
        self._http = UpstreamHTTP(config)
        self.protection = OAuthProtection(config, self._http)
        """What the upstream's OAuth protection tells clients, pointed at the sidecar."""
        self._sessions = UpstreamSessions(self._http, lambda: reachability.outages)
        self._ids = itertools.count(1)
        self._probe_lock = asyncio.Lock()

    async def start(self) -> None:
        await self._http.start()

    async def aclose(self) -> None:
        await self._http.aclose()

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: see `UpstreamHTTP.drain`."""
        self._http.drain(grace_s)

    def use_tls(self, context: ssl.SSLContext) -> None:
        """New connections to an https upstream use `context` (its certificate files were read again)."""
        self._http.use_tls(context)

    def heard_at(self) -> float:
        return self._reach.heard_at  # what the answers say

    # -- the era -------------------------------------------------------------------------------------------

    async def era(self, identity: Identity, *, wait: bool = True) -> UpstreamInfo:
        """The era known, or probed now as `identity` (once at a time; a protected upstream refuses an anonymous
        probe) and told to reachability; a probe answers or fails at once, so there is nothing to `wait` for."""
        info = self._reach.info
        if info is not None:
            return info
        async with self._probe_lock:
            if self._reach.info is None:
                try:
                    with self._reach.observe("probe"):
                        info = await self._probe(identity)
                except UpstreamError as exc:
                    self._reach.probe_failed(exc)
                    raise
                self._reach.learned(info)
                return info
            return self._reach.info

    def exchanging(self, method: str, era: Callable[[], Awaitable[UpstreamInfo]]) -> Exchanging:
        """`era` first (a probe, when the era is not known, is an exchange of its own), then `method`'s exchange
        counted for the block."""
        return Exchanging(self._reach.observe(method), era, era_first=True)

    async def _probe(self, identity: Identity) -> UpstreamInfo:
        """Probe over the network, with `identity`'s headers."""
        headers = identity.as_headers()

        async def discover() -> JsonObject | None:
            try:
                return await self._modern_call("server/discover", headers)
            except UpstreamError as exc:
                # Only a refusal means "try the handshake era": an answer that is not MCP at all is no era, and
                # neither is a transport failure (refused, reset, or a gateway's 502/503/504 for an upstream it
                # cannot reach): a dual-era server would answer initialize next and be driven as legacy for good.
                if self._config.protocol == MODERN_VERSION or not _refusal(exc):
                    raise
                logger.debug("server/discover refused (%s)", exc.reason)
                return None

        async def initialize() -> JsonObject:
            # Over the network even when the context has a session: a cached one proves nothing about now. An
            # upstream found unusable is asked on a new session: the old one may be what it cannot use.
            if self._reach.unusable is not None:
                self._sessions.forget(identity.context)
            return (await self._sessions.reach(identity.context, headers)).initialize_result

        return (await learn_era(self.url, self._config.protocol, discover, initialize))[0]

    async def liveness(self, info: UpstreamInfo) -> None:
        """One cheap exchange in the era known, told to reachability: any answer (an error answer too) says the
        upstream speaks JSON-RPC; one that is not MCP makes it unusable, and its era is probed afresh."""
        try:
            with self._reach.observe("probe"):
                await self._ping(info)
        except UpstreamRpcError:
            self._reach.usable(None)  # an error answer is an answer: the upstream speaks JSON-RPC
        except UpstreamError as exc:
            self._reach.liveness_failed(exc)
            raise
        else:
            self._reach.usable(None)

    async def _ping(self, info: UpstreamInfo) -> None:
        # One cheap exchange in the era already known; a cached legacy session alone would prove nothing.
        if info.era == "modern":
            await self._modern_call("server/discover", {})
            return
        answer = await self._sessions.request(ANONYMOUS_IDENTITY.context, "ping", {}, {})
        result_of(self.url, checked(self.url, answer))

    async def _modern_call(self, method: str, headers: Mapping[str, str]) -> JsonObject:
        answer = await self._modern_exchange(method, own_request_params({}), headers)
        return result_of(self.url, checked(self.url, answer))

    # -- exchanges ----------------------------------------------------------------------------------------------

    async def exchange(
        self, identity: Identity, era: Era, method: str, params: JsonObject, client_headers: Headers | None = None
    ) -> JsonObject:
        """One request and the upstream's response to it: at 2026-07-28 on its own (`params` carry the `_meta`
        it needs), at 2025-11-25 on the context's session; a client's with its forwarded headers."""
        if client_headers is None:
            headers = identity.as_headers()
        else:
            headers = self._identities.forwarded(client_headers)
            tracing().inject(headers, None)  # the client span's context goes upstream
        if era == "modern":
            return await self._modern_exchange(method, params, headers)
        return await self._sessions.request(identity.context, method, params, headers)

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
        """A client's request in `era`, answered whole (a 2026-07-28 one is passed through instead)."""
        return whole(response(request_id, shape(await self.exchange(identity, era, method, params, client_headers))))

    async def pass_through(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        headers = self._identities.forwarded(client_headers)
        # The client span's context goes upstream (in the headers and in `_meta`).
        tracing().inject(headers, message.meta)
        for name, value in client_headers.items():
            if name[:4].lower() == "mcp-":
                lower = name.lower()
                if lower in _MCP_REQUEST_HEADERS or lower.startswith("mcp-param-"):
                    headers[name] = value
        idempotent = message.method in READ_ONLY_METHODS
        body = orjson.dumps(message.raw)
        return await pass_request(
            self._http, self.protection, self._config, body, headers, request_id=message.id, idempotent=idempotent
        )

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None,
        http_method: str,
    ) -> Reply:
        """Pass a legacy-era client's request through on the upstream session `session_id` (the upstream's
        own id; the client's session header is replaced by it, or dropped when None)."""
        headers = self._identities.forwarded(client_headers)
        for name, value in client_headers.items():
            if name.lower() == "mcp-protocol-version":
                headers[name] = value
        if session_id is not None:
            headers[HEADER_SESSION_ID] = session_id
        with self._reach.observe("legacy-session"):
            # The upstream's session id is handed back only when a session is being opened (to the caller,
            # which names it anew); on a session's later answers it must never reach the client.
            return await pass_request(
                self._http,
                self.protection,
                self._config,
                body,
                headers,
                pass_session=session_id is None,
                http_method=http_method,
                request_id=request_id_of(body) if http_method == "POST" else None,
            )

    # -- the upstream's notifications -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open_stream(
        self, identity: Identity, era: Era, params: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """At 2026-07-28 a `subscriptions/listen` POST held open; at 2025-11-25 the context session's GET stream
        (the bridge subscribes to URIs on the same session)."""
        headers = identity.as_headers()
        if era == "legacy":
            async with self._sessions.open_notifications(identity.context, headers) as messages:
                yield messages
            return
        _, body, sent = self._modern_request("subscriptions/listen", params, headers)
        async with self._http.send("POST", body, sent, long_lived=True) as response:
            await raise_for_status(response, self._http)
            limit = self._http.max_response_bytes
            yield (message async for message in iter_messages(response, limit, self.url) if "method" in message)

    def _modern_request(
        self, method: str, params: JsonObject, headers: Mapping[str, str]
    ) -> tuple[str, bytes, dict[str, str]]:
        """Id, body and headers of a 2026-07-28 request made on the sidecar's own behalf (`params` with its `_meta`)."""
        request_id = f"sidecar-{next(self._ids)}"
        meta = params["_meta"]
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        sent = {
            **headers,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            HEADER_PROTOCOL_VERSION: MODERN_VERSION,
            HEADER_METHOD: method,
        }
        named = NAMED_METHODS.get(method)
        if named is not None:
            sent[HEADER_NAME] = encode_header_value(str(params.get(named, "")))
        tracing().inject(sent, meta)  # a poll's span, when tracing is on
        return request_id, orjson.dumps(body), sent

    async def _modern_exchange(self, method: str, params: JsonObject, headers: Mapping[str, str]) -> JsonObject:
        request_id, body, sent = self._modern_request(method, params, headers)
        async with self._http.post(body, sent, idempotent=method in READ_ONLY_METHODS) as response:
            await raise_for_status(response, self._http)
            async for reply in iter_messages(response, self._http.max_response_bytes, self.url):
                if reply.get("id") == request_id:
                    return reply
        raise UpstreamBadResponse(self.url, "stream ended without a response")


def _refusal(exc: UpstreamError) -> bool:
    """The upstream itself refused server/discover (a JSON-RPC error, an HTTP status of its own)."""
    if isinstance(exc, UpstreamHTTPError):
        return exc.status not in _GATEWAY_STATUSES
    return isinstance(exc, UpstreamRpcError)
