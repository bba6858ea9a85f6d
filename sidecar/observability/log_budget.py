"""How many lines a kind of event may write to the log: a few at once, then a steady trickle. Under churn
(thousands of streams ending in a reconnect wave) the log keeps a sample of each kind and a count of the rest,
instead of a line per event drowning every other line."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LogBudget"]


@dataclass(slots=True)
class _Allowance:
    tokens: float
    at: float
    held: int = 0


class LogBudget:
    """Per kind (a small fixed set: a stream's end reasons, say), `burst` lines at once and `per_s` a second after."""

    def __init__(self, burst: int = 10, per_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._per_s = per_s
        self._clock = clock
        self._kinds: dict[str, _Allowance] = {}

    def take(self, kind: str) -> int | None:
        """None: hold this line back. Otherwise write it, saying how many lines of `kind` were held back since the
        last one written (0 when none)."""
        now = self._clock()
        allowance = self._kinds.get(kind)
        if allowance is None:
            allowance = self._kinds[kind] = _Allowance(float(self._burst), now)
        allowance.tokens = min(float(self._burst), allowance.tokens + (now - allowance.at) * self._per_s)
        allowance.at = now
        if allowance.tokens < 1:
            allowance.held += 1
            return None
        allowance.tokens -= 1
        held, allowance.held = allowance.held, 0
        return held
