"""The Redis bus's tasks: its loops (the bus reader, the heartbeat, the interest writer) and its one-off tasks
(resyncs, take-overs, clean-ups of dead replicas), held in one place so none is collected while pending, each
one-off's failure is logged when it ends, and closing cancels them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background", "stop_if_cancelled"]

logger = logging.getLogger(__name__)


def stop_if_cancelled() -> None:
    """The redis client may turn a cancellation in the middle of a command into a connection error, or absorb it:
    a loop must not go on after its own task was cancelled (shutdown would wait for it for ever)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Background:
    """Loops, started once, and one-off tasks, spawned at any time; `aclose` cancels both."""

    def __init__(self) -> None:
        self._loops: list[asyncio.Task[None]] = []
        self._one_offs: set[asyncio.Task[None]] = set()

    def loop(self, work: Coroutine[Any, Any, None]) -> None:
        self._loops.append(asyncio.get_running_loop().create_task(work))

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._one_offs.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._one_offs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a redis coordination task failed", exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel everything. A loop that died of a bug is reported, and the caller's handover happens whatever the
        loops ended with."""
        tasks = [*self._loops, *self._one_offs]
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                logger.error("a redis coordination loop had failed", exc_info=outcome)
