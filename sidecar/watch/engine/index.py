"""The watched keys by context and by what they watch, kept by the engine as its records come and go.

A write round hints the watches of the writers' contexts and the public ones; a source's hint, or an upstream's own
notification, the watches of one URI or list in every context. Each found them by a pass over every watch, so with
100,000 watches every write round, hint or notification held the event loop for milliseconds. Here each is a
lookup. Keys come back in the order their watches started (what a pass over the records gave), so what they cause
is in the same order as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator
from typing import TypeVar

from sidecar.changes import WatchKey, WatchKind

__all__ = ["WatchIndex"]

_At = TypeVar("_At", bound=Hashable)

Target = tuple[WatchKind, str | None]
"""What a watch watches, in every context: a resource's URI, or a list (no URI)."""


class WatchIndex:
    """The keys of the engine's records by context and by target; the engine adds and removes, others read."""

    __slots__ = ("_by_context", "_by_target", "_order", "_started")

    def __init__(self) -> None:
        self._started: dict[WatchKey, int] = {}
        """Each key's place in the order the watches started: several lookups' keys are merged in that order."""
        self._order = itertools.count()
        self._by_context: dict[str, dict[WatchKey, None]] = {}
        self._by_target: dict[Target, dict[WatchKey, None]] = {}

    def __len__(self) -> int:
        return len(self._started)

    def add(self, key: WatchKey) -> None:
        self._started[key] = next(self._order)
        self._by_context.setdefault(key.context, {})[key] = None
        self._by_target.setdefault((key.kind, key.uri), {})[key] = None

    def remove(self, key: WatchKey) -> None:
        del self._started[key]
        _discard(self._by_context, key.context, key)
        _discard(self._by_target, (key.kind, key.uri), key)

    def clear(self) -> None:
        self._started.clear()
        self._by_context.clear()
        self._by_target.clear()

    @property
    def contexts(self) -> int:
        """How many authorization contexts (public included) watch anything."""
        return len(self._by_context)

    def of_contexts(self, contexts: Iterable[str]) -> list[WatchKey]:
        """The keys these contexts watch, in the order their watches started."""
        return self.ordered(key for context in set(contexts) for key in self._by_context.get(context, ()))

    def at(self, targets: Iterable[Target]) -> list[WatchKey]:
        """The keys that watch these targets, in every context, in the order their watches started."""
        return self.ordered(key for target in set(targets) for key in self._by_target.get(target, ()))

    def ordered(self, keys: Iterable[WatchKey]) -> list[WatchKey]:
        """Those of `keys` that are watched, in the order their watches started."""
        return sorted((key for key in keys if key in self._started), key=self._started.__getitem__)

    def resource_uris(self) -> Iterator[str]:
        """Each URI watched as a resource, once however many contexts watch it (what a glob is matched against)."""
        return (uri for kind, uri in self._by_target if kind == "resource" and uri is not None)


def _discard(index: dict[_At, dict[WatchKey, None]], at: _At, key: WatchKey) -> None:
    group = index[at]
    del group[key]
    if not group:
        del index[at]  # an index keeps no context or target nobody watches
