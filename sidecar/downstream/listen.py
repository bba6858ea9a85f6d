"""`subscriptions/listen`: the ack, then a signal per change, as one SSE stream per request.

Order (as the SDK's ListenHandler): register interest, send the ack, drain pending signals, and
release interest in `finally`. Stamping and filtering happen here only; the bus never sees JSON-RPC.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp_sse import EventSourceResponse

from sidecar.changes import Bus, ChangeEvent, WatchKey, WatchKind
from sidecar.config import StreamsConfig
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.envelope import Message, RequestId
from sidecar.protocol.errors import InvalidParams, Overloaded, RpcError, UpstreamError, UpstreamHTTPError
from sidecar.protocol.frames import ack_notification, complete_result, notification
from sidecar.upstream.base import Upstream
from sidecar.watch.registry import Handle, WatchRegistry

__all__ = ["ListenStream", "SignalSink", "StreamHub", "SubscriptionFilter", "parse_filter"]

logger = logging.getLogger(__name__)

_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_LIST_FIELDS: tuple[tuple[str, WatchKind, str], ...] = (
    ("toolsListChanged", "tools_list", "tools"),
    ("promptsListChanged", "prompts_list", "prompts"),
    ("resourcesListChanged", "resources_list", "resources"),
)


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    """What a listen request asked for: list kinds and resource URIs (deduplicated, in the order given)."""

    lists: tuple[WatchKind, ...]
    uris: tuple[str, ...]


def parse_filter(params: dict[str, Any], max_uri_length: int) -> SubscriptionFilter:
    """Validate `params.notifications`; a malformed filter is -32602 before any stream opens."""
    notifications = params.get("notifications")
    if not isinstance(notifications, dict):
        raise InvalidParams("params.notifications must be an object (a SubscriptionFilter)")
    lists: list[WatchKind] = []
    for field, kind, _ in _LIST_FIELDS:
        value = notifications.get(field, False)
        if not isinstance(value, bool):
            raise InvalidParams(f"notifications.{field} must be a boolean")
        if value:
            lists.append(kind)
    uris = notifications.get("resourceSubscriptions", [])
    if not isinstance(uris, list):
        raise InvalidParams("notifications.resourceSubscriptions must be an array of URIs")
    for uri in uris:
        if not isinstance(uri, str) or not _URI_SCHEME.match(uri):
            raise InvalidParams("notifications.resourceSubscriptions must contain only URIs")
        if len(uri) > max_uri_length:
            raise InvalidParams(f"a subscribed URI is longer than {max_uri_length} characters")
    return SubscriptionFilter(tuple(lists), tuple(dict.fromkeys(uris)))


class _EventStream(EventSourceResponse):
    """aiohttp-sse's response, counting the keep-alive comments it writes."""

    def __init__(self, metrics: Metrics, keepalive_s: float) -> None:
        super().__init__(allow_all_methods=True, ping_interval=keepalive_s)
        self._metrics = metrics

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if bytes(data[:1]) == b":":
            self._metrics.keepalives.inc()
        await super().write(data)


class SignalSink(Protocol):
    """Something the hub delivers change signals to: a listen stream, or a legacy session."""

    @property
    def handles(self) -> list[Handle]: ...

    def signal(self, method: str, uri: str | None, detected_at: float) -> None: ...

    def close(self, reason: str) -> None: ...

    def revoke(self, key: WatchKey) -> list[Handle]:
        """Its context was refused `key` upstream: stop delivering it; returns the handles to release now."""
        ...


