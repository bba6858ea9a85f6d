"""One 2025-11-25 client session: the upstream session it rides on, its subscriptions, its pending signals, and
its GET stream, where our notifications merge with the upstream's own frames."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import orjson

from sidecar.changes import WatchKey
from sidecar.downstream.event_stream import COMMENT, EventStream, message_event
from sidecar.downstream.pending import PendingSignals
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol import session_notification
from sidecar.watch.handles import Handle

__all__ = ["LegacySession"]


class LegacySession:
    """One client session: the upstream session it rides on, its subscriptions, its pending signals."""

    def __init__(self, session_id: str, upstream_session: str | None, identity: Identity, metrics: Metrics) -> None:
        self.session_id = session_id
        self.upstream_session = upstream_session
        self.identity = identity
        self.last_seen = time.monotonic()
        self.opened_at = self.last_seen
        self.used = False
        """A request or a GET stream came after initialize (an unused session ends after session_unused_s)."""
        self.subscriptions: dict[str, Handle] = {}
        self.list_handles: list[Handle] = []
        self.lists_watched = False
        self.get_streams = 0
        self.ended = False
        self._metrics = metrics
        self._pending = PendingSignals(metrics.coalesced)
        self._wake = asyncio.Event()

    @property
    def handles(self) -> list[Handle]:
        return [*self.subscriptions.values(), *self.list_handles]

    def signal(self, method: str, uri: str | None, detected_at: float) -> None:
        """Bus fan-out: synchronous, never raises; pending signals are a set, as on listen streams."""
        if self._pending.add(method, uri, detected_at):
            self._wake.set()

    def close(self, reason: str) -> None:
        """The session ended: its GET streams end too."""
        self.ended = True
        self._wake.set()

    def revoke(self, key: WatchKey) -> list[Handle]:
        """The session's credential was refused `key`: its subscription ends (its reads are refused anyway)."""
        if key.kind == "resource" and key.uri is not None and key.uri in self.subscriptions:
            return [self.subscriptions.pop(key.uri)]
        revoked = [handle for handle in self.list_handles if handle.key == key]
        self.list_handles = [handle for handle in self.list_handles if handle.key != key]
        return revoked

    def outgoing(self, upstream_frame: bytes | None, quiet: bool) -> Iterator[bytes]:
        """What the GET stream writes after a wait: the upstream's frame as it came, then each pending signal (the
        set is emptied at once: a signal meanwhile pends for the next round), then, after a whole keep-alive
        interval of neither (`quiet`), a comment. Each is counted once the stream asks for the next."""
        if upstream_frame is not None:
            yield upstream_frame
        signals = list(self._pending)
        self._pending.clear()
        self._wake.clear()
        for method, uri in signals:
            yield message_event(orjson.dumps(session_notification(method, uri)))
            self._metrics.notifications.labels(method).inc()
        if quiet:
            yield COMMENT
            self._metrics.keepalives.inc()

    async def serve_get(self, events: EventStream, upstream_frames: asyncio.Queue[bytes], keepalive_s: float) -> None:
        """A GET stream until the session ends: the upstream's frames as they come, our signals when pending, and a
        comment after `keepalive_s` of neither."""
        waiter: asyncio.Task[bool] | None = None
        getter: asyncio.Task[bytes] | None = None
        try:
            while not self.ended:
                waiter = asyncio.ensure_future(self._wake.wait())
                getter = asyncio.ensure_future(upstream_frames.get())
                done, _ = await asyncio.wait({waiter, getter}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
                for task in (waiter, getter):
                    if task not in done:
                        task.cancel()
                for frame in self.outgoing(getter.result() if getter in done else None, quiet=not done):
                    await events.send(frame)
        finally:
            # A client that goes away cancels its handler inside asyncio.wait, which leaves both helper tasks
            # pending: cancel them here, or they are garbage-collected pending ("Task was destroyed but it is
            # pending!", seen after every conformance run) and the session's waiter lingers until its next signal.
            for leftover in (waiter, getter):
                if leftover is not None:
                    leftover.cancel()
