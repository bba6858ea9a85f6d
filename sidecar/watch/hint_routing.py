"""Where a source's hint goes, and what the other replicas announce. A hint from the source of truth hints the
watches it names, in every context, and is announced to the other replicas; one heard from them hints the same
watches here. Writes the other replicas announce go to the engine (`WritesHeard`), which hints the watches a
write may concern as it does for a write here (`sidecar.watch.engine.writes`). A hint is never a change (invariant
22): a hinted watch looks soon, and tells only what its look finds changed.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from sidecar.changes import PollCoordinator
from sidecar.observability.metrics import Metrics
from sidecar.watch.engine import WatchIndex
from sidecar.watch.native import HintWatch
from sidecar.watch.source_hints import SourceHint, from_bus, targets

__all__ = ["HintRouting"]


class HintRouting:
    """Source hints, here and heard from the other replicas, to the watches they concern; writes heard from the
    others, to the engine."""

    def __init__(
        self,
        index: WatchIndex,
        hint: HintWatch,
        coordinator: PollCoordinator,
        metrics: Metrics,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        writes_heard: Callable[[frozenset[str]], None],
    ) -> None:
        self._index = index
        self._hint = hint
        self._coordinator = coordinator
        self._metrics = metrics
        self._spawn = spawn
        self._writes_heard = writes_heard
        coordinator.on_revalidate(self._heard)

    def source(self, hint: SourceHint) -> int:
        """The source says what changed: each matching watch, in every context, looks soon with its own credential
        (a hint, not a change), and the other replicas are told (their lease owners look). The watches hinted here."""
        self._spawn(self._coordinator.announce_revalidate(frozenset({hint.to_bus()})))
        return self._hint_matching(hint)

    def _hint_matching(self, hint: SourceHint) -> int:
        hinted = 0
        for key in self._index.at(targets(hint, self._index.resource_uris())):
            self._hint(key, warm=True)
            hinted += 1
        self._metrics.watches_hinted.inc(hinted)
        return hinted

    def _heard(self, announced: frozenset[str]) -> None:
        written, hints = from_bus(announced)
        if written:
            self._writes_heard(written)
        for hint in hints:
            self._hint_matching(hint)