class ListenStream:
    """One listen request: a pending set of signals keyed by (method, uri), never a queue (invariant 11)."""

    def __init__(self, subscription_id: RequestId, metrics: Metrics) -> None:
        self.subscription_id = subscription_id
        self.handles: list[Handle] = []
        self.end_reason = "client"
        self.ended = False
        self._metrics = metrics
        self._pending: dict[tuple[str, str | None], float] = {}
        self._wake = asyncio.Event()
        self._closing = False

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def signal(self, method: str, uri: str | None, detected_at: float) -> None:
        """Called by the bus fan-out; synchronous, never raises. A second signal before a drain merges."""
        key = (method, uri)
        if key in self._pending:
            self._metrics.coalesced.inc()
            return
        self._pending[key] = detected_at
        self._wake.set()

    def revoke(self, key: WatchKey) -> list[Handle]:
        """A refused credential ends the whole stream, so the client re-authenticates and listens again."""
        self.close("auth")
        return []

    def close(self, reason: str) -> None:
        """Start a graceful end: pending signals flush, then the complete result, then the stream closes."""
        self._closing = True
        self.end_reason = reason
        self._wake.set()

    async def pump(self, response: _EventStream) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, {}
            for (method, uri), detected_at in pending.items():
                frame = notification(self.subscription_id, method, uri)
                await response.send(orjson.dumps(frame).decode())
                self._metrics.notifications.labels(method).inc()
                self._metrics.delivery_latency.observe(max(0.0, time.time() - detected_at))
            if self._closing:
                await response.send(orjson.dumps(complete_result(self.subscription_id)).decode())
                return


