"""Revalidate on write, the engine's part: a request that may have changed data makes the watches it may concern
look soon.

The debounce is leading-edge: the first write after a quiet `polling.revalidate_debounce_ms` is a round of hints at
once (a lone write is not made to wait), and opens a window; the writes that arrive within it are one round at its
end, which opens the next window. A burst therefore costs a watch at most two looks (the leading one, and one after
it that the burst's later writes ask for), never one per write; a look still in flight when the trailing round
comes is followed by one more (the watch's own coalescing). Each round is told to the other replicas (their lease
owners look), and here hints the public watches and the writers' own contexts' watches (`Engine`); each hint then
obeys the watch's min_interval_ms, backoff, jitter and the hint budget. The window is one of the engine's timers,
armed and fired by its driver like the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.identity import PUBLIC
from sidecar.observability.tracing import MAX_LINKS
from sidecar.watch.engine.commands import AnnounceWrites, Command, LinkPoll, SetTimer
from sidecar.watch.engine.events import Hinted, WritesHeard, Wrote
from sidecar.watch.engine.index import WatchIndex
from sidecar.watch.engine.watching import Watching

__all__ = ["WriteRounds"]


class WriteRounds:
    """The write debounce: collects the contexts that wrote, and hints their watches when their round is due."""

    def __init__(
        self,
        debounce_s: float,
        timer_id: Callable[[], int],
        index: WatchIndex,
        watching: Watching,
    ) -> None:
        """`index`: the watches by context (read afresh at each round), which `watching` hints."""
        self._debounce_s = debounce_s
        self._timer_id = timer_id
        self._index = index
        self._watching = watching
        self._contexts: set[str] = set()
        self._links: dict[str, list[Any]] = {}
        """Traced writes of this window by context: the polls they cause link to them."""
        self._window: int | None = None
        """The timer of the open window (from a round of hints until the debounce has passed); None while quiet."""

    def owns_timer(self, timer: int) -> bool:
        return timer == self._window

    def wrote(self, context: str, link: Any, now: float) -> list[Command]:
        """A request of `context` that may have written went through (`link`: its span, None when untraced). Quiet,
        this is the leading edge: a round now; within a window, it waits for the window's end."""
        self._contexts.add(context)
        if link is not None:
            links = self._links.setdefault(context, [])
            if len(links) < MAX_LINKS:
                links.append(link)
        return self._round(now) if self._window is None else []

    def fired(self, now: float) -> list[Command]:
        """The window ended: the trailing edge, when anything was written within it."""
        self._window = None
        return self._round(now) if self._contexts else []

    def handle(self, event: Wrote | WritesHeard, now: float) -> list[Command]:
        if isinstance(event, Wrote):
            return self.wrote(event.context, event.link, now)
        return self._hint_watches(event.contexts, {}, now)  # another replica's round: its to announce, not ours

    def close(self) -> None:
        """Shutdown: the driver cancels the window's timer; what was written within it is hinted to nobody."""
        self._window = None
        self._contexts.clear()
        self._links.clear()

    def _round(self, now: float) -> list[Command]:
        contexts, self._contexts = frozenset(self._contexts), set()
        links = {context: tuple(written) for context, written in self._links.items()}
        self._links = {}
        self._window = self._timer_id()
        commands: list[Command] = [SetTimer(self._window, now + self._debounce_s), AnnounceWrites(contexts)]
        commands.extend(self._hint_watches(contexts, links, now))
        return commands

    def _hint_watches(self, contexts: frozenset[str], links: dict[str, tuple[Any, ...]], now: float) -> list[Command]:
        """The public watches, and the writers' own contexts' (never another context's: a hint, never a change,
        invariant 22), each with the traced writes that may concern it."""
        everyone = tuple(link for written in links.values() for link in written)
        commands: list[Command] = []
        for key in self._index.of_contexts((PUBLIC, *contexts)):
            linked = everyone if key.context == PUBLIC else links.get(key.context, ())
            if linked:
                commands.append(LinkPoll(key, linked))
            commands.extend(self._watching.handle(Hinted(key, True), now))
        return commands
