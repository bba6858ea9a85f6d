"""Revalidate on write: a request that may have changed data makes the watches it may concern poll soon.

Writes are batched over `polling.revalidate_debounce_ms` (a burst of tool calls is one round of hints), the
other replicas are told (their lease owners poll), and here the public watches and the writers' own
contexts' watches are hinted; each hint then obeys the watch's backoff, jitter and the hint budget.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from sidecar.changes import PollCoordinator
from sidecar.observability.tracing import MAX_LINKS, tracing
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer

__all__ = ["Revalidator"]


class Revalidator:
    """Collects the contexts that wrote, and hints their watches once per debounce window."""

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
        self._timer: Timer | None = None

    def wrote(self, context: str) -> None:
        """A request of `context` that may have written went through (its span, if traced, is current)."""
        self._contexts.add(context)
        link = tracing().current_link()
        if link is not None:
            links = self._links.setdefault(context, [])
            if len(links) < MAX_LINKS:
                links.append(link)
        if self._timer is None:
            self._timer = self._clock.call_at(self._clock.now() + self._debounce_s, self._fire)

    def _fire(self) -> None:
        contexts, self._contexts = frozenset(self._contexts), set()
        links = {context: tuple(written) for context, written in self._links.items()}
        self._links = {}
        self._timer = None
        self._spawn(self._coordinator.announce_revalidate(contexts))
        self._hint(contexts, links)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
