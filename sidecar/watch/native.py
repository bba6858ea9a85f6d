"""The upstream's own notifications as change hints: one notification stream per authorization context.

When the upstream can push (a 2025-11-25 server declaring `resources.subscribe` or `listChanged`, or a
2026-07-28 server serving `subscriptions/listen`), the sidecar subscribes upstream for the keys each
context watches and treats every `notifications/resources/updated` or `*/list_changed` as a hint: the
watch polls at once, and the sidecar's own notification follows only when the content changed
(invariant 19). A key the upstream covers is "native": polling stays as the backstop, at its usual
interval unless `polling.native_backstop_ms` stretches it (the npm reference server declares
`resources.subscribe` yet announces nothing until a tool asks it to: trusting every declaration would
leave clients stale for the whole stretched interval). Newly covered keys are polled once after the
stream is up (a change between their first read and the upstream's ack would otherwise wait for the
backstop); a stream that breaks uncovers its keys, which then poll at once and at their usual interval
until it is back (with backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.constants import RESOURCE_UPDATED_METHOD
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError
from sidecar.protocol.lists import LIST_KIND_OF_NOTIFICATION, LIST_KINDS
from sidecar.upstream.base import Upstream
from sidecar.watch.clock import LOOP_CLOCK, Clock, sleep, within
from sidecar.watch.poller import JITTER, Watch

__all__ = ["NativeNotifications"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
_REFILTER_DEBOUNCE_S = 0.05
"""A burst of new subscriptions becomes one new upstream listen, not one each."""
_RETRY_S = (0.5, 30.0)
"""Backoff between attempts to reopen a broken stream: from half a second to half a minute."""
_STEADY_S = _RETRY_S[1]
"""A stream up this long that breaks starts a new streak of failures (backoff from the start, logged again); one
that breaks sooner (an upstream or proxy that acknowledges, then closes) goes on with its streak's backoff."""
_ACK_TIMEOUT_S = 10.0


def _capability(capabilities: JsonObject, primitive: str, flag: str) -> bool:
    value = capabilities.get(primitive)
    return isinstance(value, dict) and value.get(flag) is True


