"""Tasks nobody awaits (a publish, a watch's stop, a bus loop, a take-over, a stream closing), held in one place.

Held so that none is collected while pending; each one's failure is logged as it ends (an error nobody awaits
would otherwise surface, if ever, when the task is collected); and its owner's close cancels them all, or waits
for them, at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskSet"]

logger = logging.getLogger(__name__)


class TaskSet:
    """The pending tasks of one owner; a task leaves the set as it ends, its failure logged as `failed`."""

    __slots__ = ("_failed", "_logger", "_tasks")

    def __init__(self, failed: str, log: logging.Logger = logger) -> None:
        self._failed = failed
        self._logger = log
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` as a task of this set."""
        task = asyncio.get_running_loop().create_task(work)
        self.hold(task)
        return task

    def hold(self, task: asyncio.Task[Any]) -> None:
        """Hold a task started elsewhere until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._logger.error(self._failed, exc_info=error)

    def cancel(self) -> None:
        """Cancel every task still pending (`wait` waits for them to end)."""
        for task in self._tasks:
            task.cancel()

    async def wait(self) -> None:
        """Until every task pending now has ended (their failures are logged, not raised)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel every task still pending and wait for them to end."""
        self.cancel()
        await self.wait()
