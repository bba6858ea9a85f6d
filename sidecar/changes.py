"""The vocabulary the watch engine and the buses share, below both: what is watched, the change event, and
the contracts a bus and a poll coordinator keep. The Redis bus implements them without knowing the engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from sidecar.protocol import LIST_KINDS, RESOURCE_UPDATED_METHOD, ListKind

__all__ = [
    "Bus",
    "ChangeEvent",
    "ChangeListener",
    "EventRouting",
    "LocalCoordinator",
    "PollCoordinator",
    "WatchKey",
    "WatchKind",
    "WatchState",
]

# -- what a watch watches ------------------------------------------------------------------------------------

WatchKind = Literal["resource", ListKind]
"""A resource, or one of the list kinds (`sidecar.protocol.lists`)."""


@dataclass(frozen=True, slots=True)
class WatchKey:
    """One polled thing. `context` is `public` or an authorization context's name (never a credential)."""

    kind: WatchKind
    uri: str | None
    context: str

    @property
    def notification_method(self) -> str:
        """The notification a change of this key sends."""
        return RESOURCE_UPDATED_METHOD if self.kind == "resource" else LIST_KINDS[self.kind].notification_method

    @property
    def short_hash(self) -> str:
        """A short stable name for logs and the status page; says nothing about the URI or the context."""
        text = f"{self.kind}\0{self.uri or ''}\0{self.context}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


# -- the change bus: tiny typed events in, synchronous listeners out; it never sees JSON-RPC -------------------


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """A watch saw new content. A level trigger: consumers re-read, so duplicates are harmless."""

    key: WatchKey
    fingerprint: str
    generation: int
    """The change's number among the key's changes: counted by the watch on a bus of one process, by the key's
    stored state in Redis across replicas (the publish fence). Not a ticket, which orders looks."""
    detected_at: float
    """Wall-clock seconds when the change was detected (for the delivery-latency metric)."""
    baseline: bool = False
    """Not a change: a watch's first look (other replicas' caches drop an answer it contradicts; no stream is
    told)."""


ChangeListener = Callable[[ChangeEvent], None]
"""Called on the event loop for every event; must not raise and must not block."""


class Bus(Protocol):
    """Fan-out of change events to every listener of every process that shares the bus."""

    async def publish(self, event: ChangeEvent) -> None:
        """Deliver to every listener (here and, for a shared bus, in other processes)."""
        ...

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        """Register a local listener; the returned function unsubscribes and is safe to call twice."""
        ...


class EventRouting(Protocol):
    """A shared bus that routes events by interest: a process hears only the changes it asked for."""

    def hold(self, kind: WatchKind, uri: str | None, since: float, until: float) -> bool:
        """Keep hearing (kind, uri)'s changes until `until` (monotonic seconds); True when they have been heard
        since before `since`, so something cached from a request started then is dropped when it changes."""
        ...


# -- who may poll a key: every watch in one process, or the key's owner among the replicas interested in it ---


class WatchState(Protocol):
    """What a coordinator needs of a watch: its key, what its streams were last told (its fingerprint), and a way
    to have it poll soon (when it takes over). A coordinator never writes into a watch: another replica's newer
    content reaches the watch's owner as a change heard (on the bus, or through `PollCoordinator.on_adopt`)."""

    key: WatchKey

    @property
    def fingerprint(self) -> str: ...

    def hint(self) -> None: ...


class PollCoordinator(Protocol):
    """Decides which process polls a key. (The bus records each change it publishes, atomically with the
    publishing: a new owner polls at once and compares with what its own streams were last told.)"""

    def may_poll(self, key: WatchKey) -> bool:
        """True when this process should poll `key` now (it owns the key, or there is no cluster)."""
        ...

    def track(self, watch: WatchState) -> None:
        """A watch's first local stream arrived: this process is interested (and may be chosen to poll it)."""
        ...

    def untrack(self, key: WatchKey) -> None:
        """Its last local stream left: no longer interested, so an interested replica polls it instead."""
        ...

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        """Tell the other replicas that a write went through here (their owners should poll now)."""
        ...

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        """Register for revalidate announcements from other replicas."""
        ...

    def on_adopt(self, listener: ChangeListener) -> Callable[[], None]:
        """`listener(event)` for a change another replica told that a watched key's streams were already told
        otherwise (so it is not published here): its watch takes it as its own. Returns the remover."""
        ...


class LocalCoordinator:
    """One process: every watch polls."""

    def may_poll(self, key: WatchKey) -> bool:
        return True

    def track(self, watch: WatchState) -> None:
        return None

    def untrack(self, key: WatchKey) -> None:
        return None

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        return None

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        return None

    def on_adopt(self, listener: ChangeListener) -> Callable[[], None]:
        return lambda: None
