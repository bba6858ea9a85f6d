"""The bus's messages as they are read: decoded and routed (another replica's interest to ownership, a change to
the fence and this replica's listeners, a write through another replica or its leaving to the hints' listeners, a
replica's declaration that it cannot read the upstream to reach).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from sidecar.bus.keys import TrackedKeys
from sidecar.bus.layout import HINTS_CHANNEL, Interest, decode
from sidecar.bus.machine import ChangeHeard, Decide, Deliver, InterestHeard, ReplicaLeft
from sidecar.bus.memory import MemoryBus
from sidecar.bus.reach import Reach
from sidecar.observability.metrics import Metrics

__all__ = ["Inbox"]

logger = logging.getLogger(__name__)

_HINTS = (HINTS_CHANNEL, HINTS_CHANNEL.encode())


class Inbox:
    """Routes each message read on the bus; synchronous, as the bus reader calls it (it must not raise)."""

    def __init__(
        self, instance: str, keys: TrackedKeys, decide: Decide, local: MemoryBus, metrics: Metrics, reach: Reach
    ) -> None:
        self._instance = instance
        self._reach = reach
        self._keys = keys
        self._decide = decide
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
            self._decide(InterestHeard(message.hashed, origin, message.present))
            return
        watch = self._keys.get(message.key)
        for command in self._decide(ChangeHeard(message, None if watch is None else watch.fingerprint)):
            if isinstance(command, Deliver):
                self._metrics.bus_messages.labels("in").inc()
                # Synchronously, as it is read: the cache drops what it made stale before this replica serves
                # another request (the cache listens before the streams do).
                self._local.deliver(command.event)

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
                self._decide(ReplicaLeft(origin))
                return
            contexts = frozenset(message["c"])
        except (ValueError, KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        for listener in self._revalidate_listeners:
            listener(contexts)
