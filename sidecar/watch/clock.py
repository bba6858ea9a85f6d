"""The watch engine's clock: what time it is, and running a callback at a time. The event loop's by default;
tests hand in one they advance by hand, so schedules, backoff, linger and debounce are tested without
sleeping (as client-go's informers take a clock)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["LOOP_CLOCK", "Clock", "LoopClock", "Timer"]


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
