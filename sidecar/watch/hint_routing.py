"""Where a hint goes. A write through the sidecar hints the public watches and the writer's context's (debounced:
see `Revalidator`); a hint from the source hints the watches it names, in every context; each is announced to
the other replicas, and one heard from them hints the same watches here. A hint is never a change (invariant
22): a hinted watch looks soon, and tells only what its look finds changed.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

from sidecar.changes import PollCoordinator, WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.watch.clock import Clock
from sidecar.watch.revalidate import Revalidator
from sidecar.watch.source_hints import SourceHint, from_bus, matching

__all__ = ["HintRouting", "HintWithLinks"]


class HintWithLinks(Protocol):
    def __call__(self, key: WatchKey, links: Sequence[Any] = (), *, warm: bool = False) -> None:
        """`key`'s watch looks soon; its poll links to the traced writes `links`."""


class HintRouting:
    """Writes and source hints, here and heard from the other replicas, to the watches they concern."""

    def __init__(
        self,
        keys: Callable[[], Iterable[WatchKey]],
        hint: HintWithLinks,
        coordinator: PollCoordinator,
        metrics: Metrics,
        *,
        debounce_ms: int,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        clock: Clock,
    ) -> None:
        self._keys = keys
        self._hint = hint
        self._coordinator = coordinator
        self._metrics = metrics
        self._spawn = spawn
        self._revalidator = Revalidator(debounce_ms, coordinator, self._hint_contexts, spawn, clock)
        coordinator.on_revalidate(self._heard)

    def wrote(self, context: str) -> None:
        """A request of `context` that may have written went through."""
        self._revalidator.wrote(context)

    def source(self, hint: SourceHint) -> int:
        """The source says what changed: each matching watch, in every context, looks soon with its own credential
        (a hint, not a change), and the other replicas are told (their lease owners look). The watches hinted here."""
        self._spawn(self._coordinator.announce_revalidate(frozenset({hint.to_bus()})))
        return self._hint_matching(hint)

    def _hint_contexts(self, contexts: frozenset[str], links: Mapping[str, tuple[Any, ...]] | None = None) -> None:
        # A poll links to the traced writes that may concern it: a private watch to its own context's only.
        links = links or {}
        everyone = tuple(link for written in links.values() for link in written)
        for key in self._keys():
            if key.context == PUBLIC:
                self._hint(key, everyone, warm=True)
            elif key.context in contexts:
                self._hint(key, links.get(key.context, ()), warm=True)

    def _hint_matching(self, hint: SourceHint) -> int:
        hinted = 0
        for key in matching(self._keys(), hint):
            self._hint(key, warm=True)
            hinted += 1
        self._metrics.watches_hinted.inc(hinted)
        return hinted

    def _heard(self, announced: frozenset[str]) -> None:
        written, hints = from_bus(announced)
        if written:
            self._hint_contexts(written)
        for hint in hints:
            self._hint_matching(hint)

    def cancel(self) -> None:
        self._revalidator.cancel()
