"""`subscriptions/listen`: the ack, then a signal per change, as one SSE stream per request.

Order (as the SDK's ListenHandler): register interest, send the ack, drain pending signals, and
release interest in `finally`. Stamping and filtering happen here only; the bus never sees JSON-RPC.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Protocol

import orjson
from aiohttp import web

from sidecar.backoff import JITTER
from sidecar.changes import Bus, ChangeEvent, WatchKey, WatchKind
from sidecar.config import StreamsConfig
from sidecar.downstream.delivered import Delivered
from sidecar.downstream.event_stream import EventStream, KeepAliveTicker, StreamStalled
from sidecar.downstream.listen_filter import (
    Ack,
    Asked,
    LeftOut,
    SubscriptionFilter,
    log_left_out,
    parse_filter,
)
from sidecar.downstream.pending import PendingSignals
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.protocol.envelope import Message, RequestId
from sidecar.protocol.errors import InvalidParams, Overloaded, RpcError, UpstreamError, UpstreamHTTPError
from sidecar.protocol.frames import ack_notification, complete_result, notification
from sidecar.protocol.lists import LIST_KINDS
from sidecar.upstream.base import LearnEra
from sidecar.watch.registry import Handle, WatchRegistry

__all__ = ["ListenStream", "SignalSink", "StreamHub", "SubscriptionFilter", "parse_filter"]

logger = logging.getLogger(__name__)

_FLUSH_SLICE = 1024
"""Streams the fan-out writes to before it lets the event loop run other work."""
_MAX_AGE_JITTER = 0.1
"""Streams opened together (a reconnect wave) end spread over a tenth of `max_age_s`, not in one instant."""
_ID_SLOT = "\x00"
_ID_SLOT_JSON = b'"\\u0000"'


@functools.lru_cache(maxsize=256)
def _frame_around_id(method: str, uri: str | None) -> tuple[bytes, bytes]:
    """A notification's JSON before and after its subscription id: the same for every stream a change reaches,
    so a fan-out encodes it once, not once per stream. The slot is the first string that JSON-escapes to
    `"\\u0000"`: `_meta` (and the id in it) comes before the URI, and a method name holds no NUL."""
    before, slot, after = orjson.dumps(notification(_ID_SLOT, method, uri)).partition(_ID_SLOT_JSON)
    assert slot, "the id slot is in the frame"
    return before, after


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
    """One listen request: a pending set of signals keyed by (method, uri), never a queue (invariant 11).

    Signals are written straight into the connection's send buffer by the hub's fan-out while it has room;
    what does not fit stays pending (merging with later signals for the same key) for the stream's handler,
    which awaits the slow client.
    """

    def __init__(
        self,
        subscription_id: RequestId,
        metrics: Metrics,
        on_pending: Callable[[ListenStream], None],
        on_written: Callable[[str, float], None],
    ) -> None:
        self.subscription_id = subscription_id
        self.handles: list[Handle] = []
        self.end_reason = "client"
        self.ended = False
        self._on_pending = on_pending
        self._on_written = on_written
        self._pending = PendingSignals(metrics.coalesced)
        self._waiter: asyncio.Future[None] | None = None
        """Set while the handler waits for work (an asyncio.Event would keep a deque per stream for ever)."""
        self._closing = False
        self._events: EventStream | None = None
        """Set from the ack until the complete result: only then may signals be written."""

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def signal(self, method: str, uri: str | None, detected_at: float) -> None:
        """Called by the bus fan-out; synchronous, never raises. A second signal before a write merges."""
        if self._pending.add(method, uri, detected_at):
            self._on_pending(self)

    def revoke(self, key: WatchKey) -> list[Handle]:
        """A refused credential ends the whole stream, so the client re-authenticates and listens again."""
        self.close("auth")
        return []

    def close(self, reason: str) -> None:
        """Start a graceful end: pending signals flush, then the complete result, then the stream closes."""
        self._closing = True
        self.end_reason = reason
        self._wake()

    def flush(self) -> None:
        """Write pending signals while the send buffer has room; wake the handler for the rest."""
        events = self._events
        if events is None:
            return  # not acknowledged yet: the handler writes them after the ack
        pending = self._pending
        while pending and events.writable:
            key = next(iter(pending))
            detected_at = pending.pop(key)
            before, after = _frame_around_id(*key)
            events.write_event(before + orjson.dumps(self.subscription_id) + after)
            self._on_written(key[0], detected_at)
        if pending:
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def keepalive(self) -> bool:
        """The shared ticker's visit: a comment if nothing was written since the last one."""
        events = self._events
        if events is None:
            return False
        wrote = events.quiet and events.writable
        if wrote:
            events.write_comment()
        events.quiet = True
        return wrote

    async def serve(self, events: EventStream) -> None:
        """From the ack on: write what the fan-out could not (a slow client), then, when closed, the complete."""
        self._events = events
        try:
            while True:
                self.flush()
                if not events.connected:
                    return
                if self._pending:
                    await events.drain()  # StreamStalled: the client stopped reading
                    continue
                if self._closing:
                    events.write_event(orjson.dumps(complete_result(self.subscription_id)))
                    return
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            self._events = None


