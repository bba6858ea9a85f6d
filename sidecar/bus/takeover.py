"""A new owner's take-over: the owner rule is the bus's machine's (`sidecar.bus.machine`, over
`sidecar.bus.ownership`); this counts what moved, and has a key this replica gained start from the state stored
beside it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Set

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.fence import Fence
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.link import Link
from sidecar.bus.machine import BusMachine, Decide, StoredRead, TakenOver
from sidecar.changes import WatchKey
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet

__all__ = ["Takeover"]

logger = logging.getLogger(__name__)


class Takeover:
    """The keys this replica gained taken over, and the count of what it holds."""

    def __init__(
        self,
        link: Link,
        keys: TrackedKeys,
        fence: Fence,
        background: TaskSet,
        metrics: Metrics,
        machine: BusMachine,
        decide: Decide,
    ) -> None:
        self._link = link
        self._keys = keys
        self._fence = fence
        self._background = background
        self._metrics = metrics
        self._machine = machine
        self._decide = decide
        self._taking: set[WatchKey] = set()
        """Keys this replica gained and has not yet taken over (see `_take_over`)."""
        self._task: asyncio.Task[None] | None = None
        link.on_switch(self._switched)

    def moved(self, gained: Set[str], lost: Set[str]) -> None:
        """Ownership moved: the keys gained are taken over, the lost counted."""
        for hashed in lost:
            self._metrics.lease_losses.inc()
            logger.debug("poll ownership moved away", extra={"watch": hashed[:12]})
        for hashed in gained:
            key = self._keys.by_hash(hashed)
            if key is None:
                continue
            self._metrics.lease_acquisitions.inc()
            self._taking.add(key)
        if self._taking and self._task is None:
            self._task = self._background.spawn(self._take_over())
        if gained or lost:
            self._metrics.leases_held.set(0 if self._link.degraded else self._machine.owned_count)

    def gave_up(self) -> None:
        """A key this replica polled is no longer watched here."""
        self._metrics.leases_held.set(self._machine.owned_count)

    def closed(self) -> None:
        """This replica left: it polls nothing for the cluster."""
        self._metrics.leases_held.set(0)

    def _switched(self, up: bool) -> None:
        self._metrics.leases_held.set(self._machine.owned_count if up else 0)

    # -- the take-over ---------------------------------------------------------------------------------------

    async def _take_over(self) -> None:
        """A new owner starts from the state stored beside each key it gained (the last fingerprint told, its
        generation), read for all of them in one batch:
        - it heard every change told (its generation is current) but its streams saw newer content (they joined
          after a change an owner saw and died holding): told to the others now, not to its own streams;
        - it missed a change told (an older generation): its streams are told it now.
        Then it polls at once, so a change nobody saw yet is told by the next look."""
        try:
            while self._taking:
                keys = [key for key in self._taking if key in self._keys]
                self._taking.clear()
                await self._take_over_batch(keys)
        finally:
            self._task = None

    async def _take_over_batch(self, keys: list[WatchKey]) -> None:
        try:
            ops = [Op(None, args=[self._link.layout.state_of(key), "f", "g"], command="hmget") for key in keys]
            stored_states = await self._link.batch(ops)
        except REDIS_FAILURES as exc:
            self._link.failed(exc)
            stored_states = [(None, None)] * len(keys)
        for key, (raw_told, generation) in zip(keys, stored_states, strict=True):
            watch = self._keys.get(key)
            if watch is None:
                continue
            told, stored = self._fence.stored(key, raw_told, generation)
            try:
                read = StoredRead(key, told, stored, watch.fingerprint, taking_over=True)
                await self._fence.carry_out(self._decide(read), watch)
            except REDIS_FAILURES as exc:
                self._link.failed(exc)
            if not self._keys.still(key, watch):
                continue  # given up while it was told: it keeps no fence
            await self._fence.carry_out(self._decide(TakenOver(key, None if told is None else stored)), watch)
            logger.debug("poll ownership taken", extra={"watch": key.short_hash})
