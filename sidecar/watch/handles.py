"""A stream's interest in a watch: a handle, released once (the count it releases is the engine's)."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.changes import WatchKey

__all__ = ["Handle"]


class Handle:
    """One stream's interest in one watch; `release` is idempotent."""

    __slots__ = ("_on_release", "context", "key")

    def __init__(self, key: WatchKey, context: str, on_release: Callable[[Handle], None]) -> None:
        self.key = key
        self.context = context
        self._on_release: Callable[[Handle], None] | None = on_release
        """Whom to tell of the release; None once told (so a second release tells nobody)."""

    def release(self) -> None:
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release(self)
