"""`subscriptions/listen`: the ack, then a signal per change, as one SSE stream per request.

Order (as the SDK's ListenHandler): register interest, send the ack, drain pending signals, and
release interest in `finally`. Stamping and filtering happen here only; the bus never sees JSON-RPC.

During an outage a client can still listen: the capabilities are the last ones its context was given, and a URI
(or list kind) whose first read cannot reach the upstream is acked and joined once the upstream can be used again,
when the stream is told of it once, so the client reads what it could not read meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import orjson
from aiohttp import web

from sidecar.backoff import JITTER, Backoff
from sidecar.changes import Bus, ChangeEvent, WatchKey
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
from sidecar.downstream.listen_stream import ClientConnection, ListenStream, SignalSink, Step
from sidecar.identity import Identity
from sidecar.observability.log_budget import LogBudget
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.protocol import (
    LIST_KINDS,
    RESOURCE_UPDATED_METHOD,
    InvalidParams,
    Message,
    Overloaded,
    RpcError,
    UpstreamError,
    ack_notification,
)
from sidecar.upstream.base import LearnEra
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer, sleep
from sidecar.watch.registry import Handle, WatchRegistry

__all__ = ["ClientConnection", "ListenStream", "SignalSink", "StreamHub", "SubscriptionFilter", "parse_filter"]

logger = logging.getLogger(__name__)

_FLUSH_SLICE = 1024
"""Streams the fan-out writes to before it lets the event loop run other work."""
_MAX_AGE_JITTER = 0.1
"""Streams opened together (a reconnect wave) end spread over a tenth of `max_age_s`, not in one instant."""
_JOIN_AGAIN = Backoff(1.0, 30.0, jitter=0.5)
"""Between tries to join what a stream acked during an outage, while the upstream fails again once back."""


class StreamHub:
    """Every open listen stream of this process, indexed by the watch keys they hold."""

    def __init__(
        self,
        registry: WatchRegistry,
        upstream: LearnEra,
        bus: Bus,
        config: StreamsConfig,
        metrics: Metrics,
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._upstream = upstream
        self._config = config
        self._metrics = metrics
        self._by_key: dict[WatchKey, set[SignalSink]] = {}
        self._streams: set[ListenStream] = set()
        self._closing = False
        self._moved: str | None = None
        """Why new listens go elsewhere (this replica cannot read the upstream and another can), or None."""
        self._dirty: OrderedDict[ListenStream, None] = OrderedDict()
        """Streams with pending signals, in the order they got them, for the next fan-out pass (an OrderedDict: taken
        from the front in O(1), where a dict's first key is found again past every slot deleted before it)."""
        self._flush_scheduled = False
        self._delivered = Delivered(metrics)
        self._ended_lines = LogBudget(clock=clock.now)
        """One info line per ended stream, up to a few a second per reason: a reconnect wave is a count, not a flood."""
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
            stream, _ = dirty.popitem(last=False)
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
        # pragma: no mutate block (the socket's edge: the integration tests pin it; a unit test has no request)
        config = self._config
        events = EventStream(request, high_water=config.write_buffer_bytes, stall_timeout_s=config.stall_timeout_s)
        await self.listen(message, identity, events)
        return events.response

    async def listen(self, message: Message, identity: Identity, events: ClientConnection) -> None:
        """One listen stream on `events`, from the checks and the ack to its end."""
        if message.id is None:
            raise InvalidParams("subscriptions/listen must be a request with an id")
        wanted = parse_filter(message.params, self._config.max_uri_length)
        if self._closing:
            # After close_all, a stream opened now would never get its complete frame: refuse it with an answer.
            raise Overloaded("the sidecar is shutting down; listen again elsewhere or after the restart")
        if self._moved is not None:
            raise Overloaded(f"{self._moved}; listen again")
        if len(self._streams) >= self._config.max_streams:
            self._metrics.limit_rejections.labels("max_streams").inc()
            raise Overloaded(f"this sidecar already serves {self._config.max_streams} listen streams; retry later")
        stream = ListenStream(message.id, self._metrics, self._pending, self._delivered.written)
        self._streams.add(stream)
        self._metrics.listen_streams.inc()
        self._keepalive.start()
        try:
            try:
                ack, deferred = await self._subscribe(stream, wanted, identity)
            except (UpstreamError, RpcError):
                stream.end_reason = "refused"  # the listen is answered with the error instead of an ack
                raise
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
            joining = None
            if deferred:
                logger.info(
                    "listen stream acked while the upstream cannot be reached; joined once it can",
                    extra={"subscription_id": stream.subscription_id, "waiting": len(deferred)},
                )
                joining = asyncio.get_running_loop().create_task(self._join_when_back(stream, deferred, identity))
            # The stream's driver from the ack on, inline (a coroutine of its own would cost every idle stream its
            # frame): it awaits what the stream's rules leave to wait for (a slow client, the next signal or the
            # close) and nothing else.
            try:
                stream.begin(events)
                try:
                    while (step := stream.step()) is not Step.DONE:
                        if step is Step.DRAIN:
                            await events.drain()  # StreamStalled: the client stopped reading
                            continue
                        stream.waiter = waiter = asyncio.get_running_loop().create_future()
                        try:
                            await waiter
                        finally:
                            stream.waiter = None
                finally:
                    stream.finish()
            finally:
                if expiry is not None:
                    expiry.cancel()
                if joining is not None:
                    joining.cancel()
        except StreamStalled:
            stream.end_reason = "stalled"
        except ConnectionResetError:
            stream.end_reason = "client"  # gone mid-write: an ordinary end, nothing to answer
        finally:
            # Interest first, so nothing below can leave this stream counted and its watches held.
            self._end(stream)
            self._dirty.pop(stream, None)
        await events.close()

    def _expiry(self, stream: ListenStream) -> Timer | None:
        max_age_s = self._config.max_age_s
        if not max_age_s:
            return None
        age_s = max_age_s * (1 - _MAX_AGE_JITTER * JITTER.random())
        return self._clock.call_at(self._clock.now() + age_s, lambda: stream.close("max_age"))

    async def _subscribe(
        self, stream: ListenStream, wanted: SubscriptionFilter, identity: Identity
    ) -> tuple[Ack, list[Asked]]:
        """The ack, and what it honours that is joined only once the upstream can be used again."""
        # The probe (when this is the first contact) goes as the client: a protected upstream would refuse an
        # anonymous one, and the client would get a 401 for a token that is valid. During an outage, the
        # capabilities are the last ones this context was given (`remembered`).
        info, remembered = await self._upstream.discovery(identity)
        ack = Ack(wanted, info.capabilities, self._config.max_uris_per_stream)
        if ack.over_limit:
            self._metrics.limit_rejections.labels("max_uris_per_stream").inc(len(ack.over_limit))
        failures: list[UpstreamError | RpcError] = []
        deferred: list[Asked] = []

        async def join(part: Asked) -> LeftOut | None:
            """None when joined (or to be joined once the upstream is back); else why not."""
            try:
                return await self._join(stream, part, identity)
            except (UpstreamError, RpcError) as exc:
                if remembered and isinstance(exc, UpstreamError) and exc.is_transport_failure:
                    deferred.append(part)  # the outage, not the URI: acked, and joined once it is over
                    return None
                failures.append(exc)  # left out of the ack; the listen fails with it if nothing else joins
                return LeftOut.refused(exc, part.uri, part.notification)

        ack.settle(await asyncio.gather(*(join(part) for part in ack.asked)))
        refusal = ack.refusal(failures)
        if refusal is not None:
            raise refusal
        return ack, deferred

    async def _join(self, stream: ListenStream, part: Asked, identity: Identity) -> LeftOut | None:
        """Join `part`'s watch for `stream`: None when joined; else why not. Raises the UpstreamError (or
        RpcError) of a first read the upstream could not answer."""
        uri, field = part.uri, part.notification
        try:
            handle = await self._registry.acquire(part.kind, uri, identity)
        except (UpstreamError, RpcError):
            raise
        except Exception:  # boundary: one URI's failure leaves it out of the ack, never the others' handles
            logger.exception("subscribing failed", extra={"kind": part.kind})
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
        if part.kind == "resource":
            self._metrics.subscriptions.inc()
        return None

    async def _join_when_back(self, stream: ListenStream, parts: Sequence[Asked], identity: Identity) -> None:
        """What `stream` acked during an outage, joined once the upstream can be used again. Each part is told
        once as it is joined, since the client could not read it meanwhile (a URI whose read then finds it
        missing or refused is told too, and not watched: the client's read says why); one whose read cannot
        reach the upstream again is tried again, backed off."""
        waiting = list(parts)
        tries = 0
        while waiting and not stream.ended:
            await self._upstream.reached()
            outcomes = await asyncio.gather(*(self._join_back(stream, part, identity) for part in waiting))
            waiting = [part for part, again in zip(waiting, outcomes, strict=True) if again]
            if waiting:
                tries += 1
                await sleep(self._clock, _JOIN_AGAIN.delay(tries))

    async def _join_back(self, stream: ListenStream, part: Asked, identity: Identity) -> bool:
        """Join one part acked during an outage and tell the stream; True when the upstream failed again."""
        try:
            await self._join(stream, part, identity)
        except UpstreamError as exc:
            if exc.is_transport_failure:
                return True
        except RpcError:
            pass  # refused (over a limit, say): told, so the client's read says why
        if not stream.ended:
            method = RESOURCE_UPDATED_METHOD if part.kind == "resource" else LIST_KINDS[part.kind].notification_method
            stream.signal(method, part.uri, time.time())
        return False

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
        held = self._ended_lines.take(stream.end_reason)
        if held is not None:
            extra: dict[str, object] = {"subscription_id": stream.subscription_id, "reason": stream.end_reason}
            if held:
                extra["not_logged_before"] = held  # streams ended for the same reason since the last such line
            logger.info("listen stream ended", extra=extra)

    def move(self, why: str | None) -> None:
        """`why` not None: this replica cannot read the upstream and another can, so every stream ends with the
        complete result and a retryable reason (its client listens again, through the load balancer, elsewhere)
        and new listens are refused until `move(None)`. Never while no other replica can read (invariant 14)."""
        self._moved = why
        if why is None:
            return
        for stream in list(self._streams):
            stream.close("moved")

    async def close_all(self, reason: str = "shutdown") -> None:
        """Graceful shutdown: every stream gets the complete result; callers wait for their handlers."""
        self._closing = True
        for stream in list(self._streams):
            stream.close(reason)

    async def aclose(self) -> None:
        self._unsubscribe()
        await self._keepalive.stop()
