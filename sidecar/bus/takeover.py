"""Ownership on the Redis bus: the heartbeats, who polls which key (settled from `sidecar.bus.ownership`), a
new owner's take-over from stored states, and the clean-up of dead replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.coordinator import (
    _CLEAN_UP_FAILURES,
    _reraise_cancellation,
    _text,
)
from sidecar.bus.layout import (
    REPLICAS,
    Interest,
    encode_interest,
    key_hash,
)
from sidecar.bus.publishing import Publishing
from sidecar.changes import ChangeEvent, WatchKey

__all__ = ["Takeover"]

logger = logging.getLogger(__name__)


class Takeover(Publishing):
    """Heartbeats, ownership changes and take-overs, and clean-ups of dead replicas."""

    def _settle(self, change: tuple[set[str], set[str]]) -> None:
        gained, lost = change
        for hashed in lost:
            self._metrics.lease_losses.inc()
            logger.debug("poll ownership moved away", extra={"watch": hashed[:12]})
        for hashed in gained:
            key = self._by_hash.get(hashed)
            if key is None:
                continue
            self._metrics.lease_acquisitions.inc()
            self._taking.add(key)
        if self._taking and self._take_over_task is None:
            self._take_over_task = asyncio.get_running_loop().create_task(self._take_over())
        if gained or lost:
            self._metrics.leases_held.set(0 if self.degraded else len(self._own.owned))

    async def _take_over(self) -> None:
        """A new owner starts from the state stored beside each key it gained (the last fingerprint told, its
        generation), read for all of them in one batch:
        - it heard every change told (its generation is current) but its streams saw newer content (they joined
          after a change an owner saw and died holding): told to the others now, not to its own streams;
        - it missed a change told (an older generation): its streams are told it now.
        Then it polls at once, so a change nobody saw yet is told by the next look."""
        try:
            while self._taking:
                keys = [key for key in self._taking if key in self._tracked]
                self._taking.clear()
                await self._take_over_batch(keys)
        finally:
            self._take_over_task = None

    async def _take_over_batch(self, keys: list[WatchKey]) -> None:
        states = [self._layout.state(self._layout.bucket_of(key), key_hash(key)) for key in keys]
        try:
            ops = [Op(None, args=[state, "f", "g"], command="hmget") for state in states]
            stored_states = await self._conn.batch(ops)
        except REDIS_FAILURES as exc:
            self._failed(exc)
            stored_states = [(None, None)] * len(keys)
        for key, state, (raw_told, generation) in zip(keys, states, stored_states, strict=True):
            watch = self._tracked.get(key)
            if watch is None:
                continue
            told, stored = self._stored(key, raw_told, generation)
            if told is not None:
                known = self._generation.get(key, 0)
                try:
                    if known >= stored and told != watch.fingerprint:
                        catch_up = ChangeEvent(key, watch.fingerprint, stored, time.time())
                        channel = self._layout.channel(self._layout.bucket_of(key))
                        await self._publish_fenced(catch_up, state, channel, fresh=False)
                    elif known < stored and told != watch.fingerprint:
                        self._generation[key] = stored
                        watch.adopt(told)
                        await self._local.publish(ChangeEvent(key, told, stored, time.time()))
                except REDIS_FAILURES as exc:
                    self._failed(exc)
                if self._tracked.get(key) is not watch:
                    continue  # given up while it was told: it keeps no fence (see `_publish_fenced`)
                self._generation[key] = max(self._generation.get(key, 0), stored)
            watch.hint()
            logger.debug("poll ownership taken", extra={"watch": key.short_hash})

    async def _beat(self) -> None:
        live, dead, added = await self._heartbeat(keys=[REPLICAS], args=[self._instance, self._lease_ms])
        if int(added) and self._beaten:
            # Taken for dead while we were only slow, and cleaned up: our interest is written again.
            logger.warning("this replica was taken for dead (heartbeats too late); registering its interest again")
            self._registered.clear()
            self._queue((key, True) for key in self._tracked)
        self._beaten = True
        self._settle(self._own.set_live(_text(member) for member in live))
        for member in dead:
            instance = _text(member)
            if instance not in self._cleaning:
                self._cleaning.add(instance)
                self._spawn(self._clean_up(instance))

    async def _heartbeat_loop(self) -> None:
        while True:
            _reraise_cancellation()
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self._beat()
                self._set_up(True)
                if self._unpublished and self.degraded is None:
                    await self._publish_again()
                if self._conn.sharded:
                    await self._follow_slots()
            except REDIS_FAILURES as exc:
                _reraise_cancellation()
                self._failed(exc)
            self._sweep_cache_holds()

    async def _follow_slots(self) -> None:
        """Redis Cluster: a shard subscription stays on the node it was made on, and Redis 7.0 does not tell its
        subscribers when the slot moves (a migration, a failover); messages published on the slot's new owner
        would never reach them. So each heartbeat also reads the slot map (one command): when it changed, every
        bucket is subscribed again on its owner, and each (re)confirmed bucket resyncs from its stored states."""
        slots = await self._conn.topology()
        if self._slots is None:
            self._slots = slots
        elif slots != self._slots:
            await self._conn.refresh()
            if self._channels.reopen():
                self._slots = slots

    async def _clean_up(self, instance: str, *, restarted: bool = False) -> None:
        """A replica's heartbeat ran out (or it restarted under its name): its interest leaves Redis, each
        removal told on its bucket (the others ignore a dead replica already; a restarted one is live).

        A dead one is claimed first, and only while still dead (see `scripts.CLAIM`): one that beat again since
        it was listed (it was only slow) keeps its place, its interest and its keys. It leaves the replicas
        last, so one that beats after this finds itself unlisted and writes its interest again (whatever a
        removal here met of it); a clean-up cut short (an error, this replica closing) leaves its claim to run
        out, and the next heartbeat that lists it dead tries again."""
        try:
            if not restarted and not await self._claim(keys=[REPLICAS], args=[instance, self._lease_ms]):
                return  # live again, or someone else cleans it up
            index = self._layout.interest_of(instance)
            entries = [_text(entry) for entry in await self._redis.smembers(index)]
            ops = []
            for entry in entries:
                bucket_text, _, hashed = entry.partition(":")
                bucket = int(bucket_text)
                keys = [self._layout.interest(bucket, hashed), self._layout.channel(bucket)]
                message = encode_interest(Interest(instance, hashed, False))
                ops.append(Op(self._leave, keys, [instance, *self._cmd(message)]))
            await self._conn.batch(ops)
            await self._redis.delete(index)
            self._own.forget(instance)
            await self._redis.zrem(REPLICAS, instance)
        except _CLEAN_UP_FAILURES:
            pass  # its claim (if taken) runs out: the next heartbeat that lists it dead tries again
        finally:
            self._cleaning.discard(instance)
