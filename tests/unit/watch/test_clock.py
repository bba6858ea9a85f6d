"""The event loop's clock: monotonic seconds, and callbacks at a time on that scale; sleeping and waiting with a
timeout on any clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from sidecar.watch.clock import LOOP_CLOCK, sleep, within
from tests.kit import WAIT_S, eventually
from tests.unit.watch.manual_clock import ManualClock


async def test_the_loop_clock_reads_monotonic_seconds_and_runs_a_callback_at_its_time() -> None:
    before = time.monotonic()
    now = LOOP_CLOCK.now()
    assert before <= now <= time.monotonic()
    fired = asyncio.Event()
    fired_at: list[float] = []

    def callback() -> None:
        fired_at.append(time.monotonic())
        fired.set()

    when = LOOP_CLOCK.now() + 0.01
    timer = LOOP_CLOCK.call_at(when, callback)
    assert timer.when() == when
    await asyncio.wait_for(fired.wait(), timeout=1.0)
    assert fired_at[0] >= when


async def test_a_cancelled_timer_never_runs() -> None:
    ran: list[bool] = []
    timer = LOOP_CLOCK.call_at(LOOP_CLOCK.now(), lambda: ran.append(True))
    timer.cancel()
    later = asyncio.Event()
    LOOP_CLOCK.call_at(LOOP_CLOCK.now() + 0.01, later.set)
    await asyncio.wait_for(later.wait(), timeout=1.0)
    assert ran == []


async def test_sleep_on_a_clock_wakes_when_that_clock_reaches_the_time() -> None:
    clock = ManualClock()
    sleeper = asyncio.create_task(sleep(clock, 2.0))
    await eventually(lambda: clock.due() == [2.0], what="the sleep's timer armed at its time")
    assert clock.advance(1.99) == 0 and not sleeper.done()
    assert clock.advance(0.01) == 1
    await asyncio.wait_for(sleeper, WAIT_S)
    assert clock.pending() == 0


async def test_a_sleep_called_off_leaves_no_timer() -> None:
    clock = ManualClock()
    sleeper = asyncio.create_task(sleep(clock, 2.0))
    await eventually(lambda: clock.pending() == 1)  # it sleeps: its timer is armed
    sleeper.cancel()
    await asyncio.gather(sleeper, return_exceptions=True)
    assert clock.pending() == 0


async def test_within_gives_the_result_in_time_and_leaves_no_timer() -> None:
    clock = ManualClock()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(within(clock, 1.0, answer))
    await eventually(lambda: clock.due() == [1.0], what="the wait's timer armed at its time")
    assert clock.advance(0.5) == 0
    answer.set_result("on time")
    assert await asyncio.wait_for(waiting, WAIT_S) == "on time"
    assert clock.pending() == 0


async def test_within_raises_timeout_once_the_clock_passes_and_stops_the_wait() -> None:
    clock = ManualClock()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(within(clock, 1.0, answer))
    await eventually(lambda: clock.due() == [1.0], what="the wait's timer armed at its time")
    assert clock.advance(0.99) == 0 and not waiting.done()
    assert clock.advance(0.01) == 1
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting, WAIT_S)
    assert answer.cancelled(), "what it waited for is stopped"


async def test_within_cancelled_from_outside_is_a_cancellation_not_a_timeout() -> None:
    clock = ManualClock()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(within(clock, 1.0, answer))
    await eventually(lambda: clock.pending() == 1)  # it waits: its timer is armed
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled() and answer.cancelled()
    assert clock.pending() == 0


async def test_within_cancelled_as_its_time_runs_out_is_a_cancellation_not_a_timeout() -> None:
    clock = ManualClock()
    slow_to_stop = asyncio.Event()
    stopping = False

    async def stops_slowly() -> None:
        nonlocal stopping
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopping = True
            await slow_to_stop.wait()  # cleaning up takes a while (a connection closing)
            raise

    waiting = asyncio.create_task(within(clock, 1.0, stops_slowly()))
    await eventually(lambda: clock.due() == [1.0], what="the wait's timer armed at its time")
    assert clock.advance(1.0) == 1  # the time runs out: what it waits for is stopping
    await eventually(lambda: stopping, what="what it waits for is told to stop")
    waiting.cancel()  # and its caller is cancelled meanwhile (a shutdown)
    slow_to_stop.set()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
