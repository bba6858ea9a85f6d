"""The one way to the upstream: era detection, faithful forwarding, and the sidecar's own calls (polls)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from multidict import CIMultiDictProxy

from sidecar.config import CacheConfig, UpstreamConfig
from sidecar.identity import ANONYMOUS_IDENTITY, Identity, IdentityRule
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.protocol.constants import (
    HEADER_METHOD,
    HEADER_NAME,
    HEADER_PROTOCOL_VERSION,
    HEADER_SESSION_ID,
    MODERN_VERSION,
    NAMED_METHODS,
    READ_ONLY_METHODS,
)
from sidecar.protocol.envelope import Message, RequestId, encode_header_value
from sidecar.protocol.errors import (
    UpstreamBadResponse,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamRpcError,
)
from sidecar.protocol.frames import modern_request_meta
from sidecar.upstream.answers import ReleasingStream, Reply, UpstreamInfo
from sidecar.upstream.http.auth import metadata_paths, rewrite_challenge, rewrite_metadata
from sidecar.upstream.http.endpoint import UpstreamHTTP, iter_messages, raise_for_status, read_limited
from sidecar.upstream.http.legacy import LegacyBridge
from sidecar.upstream.http.relay import relay_answer, relay_events, request_id_of
from sidecar.upstream.http.state import UpstreamState
from sidecar.upstream.http.wire import Answer
from sidecar.upstream.sse import SSE_CONTENT_TYPE

__all__ = ["UpstreamClient"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Headers = CIMultiDictProxy[str] | Mapping[str, str]

_READY_FRESH_S = 2.0
"""A readiness check trusts an answer this recent; older, it probes the upstream again."""

_PASSTHROUGH_RESPONSE_HEADERS = ("Content-Type", "WWW-Authenticate")
_MCP_REQUEST_HEADERS = frozenset(name.lower() for name in (HEADER_PROTOCOL_VERSION, HEADER_METHOD, HEADER_NAME))
"""The client's 2026-07-28 headers that go upstream as they came (validated equal to the body's values), and
its `Mcp-Param-*` headers."""


class UpstreamClient(UpstreamState):
    """Forwards client requests and makes the sidecar's own calls, in whichever era the upstream speaks."""

    def __init__(
        self,
        config: UpstreamConfig,
        cache: CacheConfig,
        metrics: Metrics | None = None,
        identities: IdentityRule | None = None,
    ) -> None:
        super().__init__(config.display_url, metrics or Metrics())
        self._config = config
        self._identities = identities or IdentityRule(config.forward_headers, config.non_identity_headers)
        self._http = UpstreamHTTP(config)
        self._legacy = LegacyBridge(self._http, cache)
        self._probe_lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def start(self) -> None:
        await self._http.start()

    async def aclose(self) -> None:
        self._stop_retrying()
        await self._http.aclose()

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: see `UpstreamHTTP.drain`."""
        self._http.drain(grace_s)

    def use_tls(self, context: ssl.SSLContext) -> None:
        """New connections to an https upstream use `context` (its certificate files were read again)."""
        self._http.use_tls(context)

    # -- era ---------------------------------------------------------------------------------------------

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        """Probe the upstream once (again after a failure) and remember its era and capabilities; the probe goes
        with `identity`'s headers, since a protected upstream refuses an anonymous one."""
        info = self._info
        if info is not None:
            return info
        async with self._probe_lock:
            if self._info is None:
                try:
                    with self._observe("probe"):
                        info = await self._probe(identity)
                except UpstreamError as exc:
                    self._probe_failed(exc)
                    raise
                self._set_info(info)
                return info
            return self._info

    async def check(self) -> bool:
        """Readiness: True when the upstream's era is known (or it is protected and answered a probe with a
        challenge) and it answered recently; without recent contact it is asked again."""
        if self._info is None:
            with contextlib.suppress(UpstreamError):
                await self.ensure_info()
        elif time.monotonic() - self._last_ok > _READY_FRESH_S:
            with contextlib.suppress(UpstreamError):
                await self._liveness()
        return self.not_ready_reason is None

    async def _reach(self) -> None:
        if self._info is None:
            await self.ensure_info()
        else:
            await self._liveness()

    async def _liveness(self) -> None:
        # One cheap exchange in the era already known; a cached legacy session alone would prove nothing.
        info = self._info
        if info is None:
            return
        try:
            with self._observe("probe"):
                if info.era == "modern":
                    await self._modern_call("server/discover", {}, {})
                else:
                    answer = await self._legacy.request(ANONYMOUS_IDENTITY.context, "ping", {}, {})
                    if "error" in answer:
                        raise UpstreamRpcError(self.url, answer["error"])
        except UpstreamRpcError:
            self._usable(None)  # an error answer is an answer: the upstream speaks JSON-RPC
        except UpstreamError as exc:
            self._probe_failed(exc)
            if self.unusable is not None:
                self._info = None  # probed afresh once it answers sensibly again
            raise
        else:
            self._usable(None)

    async def _probe(self, identity: Identity) -> UpstreamInfo:
        protocol = self._config.protocol
        headers = identity.as_headers()
        if protocol != "2025-11-25":
            try:
                result = await self._modern_call("server/discover", {}, headers)
            except UpstreamError as exc:
                # Only a refusal means "try the handshake era": an answer that is not MCP at all is no era, and
                # neither is a transport failure (refused, reset, or a gateway's 502/503/504 for an upstream it
                # cannot reach): a dual-era server would answer initialize next and be driven as legacy for good.
                if protocol == MODERN_VERSION or not _refusal(exc):
                    raise
                logger.debug("server/discover refused (%s); trying initialize", exc.reason)
            else:
                versions = result.get("supportedVersions")
                if isinstance(versions, list) and MODERN_VERSION in versions:
                    meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
                    return UpstreamInfo(
                        era="modern",
                        capabilities=_object(result.get("capabilities")),
                        server_info=_object_or_none((meta or {}).get("io.modelcontextprotocol/serverInfo")),
                        instructions=_str_or_none(result.get("instructions")),
                    )
                if protocol == MODERN_VERSION:
                    raise UpstreamBadResponse(self.url, f"server/discover does not list {MODERN_VERSION}")
        # Over the network even when the context has a session: a cached one proves nothing about now.
        session = await self._legacy.reach(identity.context, headers)
        result = session.initialize_result
        return UpstreamInfo(
            era="legacy",
            capabilities=_object(result.get("capabilities")),
            server_info=_object_or_none(result.get("serverInfo")),
            instructions=_str_or_none(result.get("instructions")),
        )

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """Response headers for the client: an auth challenge points at the sidecar when public_url is set."""
        public_url = self._config.public_url
        if public_url is None:
            return headers
        return {
            name: rewrite_challenge(value, public_url) if name.lower() == "www-authenticate" else value
            for name, value in headers.items()
        }

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        """The upstream's OAuth protected-resource metadata, rewritten to name `public_url`; None if it has none."""
        parts = urlsplit(self._config.url)
        for path in metadata_paths(self._config.url):
            url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
            with contextlib.suppress(UpstreamError):
                status, body = await self._http.get(url, self._http.max_response_bytes)
                document = _try_json(body) if status == 200 else None
                if document is not None:
                    return rewrite_metadata(document, public_url)
        return None

    # -- forwarding --------------------------------------------------------------------------------------

    async def forward(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """Send a client's request upstream and return the answer for the client, in the client's era."""
        headers = self._identities.forwarded(client_headers)
        info = await self.ensure_info(identity)
        # The client span's context goes upstream (in the headers; at 2026-07-28 in `_meta` too).
        tracing().inject(headers, message.meta if info.era == "modern" else None)
        with self._observe(message.method):
            if info.era == "modern":
                return await self._forward_modern(message, client_headers, headers)
            answer = await self._legacy.request(identity.context, message.method, message.params, headers)
            answer = {"jsonrpc": "2.0", "id": message.id, **answer}
            return Reply(200, {"Content-Type": "application/json"}, message=answer)

    async def _forward_modern(self, message: Message, client_headers: Headers, headers: dict[str, str]) -> Reply:
        for name, value in client_headers.items():
            if name[:4].lower() == "mcp-":
                lower = name.lower()
                if lower in _MCP_REQUEST_HEADERS or lower.startswith("mcp-param-"):
                    headers[name] = value
        idempotent = message.method in READ_ONLY_METHODS
        return await self._relay_post(orjson.dumps(message.raw), headers, request_id=message.id, idempotent=idempotent)

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None = None,
        http_method: str = "POST",
    ) -> Reply:
        """Pass a legacy-era client's request through on the upstream session `session_id` (the upstream's
        own id; the client's session header is replaced by it, or dropped when None)."""
        headers = self._identities.forwarded(client_headers)
        for name, value in client_headers.items():
            if name.lower() == "mcp-protocol-version":
                headers[name] = value
        if session_id is not None:
            headers[HEADER_SESSION_ID] = session_id
        with self._observe("legacy-session"):
            # The upstream's session id is handed back only when a session is being opened (to the caller,
            # which names it anew); on a session's later answers it must never reach the client.
            return await self._relay_post(
                body,
                headers,
                pass_session=session_id is None,
                http_method=http_method,
                request_id=request_id_of(body) if http_method == "POST" else None,
            )

    async def _relay_post(
        self,
        body: bytes | None,
        headers: dict[str, str],
        *,
        pass_session: bool = False,
        http_method: str = "POST",
        request_id: RequestId | None = None,
        idempotent: bool = False,
    ) -> Reply:
        if body is not None:
            headers["Content-Type"] = "application/json"
        headers["Accept"] = "application/json, text/event-stream" if http_method == "POST" else SSE_CONTENT_TYPE
        names = (*_PASSTHROUGH_RESPONSE_HEADERS, HEADER_SESSION_ID) if pass_session else _PASSTHROUGH_RESPONSE_HEADERS
        # The whole answer within timeout_s (a body dripping a byte at a time must not hold a client and a
        # pooled connection for ever); an SSE answer, once it starts, is bounded by silence and max_stream_s.
        response = await self._http.open(http_method, body, headers, idempotent=idempotent)
        try:
            passthrough = self.public_headers(
                {name: response.headers[name] for name in names if name in response.headers}
            )
            if response.headers.get("Content-Type", "").startswith(SSE_CONTENT_TYPE) and response.status < 300:
                response.unbounded(self._config.timeout_s)
                stream = ReleasingStream(self._relay(response, request_id), response.release)
                return Reply(response.status, passthrough, stream=stream)
            body = await read_limited(response, self._http.max_response_bytes, self.url)
        except BaseException:
            response.release()
            raise
        response.release()
        decoded = _try_json(body)
        if http_method != "POST" and response.status < 500:
            return Reply(response.status, passthrough, message=decoded, body=body)
        if response.status in (401, 403) or isinstance(decoded, dict) or (response.status < 300 and not body):
            return Reply(response.status, passthrough, message=decoded, body=body)
        if 200 <= response.status < 300:
            raise UpstreamBadResponse(self.url, "answer is not JSON")
        raise UpstreamHTTPError(self.url, response.status, response.reason or "")

    def _relay(self, response: Answer, request_id: RequestId | None) -> AsyncGenerator[bytes, None]:
        # Relayed as it arrives (buffering would hold back progress); a stream that breaks off ends with a
        # JSON-RPC error event for its request rather than as a cut stream (see upstream/relay.py).
        limit = self._http.max_response_bytes
        if request_id is None:
            return relay_events(response, upstream=self.url, limit=limit)
        max_s = self._config.max_stream_s
        return relay_answer(response, request_id, upstream=self.url, limit=limit, max_s=max_s)

    # -- the sidecar's own calls ---------------------------------------------------------------------------

    async def call(self, method: str, params: JsonObject, identity: Identity = ANONYMOUS_IDENTITY) -> JsonObject:
        """One request on the sidecar's behalf (a poll), for `identity`; the result, or an UpstreamError."""
        headers = identity.as_headers()
        info = await self.ensure_info(identity)
        with self._observe(method):
            if info.era == "modern":
                return await self._modern_call(method, params, headers)
            answer = await self._legacy.request(identity.context, method, params, headers)
        if "error" in answer:
            raise UpstreamRpcError(self.url, answer["error"])
        result: JsonObject = answer["result"]
        return result

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """The upstream's own notifications for one authorization context, held open for the block: against a
        2026-07-28 upstream, a `subscriptions/listen` with the filter `wanted` (its first message is the ack);
        against a 2025-11-25 one, the context session's GET stream (the caller subscribes to URIs with
        `call("resources/subscribe", ...)`, which uses the same session)."""
        headers = identity.as_headers()
        info = await self.ensure_info(identity)
        if info.era == "legacy":
            async with self._legacy.open_notifications(identity.context, headers) as messages:
                yield messages
            return
        _, body, sent = self._modern_request("subscriptions/listen", {"notifications": wanted}, headers)
        async with self._http.send("POST", body, sent, long_lived=True) as response:
            await raise_for_status(response, self._http)
            limit = self._http.max_response_bytes
            yield (message async for message in iter_messages(response, limit, self.url) if "method" in message)

    def _modern_request(
        self, method: str, params: JsonObject, headers: Mapping[str, str]
    ) -> tuple[str, bytes, dict[str, str]]:
        """Id, body and headers of a 2026-07-28 request made on the sidecar's own behalf."""
        request_id = f"sidecar-{next(self._ids)}"
        meta = modern_request_meta()
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}
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

    async def _modern_call(self, method: str, params: JsonObject, headers: Mapping[str, str]) -> JsonObject:
        request_id, body, sent = self._modern_request(method, params, headers)
        async with self._http.post(body, sent, idempotent=method in READ_ONLY_METHODS) as response:
            await raise_for_status(response, self._http)
            async for reply in iter_messages(response, self._http.max_response_bytes, self.url):
                if reply.get("id") != request_id:
                    continue
                if isinstance(reply.get("error"), dict):
                    raise UpstreamRpcError(self.url, reply["error"])
                result = reply.get("result")
                if not isinstance(result, dict):
                    raise UpstreamBadResponse(self.url, "response has neither result nor error")
                return result
        raise UpstreamBadResponse(self.url, "stream ended without a response")


def _try_json(body: bytes) -> JsonObject | None:
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return decoded if isinstance(decoded, dict) else None


_GATEWAY_STATUSES = (502, 503, 504)
"""What a proxy in front says for an upstream it cannot reach, or one not up yet: the upstream said nothing."""


def _refusal(exc: UpstreamError) -> bool:
    """The upstream itself refused server/discover (a JSON-RPC error, an HTTP status of its own)."""
    if isinstance(exc, UpstreamHTTPError):
        return exc.status not in _GATEWAY_STATUSES
    return isinstance(exc, UpstreamRpcError)


def _object(value: Any) -> JsonObject:
    return value if isinstance(value, dict) else {}


def _object_or_none(value: Any) -> JsonObject | None:
    return value if isinstance(value, dict) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
