"""The bus's messages as they are read: decoded and routed (another replica's interest to ownership, a change to
the fence and this replica's listeners, a write through another replica or its leaving to the hints' listeners, a
replica's declaration that it cannot read the upstream to reach).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from sidecar.bus.fence import Fence
from sidecar.bus.interest import InterestWriter
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.layout import HINTS_CHANNEL, Interest, decode
from sidecar.bus.memory import MemoryBus
from sidecar.bus.reach import Reach
from sidecar.bus.takeover import Takeover
from sidecar.observability.metrics import Metrics

__all__ = ["Inbox"]

logger = logging.getLogger(__name__)

_HINTS = (HINTS_CHANNEL, HINTS_CHANNEL.encode())


class Inbox:
    """Routes each message read on the bus; synchronous, as the bus reader calls it (it must not raise)."""

    def __init__(
        self,
        instance: str,
        keys: TrackedKeys,
        fence: Fence,
        writer: InterestWriter,
        takeover: Takeover,
        local: MemoryBus,
        metrics: Metrics,
        reach: Reach,
    ) -> None:
        self._instance = instance
        self._reach = reach
        self._keys = keys
        self._fence = fence
        self._writer = writer
        self._takeover = takeover
        self._local = local
        self._metrics = metrics
        self._revalidate_listeners: list[Callable[[frozenset[str]], None]] = []

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._revalidate_listeners.append(listener)

    def read(self, channel: bytes, data: bytes) -> None:
        if channel in _HINTS:
            self._hint(data)
            return
        self._metrics.bus_received.inc()
        try:
            origin, message = decode(data)
        except (ValueError, KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        if origin == self._instance:
            return  # delivered locally when it was published
        if isinstance(message, Interest):
            if not self._writer.hold_back(message):
                self._takeover.interest(message.hashed, origin, message.present)
            return
        event = message
        if not event.baseline:
            watch = self._keys.get(event.key)
            if watch is not None:
                self._fence.heard(event)
                if watch.fingerprint == event.fingerprint:
                    return  # what our streams already have (their watch saw it first): not news here
        self._metrics.bus_messages.labels("in").inc()
        # Synchronously, as it is read: the cache drops what it made stale before this replica serves another
        # request (the cache listens before the streams do).
        self._local.deliver(event)

    def _hint(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
            origin = str(message["o"])
            if origin == self._instance:
                return
            if "r" in message:
                self._reach.heard(message["r"])
                return
            if message.get("left"):
                self._takeover.set_live(self._takeover.live - {origin})
                return
            contexts = frozenset(message["c"])
        except (ValueError, KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        for listener in self._revalidate_listeners:
            listener(contexts)
