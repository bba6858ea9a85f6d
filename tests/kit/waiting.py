"""The one waiting helper of the tests, for state that has no event to await (a gauge, a count, a status body).

Where there is an event (a frame, a log line, a process exit) the tests await it instead; `eventually` polls
an outside observable on a short step, bounded, and says what it waited for when the bound runs out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["WAIT_S", "eventually"]

WAIT_S = 15.0
"""Upper bound for anything that should happen within a poll or two."""


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], within_s: float = WAIT_S, step: float = 0.02, *, what: str = ""
) -> None:
    """Until `check()` (plain or awaitable) is true; AssertionError naming `what` after `within_s`."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                outcome = check()
                if isinstance(outcome, Awaitable):
                    outcome = await outcome
                if outcome:
                    return
                await asyncio.sleep(step)  # polling an outside observable, bounded
    except TimeoutError:
        raise AssertionError(f"not within {within_s} s: {what or check}") from None
