"""The watch engine's clock: what time it is, and running a callback at a time. The event loop's by default;
tests hand in one they advance by hand, so schedules, backoff, linger and debounce are tested without
sleeping (as client-go's informers take a clock)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

__all__ = ["LOOP_CLOCK", "Clock", "LoopClock", "Timer", "sleep", "within"]

T = TypeVar("T")


class Timer(Protocol):
    """A scheduled callback: when it is due, and a way to call it off."""

    def when(self) -> float: ...

    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` at `when` (on `now`'s scale) on the event loop."""
        ...


class LoopClock:
    """The running event loop's clock (monotonic seconds) and timers."""

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        # asyncio's loop.time() is time.monotonic(): one scale for both.
        return asyncio.get_running_loop().call_at(when, callback)


LOOP_CLOCK = LoopClock()


async def sleep(clock: Clock, seconds: float) -> None:
    """Wait `seconds` on `clock` (`asyncio.sleep` on the loop's; on a hand-moved one, until the test moves it)."""
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    timer = clock.call_at(clock.now() + seconds, wake)
    try:
        await woken
    finally:
        timer.cancel()


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or TimeoutError once `seconds` pass on `clock` first (`asyncio.wait_for` on it)."""
    task = asyncio.ensure_future(awaitable)
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        task.cancel()

    timer = clock.call_at(clock.now() + seconds, expire)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if expired and (current is None or not current.cancelling()):
            raise TimeoutError from None
        raise  # the caller was cancelled (perhaps as the timer fired): a cancellation, never a timeout
    finally:
        timer.cancel()
