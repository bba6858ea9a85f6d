"""The one threaded-loop harness: an event loop in a thread of its own, for a world that outlives one test.

A hypothesis test runs its examples synchronously, and a module-scoped world (an upstream, a sidecar, open
streams) must live across them: the world's coroutines run on this loop, each call bounded.

    with loop_thread("auth-world") as loop:
        loop.run(setup)            # a coroutine function, run to its end on the thread's loop
        ...
    # on the way out: every task left on the loop cancelled and awaited, the loop stopped and closed
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import aiohttp

    from tests.kit.listen import ListenStream
    from tests.kit.serving import Sidecar
    from tests.peers import Upstream

__all__ = ["LoopThread", "World", "loop_thread"]

T = TypeVar("T")


class LoopThread:
    """A loop running forever in a daemon thread; `run` hands it a coroutine and waits for the result."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def run(self, make: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
        """`make()` awaited on the thread's loop, bounded by `timeout_s` there (and a little more here)."""

        async def bounded() -> T:
            async with asyncio.timeout(timeout_s):
                return await make()

        future: Future[T] = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        return future.result(timeout_s + 5)


@dataclass(kw_only=True)
class World:
    """What a property's world keeps across its examples: its loop thread, an upstream, a sidecar in front of it,
    a client session, each user's listen stream, and a count of the requests made (for unique ids)."""

    thread: LoopThread
    up: Upstream | None = None
    sidecar: Sidecar | None = None
    http: aiohttp.ClientSession | None = None
    streams: dict[str, ListenStream] = field(default_factory=dict)
    requests: int = 0

    def run(self, make: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
        """`make()` run to its end on the world's loop (see `LoopThread.run`)."""
        return self.thread.run(make, timeout_s)


async def _cancel_leftovers() -> None:
    # What pytest-asyncio does for its own loops: nothing may be left pending when the loop closes.
    leftovers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)


@contextlib.contextmanager
def loop_thread(name: str) -> Iterator[LoopThread]:
    """A started `LoopThread`; its leftover tasks cancelled, its loop stopped and closed on the way out."""
    harness = LoopThread(name)
    harness.thread.start()
    try:
        yield harness
    finally:
        try:
            harness.run(_cancel_leftovers)
        finally:
            harness.loop.call_soon_threadsafe(harness.loop.stop)
            harness.thread.join(10)
            harness.loop.close()