class StreamHub:
    """Every open listen stream of this process, indexed by the watch keys they hold."""

    def __init__(
        self, registry: WatchRegistry, upstream: LearnEra, bus: Bus, config: StreamsConfig, metrics: Metrics
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._config = config
        self._metrics = metrics
        self._by_key: dict[WatchKey, set[SignalSink]] = {}
        self._streams: set[ListenStream] = set()
        self._closing = False
        self._dirty: dict[ListenStream, None] = {}
        """Streams with pending signals, in the order they got them, for the next fan-out pass."""
        self._flush_scheduled = False
        self._delivered = Delivered(metrics)
        self._keepalive = KeepAliveTicker(config.keepalive_s, lambda: self._streams, metrics.keepalives.inc)
        self._unsubscribe: Callable[[], None] = bus.subscribe(self._on_change)
        registry.on_auth_failure(self._on_auth_failure)

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    def attach(self, sink: SignalSink, handle: Handle) -> None:
        """Deliver changes of `handle`'s key to `sink` (a listen stream or a legacy session)."""
        self._by_key.setdefault(handle.key, set()).add(sink)

    def detach(self, sink: SignalSink, handle: Handle) -> None:
        sinks = self._by_key.get(handle.key)
        if sinks is not None:
            sinks.discard(sink)
            if not sinks:
                del self._by_key[handle.key]

    def _on_change(self, event: ChangeEvent) -> None:
        if event.baseline:
            return  # a watch's first look: nothing changed for anyone
        streams = self._by_key.get(event.key, ())
        with tracing().fanout(event.key.kind, event.key.short_hash, len(streams)):
            for stream in streams:
                stream.signal(event.key.notification_method, event.key.uri, event.detected_at)

    # -- fan-out: signals become pending at once; a pass over the streams then writes them ------------------

    def _pending(self, stream: ListenStream) -> None:
        self._dirty[stream] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        # Written into each stream's send buffer in one pass, no task or await per stream; a slice at a time,
        # so that ten thousand streams do not hold the event loop for the whole pass.
        dirty = self._dirty
        for _ in range(min(len(dirty), _FLUSH_SLICE)):
            stream = next(iter(dirty))
            del dirty[stream]
            stream.flush()
        if dirty:
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._flush_scheduled = False

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
        stream = ListenStream(message.id, self._metrics, self._pending, self._delivered.written)
        self._streams.add(stream)
        self._metrics.listen_streams.inc()
        self._keepalive.start()
        events = EventStream(
            request, high_water=self._config.write_buffer_bytes, stall_timeout_s=self._config.stall_timeout_s
        )
        try:
            ack = await self._subscribe(stream, wanted, identity)
            # A stream may live for hours: keep only what it needs. The callers' frames still hold `message` (its
            # id was taken above; nothing reads it after a listen), so its parsed body is emptied, not just dropped.
            message.raw.clear()
            message.params.clear()
            del message, wanted
            await events.open()
            events.write_event(orjson.dumps(ack_notification(stream.subscription_id, ack.honoured, ack.meta())))
            logger.info(
                "listen stream opened",
                extra={"subscription_id": stream.subscription_id, "watches": len(stream.handles)},
            )
            log_left_out(
                "listen left URIs out of its ack", ack.left_out, identity, subscription_id=stream.subscription_id
            )
            del ack
            expiry = self._expiry(stream)
            try:
                await stream.serve(events)
            finally:
                if expiry is not None:
                    expiry.cancel()
        except StreamStalled:
            stream.end_reason = "stalled"
        except ConnectionResetError:
            stream.end_reason = "client"  # gone mid-write: an ordinary end, nothing to answer
        finally:
            # Interest first, so nothing below can leave this stream counted and its watches held.
            self._end(stream)
            self._dirty.pop(stream, None)
        await events.close()
        return events.response

    def _expiry(self, stream: ListenStream) -> asyncio.TimerHandle | None:
        max_age_s = self._config.max_age_s
        if not max_age_s:
            return None
        age_s = max_age_s * (1 - _MAX_AGE_JITTER * JITTER.random())
        return asyncio.get_running_loop().call_later(age_s, stream.close, "max_age")

    async def _subscribe(self, stream: ListenStream, wanted: SubscriptionFilter, identity: Identity) -> Ack:
        ack = Ack()
        limit = self._config.max_uris_per_stream
        uris = wanted.uris[:limit]
        if len(wanted.uris) > len(uris):
            self._metrics.limit_rejections.labels("max_uris_per_stream").inc(len(wanted.uris) - len(uris))
        # The probe (when this is the first contact) goes as the client: a protected upstream would refuse an
        # anonymous one, and the client would get a 401 for a token that is valid.
        capabilities = (await self._upstream.ensure_info(identity)).capabilities
        # A list kind whose primitive the upstream lacks is left out of the ack (invariant 2).
        lists: list[tuple[str, WatchKind]] = []
        for row in LIST_KINDS.values():
            if row.kind in wanted.lists:
                if row.primitive in capabilities:
                    lists.append((row.filter_field, row.kind))
                else:
                    ack.leave_out(LeftOut.unsupported(row.filter_field, row.primitive))

        failures: list[UpstreamError | RpcError] = []

        async def join(kind: WatchKind, uri: str | None, field: str | None = None) -> LeftOut | None:
            """None when joined; else why not."""
            try:
                handle = await self._registry.acquire(kind, uri, identity)
            except (UpstreamError, RpcError) as exc:
                failures.append(exc)  # left out of the ack; the listen fails with it if nothing else joins
                return LeftOut.refused(exc, uri, field)
            except Exception:  # boundary: one URI's failure leaves it out of the ack, never the others' handles
                logger.exception("subscribing failed", extra={"kind": kind})
                return LeftOut.internal(uri, field)
            if handle is None:
                return LeftOut.not_found(uri, field)
            if stream.ended:  # the stream ended while this baseline was read: nobody reads its ack
                handle.release()
                return LeftOut.internal(uri, field)
            # Registered at once, before any other await, so a change after this baseline reaches us; counted at
            # once too, as _end uncounts every resource handle, also those of a stream gone before its ack.
            stream.handles.append(handle)
            self.attach(stream, handle)
            if kind == "resource":
                self._metrics.subscriptions.inc()
            return None

        asked = [*(Asked(field, None) for field, _ in lists), *(Asked(None, uri) for uri in uris)]
        outcomes = await asyncio.gather(
            *(join(kind, None, field) for field, kind in lists), *(join("resource", uri) for uri in uris)
        )
        ack.settle(asked, outcomes)
        for uri in wanted.uris[limit:]:
            ack.leave_out(LeftOut.over_limit(uri, limit))
        if failures and not ack.honoured:
            # Nothing could be honoured because the upstream could not answer: say so (a refused credential
            # first, so the client re-authenticates) instead of an empty ack that reads as "nothing exists".
            raise next(
                (exc for exc in failures if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure), failures[0]
            )
        return ack

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

    async def aclose(self) -> None:
        self._unsubscribe()
        await self._keepalive.stop()
