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

A child process (a stdio upstream) may announce a change it never declared it would: the reference SQLite server
sends `notifications/resources/updated` after a write without declaring `resources.subscribe`. Its one stdout
carries such a notification whatever it declared, so the sidecar hears it there and takes it as a hint like any
other (every context's watch of that key looks, and stays warm); it covers nothing, so the key keeps its usual
interval. An HTTP upstream that declares nothing is not listened to: hearing it would take a stream per context
opened on a guess.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.constants import RESOURCE_UPDATED_METHOD
from sidecar.protocol.lists import LIST_KIND_OF_NOTIFICATION
from sidecar.protocol.types import JsonObject
from sidecar.tasks import TaskSet
from sidecar.upstream.base import NotificationSource, OpenNotifications
from sidecar.watch.clock import LOOP_CLOCK, Clock
from sidecar.watch.native_stream import FILTER_FIELDS, NativeStream, capability

__all__ = ["Cover", "HintWatch", "NativeNotifications"]

logger = logging.getLogger(__name__)


class HintWatch(Protocol):
    def __call__(self, key: WatchKey, *, warm: bool = False) -> None:
        """`key`'s watch, if there is one, looks soon."""


Cover = Callable[[WatchKey, bool], None]
"""Tells `key`'s watch whether the upstream's notifications cover it now."""


class NativeNotifications:
    """Every context's notification stream; the registry says what each context holds and hears the hints."""

    def __init__(
        self,
        upstream: OpenNotifications,
        config: PollingConfig,
        metrics: Metrics,
        *,
        hint: HintWatch,
        cover: Cover,
        keys: Callable[[], Iterable[WatchKey]] = lambda: (),
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self.upstream = upstream
        self.clock = clock
        self._config = config
        self._metrics = metrics
        self._hint = hint
        self._cover = cover
        self._streams: dict[str, NativeStream] = {}
        self._closing = TaskSet("a notification stream task failed", logger)
        """Tasks of streams dropped and still closing (out of the table already)."""
        self.unsupported = False
        """The upstream refused its notification stream once: it cannot push, so no stream is opened again."""
        self._keys = keys
        self._stop_hearing: Callable[[], None] | None = None
        if config.native_notifications and isinstance(upstream, NotificationSource):
            self._stop_hearing = upstream.add_notification_listener(self._unsolicited)

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
            return capability(self.capabilities, "resources", "subscribe")
        return capability(self.capabilities, FILTER_FIELDS[kind][1], "listChanged")

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
            stream = self._streams[context] = NativeStream(self, identity)
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
            self._closing.hold(stream.task)
            stream.task.cancel()

    def covers(self, kind: WatchKind, uri: str | None, context: str) -> bool:
        """Whether the upstream's notifications cover this key now (for a public key: any context's)."""
        stream = self._streams.get(context)
        if stream is not None:
            return stream.covers(kind, uri)
        return context == PUBLIC and any(stream.covers(kind, uri) for stream in self._streams.values())

    async def _run(self, stream: NativeStream) -> None:
        try:
            await stream.run()
        finally:
            if self.unsupported and self._streams.get(stream.context) is stream:
                del self._streams[stream.context]  # no stream is opened again: none keeps its credential

    # -- called by streams ----------------------------------------------------------------------------

    def hint(self, kind: WatchKind, uri: str | None, context: str, *, warm: bool) -> None:
        """(kind, uri) may have changed as `context` sees it: its own watch, and the public one, look. `warm`: the
        upstream said so (its notification), not just that it covers the key now."""
        for watched in (PUBLIC, context):
            self._hint(WatchKey(kind, uri, watched), warm=warm)

    def _unsolicited(self, message: JsonObject) -> None:
        """A notification a child process sent on its own, declared or not: a hint for every context's watch of it
        (the one child serves them all). A 2025-11-25 stream open on it hears the same message and hints already."""
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == RESOURCE_UPDATED_METHOD and isinstance(params.get("uri"), str):
            kind: WatchKind = "resource"
            uri: str | None = params["uri"]
        elif isinstance(method, str) and method in LIST_KIND_OF_NOTIFICATION:
            kind, uri = LIST_KIND_OF_NOTIFICATION[method], None
        else:
            return  # a log message, progress of nobody's request: not about a watch
        if not self.modern and any(stream.open for stream in self._streams.values()):
            return
        self.received(str(method))
        for key in self._keys():
            if key.kind == kind and key.uri == uri:
                self._hint(key, warm=True)

    def coverage_changed(self, kind: WatchKind, uri: str | None, context: str) -> None:
        for watched in (PUBLIC, context):
            self.update(WatchKey(kind, uri, watched))

    def update(self, key: WatchKey) -> None:
        """Put `key`'s watch, if there is one, in the mode its coverage says (new, or its coverage changed)."""
        self._cover(key, self.covers(key.kind, key.uri, key.context))

    def received(self, method: str) -> None:
        self._metrics.upstream_notifications.labels(method).inc()

    def streams_open(self, delta: int) -> None:
        self._metrics.native_streams.inc(delta)

    async def aclose(self) -> None:
        if self._stop_hearing is not None:
            self._stop_hearing()
        for stream in self._streams.values():
            if stream.task is not None:
                self._closing.hold(stream.task)
        self._streams.clear()
        await self._closing.aclose()
