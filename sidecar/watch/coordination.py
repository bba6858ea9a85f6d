"""Who may poll a key: every watch in one process, or the holder of the key's lease across replicas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sidecar.watch.keys import WatchKey

__all__ = ["LocalCoordinator", "PollCoordinator", "WatchState"]


class WatchState(Protocol):
    """What a coordinator needs of a watch: its key, and a way to have it poll soon (when it takes the lease)."""

    key: WatchKey

    def hint(self) -> None: ...


class PollCoordinator(Protocol):
    """Decides which process polls a key. (The bus records each change it publishes, atomically with the
    publishing: a new owner polls at once and compares with what its own streams were last told.)"""

    def may_poll(self, key: WatchKey) -> bool:
        """True when this process should poll `key` now (it holds the lease, or there is no cluster)."""
        ...

    def track(self, watch: WatchState) -> None:
        """A watch with local interest: compete for its lease."""
        ...

    def untrack(self, key: WatchKey) -> None:
        """No local interest left: give the lease up so an interested replica takes over."""
        ...

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        """Tell the other replicas that a write went through here (their owners should poll now)."""
        ...

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        """Register for revalidate announcements from other replicas."""
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
