"""A stream's interest in a watch (a handle), and a context's share of it (the identity it is polled with)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.changes import WatchKey
from sidecar.identity import Identity

__all__ = ["ContextShare", "Handle"]


@dataclass(slots=True)
class ContextShare:
    """One authorization context's share of a watch: the identity it is polled with, and how many of the
    context's streams hold it."""

    identity: Identity
    handles: int = 0


class Handle:
    """One stream's interest in one watch; `release` is idempotent."""

    __slots__ = ("_on_release", "_released", "context", "key")

    def __init__(self, key: WatchKey, context: str, on_release: Callable[[Handle], None]) -> None:
        self.key = key
        self.context = context
        self._on_release = on_release
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._on_release(self)
