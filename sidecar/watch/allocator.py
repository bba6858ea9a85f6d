"""Spending a read budget: how often each watched key is polled when the wanted schedule asks for more reads a
second than `polling.max_reads_per_s` allows. Pure: keys, change rates, holders and a budget in; intervals out.

A change waits on average half its key's interval before a poll sees it, so the mean staleness of changes is
least when each key's poll rate is proportional to the square root of its change rate (times the streams that
hold it, whose wait counts once each): `adaptive`. `uniform` stretches every interval by one factor. Either
way no key is polled more often than it wants (its ttlMs or rule, clamped) nor less often than every
`max_interval_ms`; when even that floor exceeds the budget, the floor wins (no key starves).

Change rates come from each key's own polls, which see only "changed or not": Cho and Garcia-Molina's
estimator for a Poisson source sampled every I seconds, r = -log((n - X + 0.5) / (n + 0.5)) / I, over polls
whose weight decays so that a key whose pace changes is followed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Allocation", "ChangeRate", "Demand", "allocate"]

Allocation = Literal["adaptive", "uniform"]

_DECAY = 0.95
"""Each poll keeps this share of the weight of the polls before it (about the last 20 count)."""
_OPTIMISM = 4.0
_UNSEEN_WEIGHT = 1e-9
"""Keys with no change seen share what is left once the others have all they want (a tie-break, not a rate)."""


class ChangeRate:
    """A key's change rate estimated from its polls (changed or not) and the time each covered."""

    __slots__ = ("changes", "polls", "seconds")

    def __init__(self) -> None:
        self.polls = 0.0
        self.changes = 0.0
        self.seconds = 0.0

    def record(self, changed: bool, interval_s: float) -> None:
        """One poll, `interval_s` after the one before it, that saw a change or not."""
        self.polls = self.polls * _DECAY + 1
        self.changes = self.changes * _DECAY + (1 if changed else 0)
        self.seconds = self.seconds * _DECAY + max(interval_s, 0.0)

    def estimate(self) -> float:
        """Cho and Garcia-Molina's estimate of the changes a second (0 until a poll has seen one)."""
        if self.polls <= 0 or self.seconds <= 0 or self.changes <= 0:
            return 0.0
        n, changed = self.polls, min(self.changes, self.polls)
        return -math.log((n - changed + 0.5) / (n + 0.5)) / (self.seconds / n)

    def per_s(self) -> float:
        """The change rate the allocation uses: the estimate, raised for a key seen changing at most polls."""
        estimate = self.estimate()
        if estimate == 0.0:
            return 0.0
        changed, n = min(self.changes, self.polls), self.polls
        # A key that changed at most of its polls is polled too seldom to tell how often it changes (the estimate
        # cannot exceed about log(2n + 1) / I): taken as faster than it looks, so it is polled more and known.
        return estimate * (1 + _OPTIMISM * (changed / n) ** 2)


@dataclass(frozen=True, slots=True)
class Demand:
    """One key as the allocator sees it."""

    key: Hashable
    wanted_s: float
    """The interval it would get without a budget (ttlMs or its rule, within [min, max]): never polled faster."""
    rate_per_s: float = 0.0
    """Its estimated change rate."""
    holders: int = 1
    """Streams holding it: a change each of them waits for counts once each."""


def _solve(weights: Sequence[float], lows: Sequence[float], highs: Sequence[float], budget: float) -> float:
    """The c for which sum(clamp(c * w, low, high)) == budget (every low < budget < every high summed), by
    sweeping the points where a key leaves its floor or reaches its ceiling."""
    events: list[tuple[float, int, int]] = []
    fixed = 0.0
    for index, (weight, low, high) in enumerate(zip(weights, lows, highs, strict=True)):
        fixed += low
        if weight > 0:
            events.append((low / weight, 0, index))  # leaves its floor: its rate is c * weight from here
            events.append((high / weight, 1, index))  # reaches its ceiling
    events.sort()
    free = 0.0
    for at, kind, index in events:
        if fixed + at * free >= budget:
            break
        if kind == 0:
            fixed -= lows[index]
            free += weights[index]
        else:
            free -= weights[index]
            fixed += highs[index]
    return (budget - fixed) / free if free > 0 else math.inf


def allocate(
    demands: Sequence[Demand], budget_per_s: float, *, max_interval_s: float, policy: Allocation = "adaptive"
) -> dict[Hashable, float]:
    """Each key's interval in seconds: the wanted one when the budget covers them all."""
    highs = [1 / demand.wanted_s for demand in demands]
    if sum(highs) <= budget_per_s:
        return {demand.key: demand.wanted_s for demand in demands}
    lows = [min(1 / max_interval_s, high) for high in highs]
    if sum(lows) >= budget_per_s:
        return {demand.key: 1 / low for demand, low in zip(demands, lows, strict=True)}  # no key starves
    if policy == "uniform":
        weights = highs
    else:
        weights = [
            math.sqrt(max(demand.holders, 1) * demand.rate_per_s) or _UNSEEN_WEIGHT * math.sqrt(max(demand.holders, 1))
            for demand in demands
        ]
    c = _solve(weights, lows, highs, budget_per_s)
    return {
        demand.key: 1 / min(max(c * weight, low), high)
        for demand, weight, low, high in zip(demands, weights, lows, highs, strict=True)
    }
