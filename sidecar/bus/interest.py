"""This replica's interest in Redis: the one writer that adds and removes it, in the order its streams came and
went, and what a write reads back (who else is interested, the key's stored state) handed on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from sidecar.backoff import Backoff
from sidecar.bus.channels import Channels
from sidecar.bus.connect import REDIS_FAILURES, Op, stop_if_cancelled
from sidecar.bus.fence import Fence
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.layout import Interest, encode_interest, key_hash, text
from sidecar.bus.link import Link
from sidecar.bus.machine import BusMachine, Decide, OursQueued, OursWritten
from sidecar.changes import WatchKey

__all__ = ["InterestWriter"]

logger = logging.getLogger(__name__)

_HEARD_WITHIN_S = 2.0
_RETRY_S = 0.5
"""A write Redis failed (an outage, which the link reports) or could not yet confirm is tried again this soon."""
_BUG_BACKOFF = Backoff(1.0, 30.0)
"""A write that failed on a bug may fail so on every try: from a second to half a minute apart."""


class _NotHeard(Exception):
    """A bucket's subscription was not confirmed in time: our interest in its keys waits (and is retried)."""


_WRITE_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, _NotHeard)


def _pairs(items: list[Any]) -> Iterable[tuple[Any, Any]]:
    it = iter(items)
    return zip(it, it, strict=True)


class InterestWriter:
    """The one writer of this replica's interest (`run`), fed by `join` and `leave`. Interest messages heard while
    ours in a key is being written are held back by the bus's machine, which applies them over what the write reads
    back (they are newer)."""

    def __init__(
        self, link: Link, channels: Channels, keys: TrackedKeys, fence: Fence, machine: BusMachine, decide: Decide
    ) -> None:
        self._link = link
        self._channels = channels
        self._keys = keys
        self._fence = fence
        self._machine = machine
        self._decide = decide
        self._registered: set[WatchKey] = set()
        """Keys whose interest of ours is written in Redis."""
        self._pending: dict[WatchKey, bool] = {}
        self._wake = asyncio.Event()
        link.on_switch(self._switched)

    def join(self, key: WatchKey) -> None:
        self._queue([(key, True)])

    def leave(self, key: WatchKey) -> None:
        self._queue([(key, False)])

    def write_all(self) -> None:
        """Redis may have come back empty, or taken us for dead: every interest is written again (and the others'
        read afresh)."""
        self._registered.clear()
        self._queue((key, True) for key in self._keys)

    def _switched(self, up: bool) -> None:
        if up:
            self.write_all()

    def written(self, key: WatchKey) -> bool:
        return key in self._registered

    async def remove_all(self) -> None:
        """Our interest leaves Redis, each removal told on its bucket (closing)."""
        await self._write([], list(self._registered))

    def _queue(self, ops: Iterable[tuple[WatchKey, bool]]) -> None:
        for key, present in ops:
            self._pending[key] = present
            if present:
                self._decide(OursQueued(key_hash(key)))
        self._wake.set()

    async def run(self) -> None:
        """The one writer of our interest, so writes for a key happen in the order its streams came and went."""
        failures = 0
        while True:
            stop_if_cancelled()
            await self._wake.wait()
            self._wake.clear()
            ops, self._pending = self._pending, {}
            joins = [key for key, present in ops.items() if present and key in self._keys]
            joins = [key for key in joins if key not in self._registered]
            leaves = [key for key, present in ops.items() if not present and key in self._registered]
            leaves = [key for key in leaves if key not in self._keys]
            try:
                await self._write(joins, leaves)
                failures = 0
                continue
            except _WRITE_FAILURES as exc:
                stop_if_cancelled()
                if not isinstance(exc, _NotHeard):  # a slow confirmation is no outage: try again
                    self._link.failed(exc)
                delay = _RETRY_S
            except Exception:  # the one writer must outlive a bug or a state it cannot read: others rely on it
                stop_if_cancelled()
                logger.exception("writing this replica's interest failed; retrying")
                # Backing off, as the same failure may come back on every try: bounded, never a hot loop.
                failures += 1
                delay = _BUG_BACKOFF.delay(failures)
                # A join written but not yet settled is written again, not skipped as registered: else its
                # interest messages would be held back for it for ever, and its owner never change.
                self._registered.difference_update(key for key in joins if self._machine.joining(key_hash(key)))
            for key in leaves:
                self._pending.setdefault(key, False)
            await asyncio.sleep(delay)
            if self._link.degraded is None:
                self._queue((key, True) for key in joins)

    async def _write(self, joins: list[WatchKey], leaves: list[WatchKey]) -> None:
        if not joins and not leaves:
            return
        layout, instance, scripts = self._link.layout, self._link.instance, self._link.scripts
        buckets = {layout.bucket_of(key) for key in joins}
        # Heard before written: from then on, every interest message and change of the bucket reaches us.
        heard = await asyncio.gather(*(self._channels.heard(bucket, _HEARD_WITHIN_S) for bucket in buckets))
        if not all(heard):
            raise _NotHeard
        index = layout.interest_of(instance)
        ops: list[Op] = []
        for key in joins:
            bucket, hashed = layout.bucket_of(key), key_hash(key)
            message = encode_interest(Interest(instance, hashed, True))
            keys = [layout.interest(bucket, hashed), layout.state(bucket, hashed), layout.channel(bucket)]
            ops.append(Op(scripts.join, keys, [instance, *self._link.publish_args(message)]))
            ops.append(Op(None, args=[index, f"{bucket}:{hashed}"], command="sadd"))
        for key in leaves:
            bucket, hashed = layout.bucket_of(key), key_hash(key)
            message = encode_interest(Interest(instance, hashed, False))
            keys = [layout.interest(bucket, hashed), layout.channel(bucket)]
            ops.append(Op(scripts.leave, keys, [instance, *self._link.publish_args(message)]))
            ops.append(Op(None, args=[index, f"{bucket}:{hashed}"], command="srem"))
        results = await self._link.batch(ops)
        for key, (joined, _) in zip(joins, _pairs(results[: 2 * len(joins)]), strict=True):
            self._registered.add(key)
            members, told, generation = joined
            if key not in self._keys:
                self._pending.setdefault(key, False)  # gone while we wrote: take it back out
                self._wake.set()
                continue
            await self._fence.caught_up(key, *self._fence.stored(key, told, generation))
            if key not in self._keys:
                # Given up while its missed change was told (that yields): the leave is queued, and owning it
                # now would keep it polled, and counted as held, for nobody.
                continue
            self._decide(OursWritten(key_hash(key), frozenset(text(member) for member in members)))
        for key in leaves:
            self._registered.discard(key)
