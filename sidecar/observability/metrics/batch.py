"""Many observations for one Histogram, added in one go."""

from __future__ import annotations

import bisect

from prometheus_client import Histogram

__all__ = ["ObservationBatch"]


class ObservationBatch:
    """Observations for one Histogram, counted in plain Python and added to it by `commit`, in one go.

    A fan-out writes thousands of notifications in one pass, and `Histogram.observe` takes two locks per value
    (about 2 us, a tenth of a stream's share of the pass). The exposition after `commit` is the one the same
    `observe` calls would give: a value lands in the first bucket whose bound is at least it, as there.
    """

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        # prometheus_client's own fields (stable since 0.4); without them, observe one at a time as before.
        self._bounds: list[float] | None = getattr(histogram, "_upper_bounds", None)
        self._counts = [0] * len(self._bounds or ())
        self._sum = 0.0
        self._values: list[float] = []

    def observe(self, value: float) -> None:
        if self._bounds is None:
            self._values.append(value)
            return
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def commit(self) -> None:
        histogram = self._histogram
        if self._bounds is None:
            values, self._values = self._values, []
            for value in values:
                histogram.observe(value)
            return
        counts, self._counts = self._counts, [0] * len(self._bounds)
        if not any(counts):
            return
        histogram._sum.inc(self._sum)
        self._sum = 0.0
        buckets = histogram._buckets
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
