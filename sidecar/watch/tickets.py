"""The ticket rule (invariant 7), in one place: a look at the upstream takes its ticket before its read starts,
and a look is applied only if no look that started later was applied before it. (A ticket orders looks; it is not
a generation, which numbers a key's changes: see the glossary in docs/architecture.md.)

One `Tickets` clock per registry orders every look (polls, first reads, joiners' looks, forwarded client reads);
each watch keeps a `Latest` of the looks applied to it. The read-through cache orders its entries on the same
clock (the ticket a forwarded request took when it started).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Latest", "Tickets"]

T = TypeVar("T")


class Tickets:
    """The clock of looks at the upstream: a later ticket means a look that started later."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def take(self) -> int:
        """A ticket for a look that starts now."""
        return next(self._counter)

    async def look(self, read: Callable[[], Awaitable[T]]) -> tuple[int, T]:
        """Run `read`, ticketed as it starts (never as it ends: a slow read must not pass for a fresh one)."""
        ticket = self.take()
        return ticket, await read()


class Latest:
    """The ticket of the latest look applied to one watch."""

    __slots__ = ("_ticket",)

    def __init__(self, ticket: int) -> None:
        self._ticket = ticket

    def admit(self, ticket: int) -> bool:
        """True, and recorded, when a look that started at `ticket` is newer than every look applied so far; a
        stale look is refused and never overwrites a fresher one."""
        if ticket <= self._ticket:
            return False
        self._ticket = ticket
        return True