class StreamHub:
    """Every open listen stream of this process, indexed by the watch keys they hold."""

    def __init__(
        self, registry: WatchRegistry, upstream: Upstream, bus: Bus, config: StreamsConfig, metrics: Metrics
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._config = config
        self._metrics = metrics
        self._by_key: dict[WatchKey, set[SignalSink]] = {}
        self._streams: set[ListenStream] = set()
        self._closing = False
        self._unsubscribe: Callable[[], None] = bus.subscribe(self._on_change)
        registry.on_auth_failure(self._on_auth_failure)

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    def attach(self, sink: SignalSink, handle: Handle) -> None:
        """Deliver changes of `handle`'s key to `sink` (a listen stream or a legacy session)."""
        self._by_key.setdefault(handle.key, set()).add(sink)

    def detach(self, sink: SignalSink, handle: Handle) -> None:
        holders = self._by_key.get(handle.key)
        if holders is not None:
            holders.discard(sink)
            if not holders:
                del self._by_key[handle.key]

    def _on_change(self, event: ChangeEvent) -> None:
        if event.baseline:
            return  # a watch's first look: nothing changed for anyone
        for stream in self._by_key.get(event.key, ()):
            stream.signal(event.key.notification_method, event.key.uri, event.detected_at)

    def _on_auth_failure(self, key: WatchKey, context: str) -> None:
        # The credential was refused: that context's sinks on this key stop getting it (a listen stream ends, so
        # its client re-authenticates; a legacy session drops the subscription).
        for sink in list(self._by_key.get(key, ())):
            if any(handle.context == context and handle.key == key for handle in sink.handles):
                for handle in sink.revoke(key):
                    self.detach(sink, handle)
                    handle.release()

    async def handle_listen(self, request: web.Request, message: Message, identity: Identity) -> web.StreamResponse:
        if message.id is None:
            raise InvalidParams("subscriptions/listen must be a request with an id")
        wanted = parse_filter(message.params, self._config.max_uri_length)
        if self._closing:
            # After close_all, a stream opened now would never get its complete frame: refuse it with an answer.
            raise Overloaded("the sidecar is shutting down; listen again elsewhere or after the restart")
        if len(self._streams) >= self._config.max_streams:
            self._metrics.limit_rejections.labels("max_streams").inc()
            raise Overloaded(f"this sidecar already serves {self._config.max_streams} listen streams; retry later")
        stream = ListenStream(message.id, self._metrics)
        self._streams.add(stream)
        self._metrics.listen_streams.inc()
        response = _EventStream(self._metrics, self._config.keepalive_s)
        try:
            honoured = await self._subscribe(stream, wanted, identity)
            await response.prepare(request)
            await response.send(orjson.dumps(ack_notification(message.id, honoured)).decode())
            logger.info("listen stream opened", extra={"subscription_id": message.id, "watches": len(stream.handles)})
            await stream.pump(response)
            await response.write_eof()
        except ConnectionResetError:
            stream.end_reason = "client"  # gone mid-write: an ordinary end, nothing to answer
        finally:
            # Interest first, so nothing below can leave this stream counted and its watches held. A client gone
            # while the headers were written leaves a prepared response without a keep-alive task, where
            # stop_streaming() raises: ask is_connected() instead of prepared.
            self._end(stream)
            if response.is_connected():
                response.stop_streaming()  # the keep-alive task must not outlive the stream
        return response

    async def _subscribe(self, stream: ListenStream, wanted: SubscriptionFilter, identity: Identity) -> dict[str, Any]:
        uris = wanted.uris[: self._config.max_uris_per_stream]
        if len(wanted.uris) > len(uris):
            self._metrics.limit_rejections.labels("max_uris_per_stream").inc(len(wanted.uris) - len(uris))
        # The probe (when this is the first contact) goes as the client: a protected upstream would refuse an
        # anonymous one, and the client would get a 401 for a token that is valid.
        capabilities = (await self._upstream.ensure_info(identity)).capabilities
        # A list kind whose primitive the upstream lacks is left out of the ack (invariant 2).
        lists = [
            (field, kind)
            for field, kind, primitive in _LIST_FIELDS
            if kind in wanted.lists and primitive in capabilities
        ]

        failures: list[UpstreamError | RpcError] = []

        async def join(kind: WatchKind, uri: str | None) -> bool:
            try:
                handle = await self._registry.acquire(kind, uri, identity)
            except (UpstreamError, RpcError) as exc:
                failures.append(exc)  # left out of the ack; the listen fails with it if nothing else joins
                return False
            except Exception:  # boundary: one URI's failure leaves it out of the ack, never the others' handles
                logger.exception("subscribing failed", extra={"kind": kind})
                return False
            if handle is None:
                return False
            if stream.ended:  # the stream ended while this baseline was read
                handle.release()
                return False
            # Registered at once, before any other await, so a change after this baseline reaches us; counted at
            # once too, as _end uncounts every resource handle, also those of a stream gone before its ack.
            stream.handles.append(handle)
            self.attach(stream, handle)
            if kind == "resource":
                self._metrics.subscriptions.inc()
            return True

        joined = await asyncio.gather(
            *(join(kind, None) for _, kind in lists), *(join("resource", uri) for uri in uris)
        )
        honoured: dict[str, Any] = {field: True for (field, _), ok in zip(lists, joined, strict=False) if ok}
        accepted = [uri for uri, ok in zip(uris, joined[len(lists) :], strict=True) if ok]
        if accepted:
            honoured["resourceSubscriptions"] = accepted
        if failures and not any(joined):
            # Nothing could be honoured because the upstream could not answer: say so (a refused credential
            # first, so the client re-authenticates) instead of an empty ack that reads as "nothing exists".
            raise next(
                (exc for exc in failures if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure), failures[0]
            )
        return honoured

    def _end(self, stream: ListenStream) -> None:
        stream.ended = True
        self._streams.discard(stream)
        for handle in stream.handles:
            self.detach(stream, handle)
            if handle.key.kind == "resource":
                self._metrics.subscriptions.dec()
            handle.release()
        stream.handles.clear()
        self._metrics.listen_streams.dec()
        self._metrics.streams_ended.labels(stream.end_reason).inc()
        logger.debug(
            "listen stream ended", extra={"subscription_id": stream.subscription_id, "reason": stream.end_reason}
        )

    async def close_all(self, reason: str = "shutdown") -> None:
        """Graceful shutdown: every stream gets the complete result; callers wait for their handlers."""
        self._closing = True
        for stream in list(self._streams):
            stream.close(reason)

    def aclose(self) -> None:
        self._unsubscribe()
