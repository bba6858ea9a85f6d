"""The change bus contract: tiny typed events in, synchronous listeners out; it never sees JSON-RPC."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sidecar.watch.keys import WatchKey

__all__ = ["Bus", "ChangeEvent", "ChangeListener"]


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """A watch saw new content. A level trigger: consumers re-read, so duplicates are harmless."""

    key: WatchKey
    fingerprint: str
    generation: int
    detected_at: float
    """Wall-clock seconds when the change was detected (for the delivery-latency metric)."""
    baseline: bool = False
    """Not a change: a watch's first look (other replicas' caches drop an answer it contradicts; no stream is
    told)."""


ChangeListener = Callable[[ChangeEvent], None]
"""Called on the event loop for every event; must not raise and must not block."""


class Bus(Protocol):
    """Fan-out of change events to every listener of every process that shares the bus."""

    async def publish(self, event: ChangeEvent) -> None:
        """Deliver to every listener (here and, for a shared bus, in other processes)."""
        ...

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        """Register a local listener; the returned function unsubscribes and is safe to call twice."""
        ...
