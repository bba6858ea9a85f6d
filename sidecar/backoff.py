"""How long to wait after failures, and the jitter every wait of the sidecar's own is spread by.

One rule for every retry (after redis-py's `backoff.py`): the wait doubles with each failure in a row, from
`initial` up to `maximum`, and is scaled by a factor drawn from [1 - jitter, 1 + jitter) so that many waiters
started together do not retry together. Polling uses it for the spec's MUST (design invariant 9: jitter on every
interval, exponential backoff on errors); the bus and the upstream's notification streams for their reconnects.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["JITTER", "Backoff", "jittered"]

JITTER = random.Random()
"""The sidecar's own source of jitter: the process-wide `random` state is left to whoever else uses it."""


def jittered(base: float, jitter: float, rand: Callable[[], float]) -> float:
    """`base` scaled by a factor drawn uniformly from [1 - jitter, 1 + jitter) (`rand` draws from [0, 1))."""
    return base * (1 + jitter * (2 * rand() - 1))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits that double with each failure in a row, from `initial` to `maximum` (in any unit), jittered."""

    initial: float
    maximum: float
    jitter: float = 0.0
    """0 for an exact doubling (no draw is taken)."""
    rand: Callable[[], float] = JITTER.random

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row (the first failure waits `initial`)."""
        base = min(self.maximum, self.initial * 2 ** max(failures - 1, 0))
        return jittered(base, self.jitter, self.rand) if self.jitter else base