class _NativeStream:
    """One context's stream of upstream notifications and what it covers."""

    def __init__(self, owner: NativeNotifications, identity: Identity) -> None:
        self.owner = owner
        self.context = identity.context
        self.identity = identity
        self.uris: dict[str, int] = {}
        self.lists: dict[WatchKind, int] = {}
        self.covered_uris: frozenset[str] = frozenset()
        self.covered_lists: frozenset[WatchKind] = frozenset()
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._opened_at: float | None = None
        """When the stream that is open now was opened (on the owner's clock); None while none is."""

    @property
    def wanted(self) -> bool:
        return bool(self.uris or self.lists)

    def covers(self, kind: WatchKind, uri: str | None) -> bool:
        return uri in self.covered_uris if kind == "resource" else kind in self.covered_lists

    def cover(self, uris: frozenset[str], lists: frozenset[WatchKind], *, hint_new: bool) -> None:
        """Record what the upstream covers now; keys newly covered are polled once (see the module docstring)."""
        before = _keys(self.covered_uris, self.covered_lists)
        after = _keys(uris, lists)
        self.covered_uris, self.covered_lists = uris, lists
        for kind, uri in after ^ before:
            self.owner.coverage_changed(kind, uri, self.context)
        if hint_new:
            for kind, uri in after - before:
                self.owner.hint(kind, uri, self.context)

    def dispatch(self, message: JsonObject) -> None:
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == RESOURCE_UPDATED_METHOD and isinstance(params.get("uri"), str):
            self.owner.received(method)
            self.owner.hint("resource", params["uri"], self.context)
        elif method in LIST_KIND_OF_NOTIFICATION:
            self.owner.received(str(method))
            self.owner.hint(LIST_KIND_OF_NOTIFICATION[str(method)], None, self.context)

    async def run(self) -> None:
        failures = 0
        while self.wanted:
            try:
                if self.owner.modern:
                    await self._serve_listen()
                else:
                    await self._serve_session_stream()
                failures = 0
            except UpstreamError as exc:
                failures = 1 if self._steady() else failures + 1
                if failures == 1:
                    logger.info("upstream notification stream failed", extra={"reason": exc.reason})
                if _unsupported(exc):
                    logger.info(
                        "the upstream serves no notification stream; polling only", extra={"reason": exc.reason}
                    )
                    self.owner.unsupported = True
                    return
            except Exception:  # boundary: a bug here must leave polling working, never stop it
                failures = 1 if self._steady() else failures + 1
                logger.exception("upstream notification stream crashed")
            finally:
                self._closed()
            if self.wanted:
                base = min(_RETRY_S[1], _RETRY_S[0] * 2 ** max(failures - 1, 0))
                await sleep(self.owner.clock, base * (0.5 + JITTER.random()))

    def _steady(self) -> bool:
        return self._opened_at is not None and self.owner.clock.now() - self._opened_at >= _STEADY_S

    def _opened(self) -> None:
        if self._opened_at is None:
            self._opened_at = self.owner.clock.now()
            self.owner.streams_open(1)

    def _closed(self) -> None:
        if self._opened_at is not None:
            self._opened_at = None
            self.owner.streams_open(-1)
        self.cover(frozenset(), frozenset(), hint_new=False)  # uncovered keys poll now and at their usual pace

    def _filter(self) -> JsonObject:
        capabilities = self.owner.capabilities
        wanted: JsonObject = {}
        for kind in self.lists:
            row = LIST_KINDS[kind]
            if _capability(capabilities, row.primitive, "listChanged"):
                wanted[row.filter_field] = True
        if self.uris and _capability(capabilities, "resources", "subscribe"):
            wanted["resourceSubscriptions"] = sorted(self.uris)
        return wanted

    async def _serve_listen(self) -> None:
        """2026-07-28: a listen with this context's filter; a new filter opens a new listen before the old one
        closes, so no notification falls between the two."""
        current: tuple[contextlib.AsyncExitStack, asyncio.Task[None]] | None = None
        try:
            while self.wanted:
                self.changed.clear()
                wanted = self._filter()
                if not wanted:
                    return
                stack = contextlib.AsyncExitStack()
                try:
                    upstream = self.owner.upstream
                    messages = await stack.enter_async_context(upstream.open_notifications(self.identity, wanted))
                    ack = await self._acknowledgment(messages)
                    reader = asyncio.get_running_loop().create_task(self._read(messages))
                except BaseException:
                    await stack.aclose()
                    raise
                # Kept before the old one closes: a cancellation while it closes must close the new one too.
                previous, current = current, (stack, reader)
                if previous is not None:
                    await _close(previous)
                self._opened()
                honoured = _honoured(ack)
                uris = frozenset(u for u in honoured.get("resourceSubscriptions", []) if isinstance(u, str))
                lists = frozenset(row.kind for row in LIST_KINDS.values() if honoured.get(row.filter_field) is True)
                self.cover(uris, lists, hint_new=True)
                await self._until_changed_or_ended(reader)
                await sleep(self.owner.clock, _REFILTER_DEBOUNCE_S)
        finally:
            if current is not None:
                await _close(current)

    async def _serve_session_stream(self) -> None:
        """2025-11-25: the context session's GET stream; URIs are subscribed to one by one on that session."""
        capabilities = self.owner.capabilities
        subscribe = _capability(capabilities, "resources", "subscribe")
        async with self.owner.upstream.open_notifications(self.identity, {}) as messages:
            reader = asyncio.get_running_loop().create_task(self._read(messages))
            self._opened()
            subscribed: set[str] = set()
            try:
                while self.wanted:
                    self.changed.clear()
                    for uri in sorted(set(self.uris) - subscribed) if subscribe else ():
                        try:
                            await self.owner.upstream.call("resources/subscribe", {"uri": uri}, self.identity)
                            subscribed.add(uri)
                        except UpstreamRpcError:
                            continue  # refused for this URI: it stays polled
                    for uri in subscribed - set(self.uris):
                        subscribed.discard(uri)
                        with contextlib.suppress(UpstreamError):
                            await self.owner.upstream.call("resources/unsubscribe", {"uri": uri}, self.identity)
                    lists = frozenset(
                        kind
                        for kind in self.lists
                        if _capability(capabilities, LIST_KINDS[kind].primitive, "listChanged")
                    )
                    self.cover(frozenset(subscribed), lists, hint_new=True)
                    await self._until_changed_or_ended(reader)
                    await sleep(self.owner.clock, _REFILTER_DEBOUNCE_S)
            finally:
                reader.cancel()

    async def _acknowledgment(self, messages: Any) -> JsonObject:
        try:
            ack: JsonObject = await within(self.owner.clock, _ACK_TIMEOUT_S, anext(messages))
        except StopAsyncIteration:
            raise _StreamEnded from None
        except TimeoutError:
            raise UpstreamError(self.owner.upstream.url, f"no acknowledgment within {_ACK_TIMEOUT_S:g} s") from None
        return ack

    async def _until_changed_or_ended(self, reader: asyncio.Task[None]) -> None:
        changed = asyncio.get_running_loop().create_task(self.changed.wait())
        try:
            await asyncio.wait({changed, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if reader.done():
            reader.result()  # the stream's failure, if it failed
            raise _StreamEnded

    async def _read(self, messages: Any) -> None:
        async with contextlib.aclosing(messages):
            async for message in messages:
                self.dispatch(message)


async def _close(opened: tuple[contextlib.AsyncExitStack, asyncio.Task[None]]) -> None:
    stack, reader = opened
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await stack.aclose()


def _keys(uris: frozenset[str], lists: frozenset[WatchKind]) -> set[tuple[WatchKind, str | None]]:
    keys: set[tuple[WatchKind, str | None]] = {(kind, None) for kind in lists}
    keys.update(("resource", uri) for uri in uris)
    return keys


class _StreamEnded(UpstreamError):
    """The upstream closed the notification stream (gracefully or not); it is opened again."""

    def __init__(self) -> None:
        super().__init__("upstream", "the notification stream ended")

    @property
    def is_transport_failure(self) -> bool:
        return False


def _honoured(ack: JsonObject) -> JsonObject:
    params = ack.get("params")
    notifications = params.get("notifications") if isinstance(params, dict) else None
    if ack.get("method") != "notifications/subscriptions/acknowledged" or not isinstance(notifications, dict):
        return {}
    return notifications


def _unsupported(exc: UpstreamError) -> bool:
    # No GET stream (405), or no listen (-32601 / 404): the upstream cannot push; ask once, not forever.
    if isinstance(exc, UpstreamHTTPError):
        return exc.status in (404, 405)
    return isinstance(exc, UpstreamRpcError) and exc.code == -32601


class NativeNotifications:
    """Every context's notification stream; the registry says what each context holds and hears the hints."""

    def __init__(
        self,
        upstream: Upstream,
        config: PollingConfig,
        metrics: Metrics,
        *,
        watch_of: Callable[[WatchKey], Watch | None],
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self.upstream = upstream
        self.clock = clock
        self._config = config
        self._metrics = metrics
        self._watch_of = watch_of
        self._streams: dict[str, _NativeStream] = {}
        self._closing: set[asyncio.Task[None]] = set()
        """Tasks of streams dropped and still closing (out of the table already)."""
        self.unsupported = False
        """The upstream refused its notification stream once: it cannot push, so no stream is opened again."""

    @property
    def capabilities(self) -> JsonObject:
        info = self.upstream.info
        return info.capabilities if info is not None else {}

    @property
    def modern(self) -> bool:
        info = self.upstream.info
        return info is not None and info.era == "modern"

    def _can_push(self, kind: WatchKind) -> bool:
        if not self._config.native_notifications or self.unsupported:
            return False
        if kind == "resource":
            return _capability(self.capabilities, "resources", "subscribe")
        return _capability(self.capabilities, LIST_KINDS[kind].primitive, "listChanged")

    def hold(self, identity: Identity, kind: WatchKind, uri: str | None) -> None:
        """`identity` now watches (kind, uri): cover it upstream when the upstream can push it."""
        if not self._can_push(kind):
            return
        context = identity.context
        stream = self._streams.get(context)
        if stream is None:
            if len(self._streams) >= self._config.max_native_streams:
                self._metrics.limit_rejections.labels("native_streams").inc()
                return
            stream = self._streams[context] = _NativeStream(self, identity)
        if kind == "resource" and uri is not None:
            stream.uris[uri] = stream.uris.get(uri, 0) + 1
        else:
            stream.lists[kind] = stream.lists.get(kind, 0) + 1
        stream.changed.set()
        if stream.task is None or stream.task.done():
            stream.task = asyncio.get_running_loop().create_task(self._run(stream))

    def drop(self, context: str, kind: WatchKind, uri: str | None) -> None:
        """`context` no longer watches (kind, uri)."""
        stream = self._streams.get(context)
        if stream is None:
            return
        counts: dict[Any, int] = stream.uris if kind == "resource" else stream.lists
        item = uri if kind == "resource" else kind
        if item not in counts:
            return
        counts[item] -= 1
        if counts[item] <= 0:
            del counts[item]
            stream.changed.set()
        if not stream.wanted and stream.task is not None:
            # Out of the table now, not when the task has finished: a hold before then gets a stream of its own
            # instead of one whose task is ending. Shutdown still waits for it to close (`_closing`).
            del self._streams[context]
            self._closing.add(stream.task)
            stream.task.add_done_callback(self._closing.discard)
            stream.task.cancel()

    def covers(self, kind: WatchKind, uri: str | None, context: str) -> bool:
        """Whether the upstream's notifications cover this key now (for a public key: any context's)."""
        stream = self._streams.get(context)
        if stream is not None:
            return stream.covers(kind, uri)
        return context == PUBLIC and any(stream.covers(kind, uri) for stream in self._streams.values())

    async def _run(self, stream: _NativeStream) -> None:
        try:
            await stream.run()
        finally:
            if self.unsupported and self._streams.get(stream.context) is stream:
                del self._streams[stream.context]  # no stream is opened again: none keeps its credential

    # -- called by streams ----------------------------------------------------------------------------

    def hint(self, kind: WatchKind, uri: str | None, context: str) -> None:
        """The upstream says (kind, uri) changed as `context` sees it: its own watch, and the public one."""
        for watched in (PUBLIC, context):
            watch = self._watch_of(WatchKey(kind, uri, watched))
            if watch is not None:
                watch.hint()

    def coverage_changed(self, kind: WatchKind, uri: str | None, context: str) -> None:
        for watched in (PUBLIC, context):
            watch = self._watch_of(WatchKey(kind, uri, watched))
            if watch is not None:
                self.update(watch)

    def update(self, watch: Watch) -> None:
        """Put `watch` in the mode its coverage says (a new watch, or one whose coverage changed)."""
        native = self.covers(watch.key.kind, watch.key.uri, watch.key.context)
        if native != watch.native:
            self._metrics.native_watches.inc(1 if native else -1)
            watch.set_native(native)

    def forget(self, watch: Watch) -> None:
        """`watch` is gone: it no longer counts among the native ones."""
        if watch.native:
            self._metrics.native_watches.dec()

    def received(self, method: str) -> None:
        self._metrics.upstream_notifications.labels(method).inc()

    def streams_open(self, delta: int) -> None:
        self._metrics.native_streams.inc(delta)

    async def aclose(self) -> None:
        tasks = [stream.task for stream in self._streams.values() if stream.task is not None]
        tasks += self._closing
        self._streams.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
