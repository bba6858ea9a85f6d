"""Who polls which key on the Redis bus, and a new owner's take-over: the owner rule is `sidecar.bus.ownership`'s
(pure); this feeds it, counts what moved, and has a key this replica gained start from the state stored beside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.fence import Fence
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.link import Link
from sidecar.bus.ownership import Ownership
from sidecar.changes import ChangeEvent, WatchKey
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet

__all__ = ["Takeover"]

logger = logging.getLogger(__name__)

Change = tuple[set[str], set[str]]
"""The keys (hashes) this replica gained and lost by one change of ownership's inputs."""


class Takeover:
    """This replica's ownership (fed the live replicas and each key's interest) and the take-overs it brings."""

    def __init__(self, link: Link, keys: TrackedKeys, fence: Fence, background: TaskSet, metrics: Metrics) -> None:
        self._link = link
        self._keys = keys
        self._fence = fence
        self._background = background
        self._metrics = metrics
        self._own = Ownership(link.instance)
        self._taking: set[WatchKey] = set()
        """Keys this replica gained and has not yet taken over (see `_take_over`)."""
        self._task: asyncio.Task[None] | None = None
        link.on_switch(self._switched)

    # -- what ownership is fed -------------------------------------------------------------------------------

    @property
    def owned_count(self) -> int:
        return len(self._own.owned)

    @property
    def live(self) -> frozenset[str]:
        return self._own.live

    def owns(self, hashed: str) -> bool:
        return self._own.owns(hashed)

    def track(self, hashed: str, interested: Iterable[str]) -> None:
        """This replica's interest in the key is written; `interested` is who Redis (and the bus since) says is."""
        self._settle(self._own.track(hashed, interested))

    def untrack(self, hashed: str) -> None:
        _, lost = self._own.untrack(hashed)
        if lost:
            self._metrics.leases_held.set(len(self._own.owned))

    def interest(self, hashed: str, instance: str, present: bool) -> None:
        self._settle(self._own.interest(hashed, instance, present))

    def set_live(self, live: Iterable[str]) -> None:
        self._settle(self._own.set_live(live))

    def set_cut(self, cut: Iterable[str]) -> None:
        """The replicas cut from the upstream (`sidecar.bus.reach`): their keys go to the interested readers."""
        self._settle(self._own.set_cut(cut))

    def forget(self, instance: str) -> None:
        self._own.forget(instance)

    def closed(self) -> None:
        """This replica left: it polls nothing for the cluster."""
        self._metrics.leases_held.set(0)

    def _switched(self, up: bool) -> None:
        self._metrics.leases_held.set(len(self._own.owned) if up else 0)

    def _settle(self, change: Change) -> None:
        gained, lost = change
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
            self._metrics.leases_held.set(0 if self._link.degraded else len(self._own.owned))

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
            if told is not None:
                known = self._fence.known(key)
                try:
                    if known >= stored and told != watch.fingerprint:
                        await self._fence.republish(ChangeEvent(key, watch.fingerprint, stored, time.time()))
                    elif known < stored and told != watch.fingerprint:
                        await self._fence.adopt(key, watch, told, stored)
                except REDIS_FAILURES as exc:
                    self._link.failed(exc)
                if not self._fence.keep(key, watch, stored):
                    continue  # given up while it was told: it keeps no fence
            watch.hint()
            logger.debug("poll ownership taken", extra={"watch": key.short_hash})
