"""`polling.max_reads_per_s` at work: every poll of the upstream takes a slot of the budget (hinted ones too),
and the regular intervals are allocated so that the schedule fits it (see `sidecar.watch.allocator`).

The slots are the guarantee: polls are spaced at least 1/budget seconds apart, so no second ever holds more
than the budget (plus the one poll on its edge). The allocation is what keeps the wait for a slot short and
spends the budget where changes are. On replicas the budget is the fleet's: this replica's share is the budget
over the live replicas it knows, and it allocates among the keys it polls.

Its rules are plain functions of what it is given: no clock (the time comes with each call), no metric (what a
caller shows, the share it reports and the waits for slots, the caller sets), no callback (the keys polled here and
the number of live replicas come with the calls that need them). A key whose interval an allocation shortens is not
re-armed from inside it (the allocation runs while a watch's plan asks for its own interval): the budget names it,
and the engine tightens it once its step is over (`take_tightened`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Generic, Protocol, TypeVar

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.watch.allocator import ChangeRate, Demand, allocate

__all__ = ["Budgeted", "ReadBudget"]

_REALLOCATE_S = 1.0
"""How old an allocation may be before a poll asks for a new one (change rates and the keys move slowly)."""
_HINTED_HALF_LIFE_S = 10.0
_MIN_MARGIN = 0.05
_TIGHTER = 0.8
"""A key whose allocated interval shrank below this share of the last is re-armed at once, not at its old time."""
_SCHEDULED_SHARE = 0.9
"""Of the budget, what regular polls are allocated: jittered timers bunch, and a full budget would make them queue
for slots (the slots, not the allocation, keep the budget)."""


class Budgeted(Protocol):
    """What the budget reads of a watch."""

    key: WatchKey

    @property
    def refs(self) -> int: ...

    @property
    def wanted_ms(self) -> float: ...


W = TypeVar("W", bound=Budgeted)


class ReadBudget(Generic[W]):
    """This replica's share of the upstream's read budget: slots for polls, and intervals for keys."""

    def __init__(self, config: PollingConfig) -> None:
        self._config = config
        self._rates: dict[WatchKey, ChangeRate] = {}
        self._intervals: dict[Hashable, float] = {}
        self._allocated_at = -math.inf
        self._next_slot = -math.inf
        self._hinted = 0.0
        """Hinted polls a second, decaying: the allocation leaves them room."""
        self._hinted_at = -math.inf
        """When `_hinted` was last decayed (none yet: from minus infinity, nothing is left of the none there was)."""
        self._tightened: list[W] = []
        """Keys the last allocations gave a much shorter interval, for the driver to re-arm (`take_tightened`)."""

    @property
    def enabled(self) -> bool:
        return self._config.max_reads_per_s > 0

    def per_s(self, replicas: int) -> float:
        """This replica's share of the budget (reads a second), with `replicas` live (none known: this one is all)."""
        return self._config.max_reads_per_s / max(replicas, 1)

    def slot(self, earliest: float, *, hinted: bool, replicas: int) -> float:
        """When a poll wanted at `earliest` may start: the next free slot, which it takes."""
        per_s = self.per_s(replicas)
        if hinted:
            self._decay_hinted(earliest)
            self._hinted += math.log(2) / _HINTED_HALF_LIFE_S
        start = max(earliest, self._next_slot)
        self._next_slot = start + 1 / per_s
        return start

    def _decay_hinted(self, now: float) -> None:
        self._hinted *= 0.5 ** (max(now - self._hinted_at, 0.0) / _HINTED_HALF_LIFE_S)
        self._hinted_at = now

    def polled(self, key: WatchKey, changed: bool, interval_s: float) -> None:
        """A poll of `key`, `interval_s` after its previous one, saw a change or not."""
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = ChangeRate()
        rate.record(changed, interval_s)

    def forget(self, key: WatchKey) -> None:
        self._rates.pop(key, None)
        if self._intervals.pop(key, None) is not None:
            # A key the allocation counted has left: its share is the others' now, at the next interval asked for
            # (as a key new to it gets its own at once), not a second later.
            self._allocated_at = -math.inf

    def stale(self, key: WatchKey, now: float, *, counted: bool = True) -> bool:
        """Whether `key`'s interval needs a new allocation at `now`: the last is a second old, a key it counted has
        left since, or `key` is new to it and one an allocation counts (`counted`: held, and this replica's to poll),
        which gets its share at once. A key an allocation leaves out (a watch not published yet, a lingering one,
        one another replica polls) would get nothing from a new one but its wanted interval, which it gets anyway:
        reallocating over every key for it, at each start and at each of its polls, made a start storm quadratic."""
        if now - self._allocated_at >= _REALLOCATE_S:
            return True
        return counted and key not in self._intervals

    def interval_ms(self, watch: W) -> float:
        """The interval the last allocation gave `watch` (its wanted one when it had none: it covers everyone)."""
        interval_s = self._intervals.get(watch.key)
        return watch.wanted_ms if interval_s is None else interval_s * 1000

    def allocate(self, now: float, polled: Iterable[W], replicas: int) -> None:
        """Allocate the intervals of the keys `polled` here (held, and this replica's to poll) at `now`."""
        polled = list(polled)
        self._allocated_at = now
        demands = [
            Demand(
                watch.key,
                watch.wanted_ms / 1000,
                rate.per_s() if (rate := self._rates.get(watch.key)) is not None else 0.0,
                watch.refs,
            )
            for watch in polled
        ]
        self._decay_hinted(now)
        spendable = max(self.per_s(replicas) * _SCHEDULED_SHARE - self._hinted, 0.0)
        # The floor is set so that jittered it stays within max_interval_ms less a margin for a slot's wait: no key
        # goes unread longer than max_interval_ms.
        margin = max(self._config.jitter, _MIN_MARGIN)
        floor_s = self._config.max_interval_ms / 1000 * (1 - margin) / (1 + self._config.jitter)
        previous, self._intervals = (
            self._intervals,
            allocate(demands, spendable, max_interval_s=floor_s, policy=self._config.allocation),
        )
        for watch in polled:
            before = previous.get(watch.key)
            if before is not None and self._intervals[watch.key] < before * _TIGHTER:
                self._tightened.append(watch)  # armed for the longer interval: its next poll comes sooner now

    def take_tightened(self) -> list[W]:
        """The watches whose interval the allocations since the last call shortened (each to re-arm, once)."""
        tightened, self._tightened = self._tightened, []
        return tightened
