"""Notifications written to listen streams: counted by method and timed from the change's detection.

A fan-out pass writes thousands at once, so they are counted here and added to the metrics once per turn of the
event loop, not once each.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sidecar.observability.metrics import Metrics, ObservationBatch

__all__ = ["Delivered"]


class Delivered:
    """`written` for each notification a stream writes; the metrics follow at the end of the loop's turn."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._counters: dict[str, Any] = {}
        """The labelled counter of each method, resolved once."""
        self._counts: dict[str, int] = {}
        """Notifications written by method since the last commit."""
        self._latency = ObservationBatch(metrics.delivery_latency)
        self._commit_scheduled = False

    def written(self, method: str, detected_at: float) -> None:
        self._counts[method] = self._counts.get(method, 0) + 1
        self._latency.observe(max(0.0, time.time() - detected_at))
        if not self._commit_scheduled:
            self._commit_scheduled = True
            asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        self._commit_scheduled = False
        counts, self._counts = self._counts, {}
        for method, count in counts.items():
            counter = self._counters.get(method)
            if counter is None:
                counter = self._counters[method] = self._metrics.notifications.labels(method)
            counter.inc(count)
        self._latency.commit()
