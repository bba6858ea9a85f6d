"""A stream's interest in a watch: a handle, released once (the count it releases is the engine's)."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.changes import WatchKey

__all__ = ["Handle"]


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
