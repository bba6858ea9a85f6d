"""The callers of `WatchRegistry.acquire` waiting on the engine: each a future, by the waiter id the engine knows."""

from __future__ import annotations

import asyncio
import itertools

from sidecar.changes import WatchKey

__all__ = ["Waiters"]


class Waiters:
    """Waiter id -> the future its caller awaits: answered with a watch's key (None: nothing found) or failed."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[WatchKey | None]] = {}
        self._answered: dict[int, WatchKey] = {}
        """The watch each waiter was answered with, until its caller takes it: a caller cancelled before it resumes
        (its future cancelled, then answered in the same step) still lets go of what the engine gave it."""

    def __len__(self) -> int:
        return len(self._answers)

    def add(self) -> tuple[int, asyncio.Future[WatchKey | None]]:
        """A new waiter: its id, and the future its caller awaits."""
        waiter = next(self._ids)
        answer = self._answers[waiter] = asyncio.get_running_loop().create_future()
        return waiter, answer

    def answer(self, waiter: int, key: WatchKey | None) -> None:
        answer = self._answers.get(waiter)
        if answer is not None:
            if key is not None:
                self._answered[waiter] = key
            if not answer.done():
                answer.set_result(key)

    def fail(self, waiter: int, error: Exception) -> None:
        answer = self._answers.get(waiter)
        if answer is not None and not answer.done():
            answer.set_exception(error)

    def held(self, waiter: int) -> WatchKey | None:
        """The watch `waiter` was answered with, if it was (its caller holds it even when it was cancelled)."""
        return self._answered.get(waiter)

    def remove(self, waiter: int) -> None:
        del self._answers[waiter]
        self._answered.pop(waiter, None)

    def cancel_all(self) -> None:
        for answer in self._answers.values():
            answer.cancel()
