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
from typing import Protocol

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.types import JsonObject
from sidecar.tasks import TaskSet
from sidecar.upstream.base import NotificationSource, OpenNotifications
from sidecar.watch.clock import LOOP_CLOCK, Clock
from sidecar.watch.native_events import (
    CoverKey,
    Dropped,
    Effect,
    Event,
    Held,
    HintKey,
    HintWatching,
    LimitHit,
    Log,
    Received,
    Start,
    Step,
    StreamsOpen,
    Unsolicited,
    Wake,
)
from sidecar.watch.native_rules import NativeRules
from sidecar.watch.native_stream import NativeStream

__all__ = ["Cover", "HintWatch", "NativeNotifications"]

logger = logging.getLogger(__name__)


class HintWatch(Protocol):
    def __call__(self, key: WatchKey, *, warm: bool = False) -> None:
        """`key`'s watch, if there is one, looks soon."""


Cover = Callable[[WatchKey, bool], None]
"""Tells `key`'s watch whether the upstream's notifications cover it now."""


class NativeNotifications:
    """Every context's notification stream: the registry says what each context holds and hears the hints. What
    to do is `NativeRules`'s; this carries out its effects and runs each stream's task (`NativeStream`)."""

    def __init__(
        self,
        upstream: OpenNotifications,
        config: PollingConfig,
        metrics: Metrics,
        *,
        hint: HintWatch,
        cover: Cover,
        keys_at: Callable[[WatchKind, str | None], Iterable[WatchKey]] = lambda kind, uri: (),
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self.upstream = upstream
        self.clock = clock
        self.rules = NativeRules(config)
        self._metrics = metrics
        self._hint = hint
        self._cover = cover
        self._keys_at = keys_at
        self._streams: dict[int, tuple[NativeStream, asyncio.Task[None]]] = {}
        """Every stream whose task runs, dropped ones still closing included (what `Wake` and `Stop` reach)."""
        self._closing = TaskSet("a notification stream task failed", logger)
        """Tasks of streams dropped and still closing (out of the rules' table already)."""
        self._stop_hearing: Callable[[], None] | None = None
        if config.native_notifications and isinstance(upstream, NotificationSource):
            self._stop_hearing = upstream.add_notification_listener(self._unsolicited)

    @property
    def unsupported(self) -> bool:
        """The upstream refused its notification stream once: it cannot push, so no stream is opened again."""
        return self.rules.unsupported

    @property
    def capabilities(self) -> JsonObject:
        info = self.upstream.info
        return info.capabilities if info is not None else {}

    @property
    def modern(self) -> bool:
        info = self.upstream.info
        return info is not None and info.era == "modern"

    def hold(self, identity: Identity, kind: WatchKind, uri: str | None) -> None:
        """`identity` now watches (kind, uri): cover it upstream when the upstream can push it."""
        self.handle(Held(identity, kind, uri, self.capabilities))

    def drop(self, context: str, kind: WatchKind, uri: str | None) -> None:
        """`context` no longer watches (kind, uri)."""
        self.handle(Dropped(context, kind, uri))

    def update(self, key: WatchKey) -> None:
        """Put `key`'s watch, if there is one, in the mode its coverage says (new, or its coverage changed)."""
        self._cover(key, self.rules.covers(key.kind, key.uri, key.context))

    def handle(self, event: Event) -> Step | None:
        """Feed `event` to the rules and carry out its effects; the stream's next step, if it asks for one."""
        step: Step | None = None
        for command in self.rules.handle(event, self.clock.now()):
            if isinstance(command, Step):
                step = command  # the one step, last in its batch: its stream's driver awaits it
            else:
                self._carry_out(command)
        return step

    def _carry_out(self, command: Effect) -> None:
        if isinstance(command, HintKey):
            self._hint(command.key, warm=command.warm)
        elif isinstance(command, CoverKey):
            self._cover(command.key, command.native)
        elif isinstance(command, HintWatching):
            for key in self._keys_at(command.kind, command.uri):
                self._hint(key, warm=True)
        elif isinstance(command, Received):
            self._metrics.upstream_notifications.labels(command.method).inc()
        elif isinstance(command, StreamsOpen):
            self._metrics.native_streams.inc(command.delta)
        elif isinstance(command, LimitHit):
            self._metrics.limit_rejections.labels("native_streams").inc()
        elif isinstance(command, Log):
            logger.info(command.message, extra={"reason": command.reason})
        elif isinstance(command, Start):
            stream = NativeStream(self, command.stream, command.identity)
            task = asyncio.get_running_loop().create_task(self._run(stream))
            self._streams[command.stream] = (stream, task)
        elif isinstance(command, Wake):
            self._streams[command.stream][0].changed.set()
        else:
            # Stop: shutdown still waits for it to close (`_closing`).
            task = self._streams[command.stream][1]
            self._closing.hold(task)
            task.cancel()

    async def _run(self, stream: NativeStream) -> None:
        try:
            await stream.run()
        finally:
            if self._streams.get(stream.id, (None,))[0] is stream:
                del self._streams[stream.id]  # nothing keeps its credential

    def _unsolicited(self, message: JsonObject) -> None:
        """A notification a child process sent on its own (see the module docstring)."""
        self.handle(Unsolicited(message, self.modern))

    async def aclose(self) -> None:
        if self._stop_hearing is not None:
            self._stop_hearing()
        for _, task in self._streams.values():
            self._closing.hold(task)
        self.rules.clear()
        await self._closing.aclose()
