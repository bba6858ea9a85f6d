"""A clock the test moves by hand, for the watch engine's unit tests.

Nothing sleeps, and nothing here looks at asyncio's internals: `advance`, `fire_next` and `advance_to` only move
time and fire the timers due, synchronously; what those timers woke runs once the test awaits, and the test then
waits for the condition it means (a poll asked of the upstream, the next timer armed), bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from sidecar.watch.poller import Watch
from tests.kit import WAIT_S

__all__ = ["ManualClock", "run_polls"]

_EPSILON_S = 1e-9
"""Steps of a test add up in floating point (0.05 + 0.049 + 0.001): a timer due at their sum still fires."""
_MOST_TIMERS_PER_ADVANCE = 10_000
"""Far more than any test here fires in one advance: more means a callback re-arms at a past time without end."""


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
        self._changed()


class ManualClock:
    """A Clock whose time moves only when the test says so.

    `changed`, when given, is called on every arm and cancel: a test bench that waits on "something changed" (the
    native-notification bench's `Signal`) hears the clock as it hears its other fakes.
    """

    def __init__(self, changed: Callable[[], None] = _nothing) -> None:
        self._changed = changed
        self._now = 0.0
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()
        self.armed = 0
        """Timers ever armed: a test waits for it to grow to know that what it woke has scheduled its next step."""
        self.fired: list[Callable[[], None]] = []
        """The callbacks the last `advance` fired, in order."""
        self._armed_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _ManualTimer:
        timer = _ManualTimer(when, callback, self._changed)
        self.armed += 1
        for count, waiter in self._armed_waiters:
            if self.armed >= count and not waiter.done():
                waiter.set_result(None)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        self._changed()
        return timer

    def pending(self) -> int:
        """Timers armed and not cancelled (due or not)."""
        return sum(not timer.cancelled for _, _, timer in self._timers)

    async def until_armed(self, count: int, what: str = "") -> None:
        """Until `armed` reaches `count` (told as it happens, not polled); AssertionError naming `what` after the
        kit's bounded wait."""
        if self.armed >= count:
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (count, waiter)
        self._armed_waiters.append(entry)
        try:
            async with asyncio.timeout(WAIT_S):
                await waiter
        except TimeoutError:
            raise AssertionError(f"not within {WAIT_S} s: {what or f'{count} timers armed'}") from None
        finally:
            self._armed_waiters.remove(entry)

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
            timer.callback()
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
                timer.callback()
                return
        raise AssertionError("no timer is armed")


async def run_polls(clock: ManualClock, seconds: float) -> None:
    """Move time on by `seconds` one due time at a time, and after each wait until the watches' polls that came due
    there have ended (a poll's last act is to arm its watch's next): each poll starts at its own time, as on a real
    clock. For simulations where no watch stops while a poll is in flight (a stopped watch arms nothing)."""
    until = clock.now() + seconds
    while (due := clock.due()) and due[0] <= until + _EPSILON_S:
        clock.advance(max(0.0, due[0] - clock.now()))
        polls = sum(isinstance(getattr(callback, "__self__", None), Watch) for callback in clock.fired)
        await clock.until_armed(clock.armed + polls, f"the {polls} polls due at {clock.now()} ended")
    clock.advance(max(0.0, until - clock.now()))
