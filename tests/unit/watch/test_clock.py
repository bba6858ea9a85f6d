"""The event loop's clock: monotonic seconds, and callbacks at a time on that scale."""

from __future__ import annotations

import asyncio
import time

from sidecar.watch.clock import LOOP_CLOCK


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
