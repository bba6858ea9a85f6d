"""Looks in flight that callers share: first reads (per kind, URI and context) and joiners' looks (per key).

Everyone starting the same read at once waits on one (a reconnect storm costs one upstream read), unless the
read is paced in its client's fair share: that one is its client's alone, since another client's queue must not
delay this one (invariant 20); a read of its own costs one more upstream read, bounded by that client's rate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["SharedReads"]

T = TypeVar("T")


class SharedReads(Generic[T]):
    """Reads in flight by what they read; a paced one by what it reads and the client it is paced for."""

    __slots__ = ("_reads",)

    def __init__(self) -> None:
        self._reads: dict[Hashable, asyncio.Task[T]] = {}

    def __len__(self) -> int:
        return len(self._reads)

    def joinable(self, read: Hashable, client: str) -> asyncio.Task[T] | None:
        """A read in flight that `client` may wait on: one that went at once (anyone's), or its own paced one."""
        return self._reads.get(read) or self._reads.get((read, client))

    def register(self, read: Hashable, paced_for: str | None, task: asyncio.Task[T]) -> None:
        """`task` reads `read`; paced in `paced_for`'s fair share, or (None) at once."""
        reads = self._reads
        key: Hashable = read if paced_for is None else (read, paced_for)
        reads[key] = task

        def done(_: asyncio.Task[T]) -> None:
            if reads.get(key) is task:
                del reads[key]
            if not task.cancelled():
                # Retrieved here: the callers still waiting got it through their shield, and a read every caller gave
                # up on (a shield cancelled first no longer looks) has nobody left to tell.
                task.exception()

        task.add_done_callback(done)

    def cancel(self) -> None:
        for task in self._reads.values():
            task.cancel()
