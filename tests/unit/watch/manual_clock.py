"""A clock the test moves by hand, for the watch engine's unit tests.

Nothing sleeps, and nothing here looks at asyncio's internals: `advance`, `fire_next` and `advance_to` only move
time and fire the timers due, synchronously; what those timers woke runs once the test awaits, and the test then
waits for the condition it means (a poll asked of the upstream, the next timer armed), bounded by a timeout.

A wait here also ends at once, failing, when a task the timers started has crashed: a poll that raised never arms
its watch's next one, and waiting out the bound for it would only make a broken engine (a mutant of it) slow to
fail, not a test that knows more.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from tests.kit import WAIT_S

__all__ = ["ManualClock", "run_polls"]

_EPSILON_S = 1e-9
"""Steps of a test add up in floating point (0.05 + 0.049 + 0.001): a timer due at their sum still fires."""
_MOST_TIMERS_PER_ADVANCE = 10_000
"""Far more than any test here fires in one advance: more means a callback re-arms at a past time without end."""


_Factory = Callable[..., "asyncio.Future[Any]"]


def _nothing() -> None:
    pass


class _ManualTimer:
    def __init__(self, when: float, callback: Callable[[], None], changed: Callable[[], None]) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False
        self._changed = changed

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True
        self._changed()  # `pending()` fell: a wait on it looks again


class ManualClock:
    """A Clock whose time moves only when the test says so.

    `changed`, when given, is called on every arm and cancel, and whenever a task the timers started ends: a test
    bench that waits on "something changed" (the native-notification bench's `Signal`) hears the clock as it hears
    its other fakes.
    """

    def __init__(self, changed: Callable[[], None] = _nothing) -> None:
        self._on_change = changed
        self._now = 0.0
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()
        self.armed = 0
        """Timers ever armed: a test waits for it to grow to know that what it woke has scheduled its next step."""
        self.fired: list[Callable[[], None]] = []
        """The callbacks the last `advance` fired, in order."""
        self._wakers: list[asyncio.Future[None]] = []
        """The waits of `until`, woken to look again when a timer is armed or cancelled or a task it started ends."""
        self.crashed: BaseException | None = None
        """The first failure of a task the timers' callbacks started (a poll, a look): no wait here outlives it."""

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _ManualTimer:
        timer = _ManualTimer(when, callback, self._changed)
        self.armed += 1
        heapq.heappush(self._timers, (when, next(self._order), timer))
        self._changed()
        return timer

    def _changed(self) -> None:
        self._on_change()
        for waker in self._wakers:
            if not waker.done():
                waker.set_result(None)

    def _fire(self, timer: _ManualTimer) -> None:
        """Run a timer's callback, noting the tasks it starts (each poll is one): a crash of one ends every wait."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a callback outside any loop starts no task
            timer.callback()
            return
        previous: _Factory | None = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Future[Any]:
            task = previous(loop, coro, **options) if previous is not None else asyncio.Task(coro, loop=loop, **options)
            task.add_done_callback(self._ended)
            return task

        loop.set_task_factory(factory)
        try:
            timer.callback()
        finally:
            loop.set_task_factory(previous)

    def _ended(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None and self.crashed is None:
            self.crashed = error
        self._changed()

    async def until(self, check: Callable[[], bool], what: str) -> None:
        """Until `check()` holds, looked at again whenever a timer is armed or cancelled or a task the timers started
        ends; AssertionError naming `what` at once when such a task crashed, else after the kit's bounded wait."""
        waker: asyncio.Future[None] | None = None
        try:
            async with asyncio.timeout(WAIT_S):
                while not check():
                    if self.crashed is not None:
                        raise AssertionError(f"{what}: a task the timers started crashed") from self.crashed
                    waker = asyncio.get_running_loop().create_future()
                    self._wakers.append(waker)
                    await waker
                    self._wakers.remove(waker)
        except TimeoutError:
            raise AssertionError(f"not within {WAIT_S} s: {what}") from None
        finally:
            if waker is not None and waker in self._wakers:
                self._wakers.remove(waker)

    def pending(self) -> int:
        """Timers armed and not cancelled (due or not)."""
        return sum(not timer.cancelled for _, _, timer in self._timers)

    async def until_armed(self, count: int, what: str = "") -> None:
        """Until `armed` reaches `count` (told as it happens, not polled); see `until`."""
        await self.until(lambda: self.armed >= count, what or f"{count} timers armed")

    def due(self) -> list[float]:
        """When each armed timer is due (cancelled ones left out), soonest first."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time on by `seconds`, firing each timer armed and due by then at its own time; returns how many
        fired. A timer armed by a callback it fires fires too if due; what the callbacks wake (tasks) runs once the
        test awaits, so a timer those arm is left for the next call."""
        until = self._now + seconds
        self.fired = []
        while self._timers and self._timers[0][0] <= until + _EPSILON_S:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            assert len(self.fired) < _MOST_TIMERS_PER_ADVANCE, "timers fire without end: one re-arms at a past time"
            self._now = max(self._now, when)
            self.fired.append(timer.callback)
            self._fire(timer)
        self._now = max(self._now, until)
        return len(self.fired)

    def advance_to(self, when: float) -> None:
        """Move time on to `when`, with no timer due before it (those fire by `fire_next`, one at a time)."""
        due = [at for at, _, timer in self._timers if not timer.cancelled and at < when]
        assert not due, f"timers due before {when}: {sorted(due)}"
        self._now = max(self._now, when)

    def fire_next(self) -> None:
        """Fire the next timer now, and return before anything it started has run."""
        while self._timers:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._now = max(self._now, when)
                self._fire(timer)
                return
        raise AssertionError("no timer is armed")


async def run_polls(clock: ManualClock, seconds: float, polling: Callable[[], int]) -> None:
    """Move time on by `seconds` one due time at a time, and after each wait until the polls that came due there
    (`polling()` counts those in flight) have ended: each poll starts at its own time, as on a real clock."""
    until = clock.now() + seconds
    still = 0
    while (due := clock.due()) and due[0] <= until + _EPSILON_S:
        # Time must move: polls that keep arming their next at the same instant would loop here without end.
        still = still + 1 if due[0] <= clock.now() else 0
        assert still < _MOST_TIMERS_PER_ADVANCE, f"polls re-armed at {clock.now()} without end: time never moves"
        clock.advance(max(0.0, due[0] - clock.now()))
        await clock.until(lambda: polling() == 0, f"the polls due at {clock.now()} ended")
    clock.advance(max(0.0, until - clock.now()))
