"""The in-process bus: enough for one process; several replicas use the Redis bus instead."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sidecar.changes import ChangeEvent, ChangeListener

__all__ = ["MemoryBus"]

logger = logging.getLogger(__name__)


class MemoryBus:
    """Calls listeners in registration order; a raising listener is logged and skipped."""

    def __init__(self) -> None:
        self._listeners: dict[object, ChangeListener] = {}

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        token = object()  # the same function may subscribe twice; each registration is its own
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    async def publish(self, event: ChangeEvent) -> None:
        self.deliver(event)
        # Yield once so streams drain between bursts of changes.
        await asyncio.sleep(0)

    def deliver(self, event: ChangeEvent) -> None:
        """Call every listener now, in registration order."""
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # fan-out boundary: one broken listener must not starve the others
                logger.exception("change listener failed")
