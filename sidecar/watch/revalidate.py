"""Revalidate on write: a request that may have changed data makes the watches it may concern poll soon.

The debounce is leading-edge: the first write after a quiet `polling.revalidate_debounce_ms` hints at once (a
lone write is not made to wait), and opens a window; the writes that arrive within it are one round of hints at
its end, which opens the next window. A burst therefore costs a watch at most two looks (the leading one, and
one after it that the burst's later writes ask for), never one per write; a look still in flight when the
trailing round comes is followed by one more (the watch's own coalescing). Each round tells the other replicas
(their lease owners poll), and here hints the public watches and the writers' own contexts' watches; each hint
then obeys the watch's min_interval_ms, backoff, jitter and the hint budget.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from sidecar.changes import PollCoordinator
from sidecar.observability.tracing import MAX_LINKS, tracing
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer

__all__ = ["Revalidator"]


class Revalidator:
    """Collects the contexts that wrote, and hints their watches: at once when quiet, else once per window."""

    def __init__(
        self,
        debounce_ms: int,
        coordinator: PollCoordinator,
        hint: Callable[[frozenset[str], Mapping[str, tuple[Any, ...]]], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self._debounce_s = debounce_ms / 1000
        self._coordinator = coordinator
        self._hint = hint
        self._spawn = spawn
        self._clock = clock
        self._contexts: set[str] = set()
        self._links: dict[str, list[Any]] = {}
        """Traced writes of this window by context (tracing on only): the polls they cause link to them."""
        self._window: Timer | None = None
        """Open from a round of hints until the debounce has passed: writes within it wait for its end."""

    def wrote(self, context: str) -> None:
        """A request of `context` that may have written went through (its span, if traced, is current)."""
        self._contexts.add(context)
        link = tracing().current_link()
        if link is not None:
            links = self._links.setdefault(context, [])
            if len(links) < MAX_LINKS:
                links.append(link)
        if self._window is None:
            self._round()  # quiet: the leading edge, at once

    def _window_ended(self) -> None:
        self._window = None
        if self._contexts:
            self._round()  # the trailing edge: what was written within the window

    def _round(self) -> None:
        contexts, self._contexts = frozenset(self._contexts), set()
        links = {context: tuple(written) for context, written in self._links.items()}
        self._links = {}
        self._window = self._clock.call_at(self._clock.now() + self._debounce_s, self._window_ended)
        self._spawn(self._coordinator.announce_revalidate(contexts))
        self._hint(contexts, links)

    def cancel(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
        self._contexts.clear()
        self._links.clear()
