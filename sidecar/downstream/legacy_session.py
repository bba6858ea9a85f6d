"""One 2025-11-25 client session: the upstream session it rides on, its subscriptions, its pending signals."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sidecar.changes import WatchKey
from sidecar.identity import Identity
from sidecar.watch.handles import Handle

__all__ = ["LegacySession"]

JsonObject = dict[str, Any]


class LegacySession:
    """One client session: the upstream session it rides on, its subscriptions, its pending signals."""

    def __init__(self, session_id: str, upstream_session: str | None, identity: Identity) -> None:
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
        self._pending: dict[tuple[str, str | None], float] = {}
        self._wake = asyncio.Event()

    @property
    def handles(self) -> list[Handle]:
        return [*self.subscriptions.values(), *self.list_handles]

    def signal(self, method: str, uri: str | None, detected_at: float) -> None:
        """Bus fan-out: synchronous, never raises; pending signals are a set, as on listen streams."""
        self._pending[(method, uri)] = self._pending.get((method, uri), detected_at)
        self._wake.set()

    def close(self, reason: str) -> None:
        self._wake.set()

    def revoke(self, key: WatchKey) -> list[Handle]:
        """The session's credential was refused `key`: its subscription ends (its reads are refused anyway)."""
        if key.kind == "resource" and key.uri is not None and key.uri in self.subscriptions:
            return [self.subscriptions.pop(key.uri)]
        revoked = [handle for handle in self.list_handles if handle.key == key]
        self.list_handles = [handle for handle in self.list_handles if handle.key != key]
        return revoked

    def drain(self) -> list[JsonObject]:
        pending, self._pending = self._pending, {}
        self._wake.clear()
        return [
            {"jsonrpc": "2.0", "method": method, "params": {"uri": uri} if uri is not None else {}}
            for method, uri in pending
        ]

    async def wait(self) -> None:
        await self._wake.wait()
