"""This replica's interest in Redis: the one writer that adds and removes it, and the reader of the bus's
messages (interest of the others, changes, hints).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import orjson

from sidecar.bus.connect import Op
from sidecar.bus.coordinator import (
    _HEARD_WITHIN_S,
    _RETRY_MAX_S,
    _RETRY_S,
    _WRITE_FAILURES,
    _NotHeard,
    _pairs,
    _reraise_cancellation,
    _text,
)
from sidecar.bus.layout import (
    HINTS_CHANNEL,
    Interest,
    decode,
    encode_interest,
    key_hash,
)
from sidecar.bus.takeover import Takeover
from sidecar.changes import WatchKey

__all__ = ["InterestWriter"]

logger = logging.getLogger(__name__)


class InterestWriter(Takeover):
    """The interest writer and the bus's message reader."""

    def _queue(self, ops: Iterable[tuple[WatchKey, bool]]) -> None:
        for key, present in ops:
            self._pending[key] = present
            if present:
                self._joining.add(key_hash(key))
            else:
                self._joining.discard(key_hash(key))
        self._wake.set()

    async def _interest_loop(self) -> None:
        """The one writer of our interest, so writes for a key happen in the order its streams came and went."""
        failures = 0
        while True:
            _reraise_cancellation()
            await self._wake.wait()
            self._wake.clear()
            ops, self._pending = self._pending, {}
            joins = [key for key, present in ops.items() if present and key in self._tracked]
            joins = [key for key in joins if key not in self._registered]
            leaves = [key for key, present in ops.items() if not present and key in self._registered]
            leaves = [key for key in leaves if key not in self._tracked]
            try:
                await self._write_interest(joins, leaves)
                failures = 0
                continue
            except _WRITE_FAILURES as exc:
                _reraise_cancellation()
                if not isinstance(exc, _NotHeard):  # a slow confirmation is no outage: try again
                    self._failed(exc)
                delay = _RETRY_S
            except Exception:  # the one writer must outlive a bug or a state it cannot read: others rely on it
                _reraise_cancellation()
                logger.exception("writing this replica's interest failed; retrying")
                # Backing off, as the same failure may come back on every try: bounded, never a hot loop.
                failures += 1
                delay = min(_RETRY_S * 2**failures, _RETRY_MAX_S)
                # A join written but not yet settled is written again, not skipped as registered: else its
                # interest messages would wait for it (in `_early`) for ever, and its owner never change.
                self._registered.difference_update(key for key in joins if key_hash(key) in self._joining)
            for key in leaves:
                self._pending.setdefault(key, False)
            await asyncio.sleep(delay)
            if self.degraded is None:
                self._queue((key, True) for key in joins)

    async def _write_interest(self, joins: list[WatchKey], leaves: list[WatchKey]) -> None:
        if not joins and not leaves:
            return
        buckets = {self._layout.bucket_of(key) for key in joins}
        # Heard before written: from then on, every interest message and change of the bucket reaches us.
        heard = await asyncio.gather(*(self._channels.heard(bucket, _HEARD_WITHIN_S) for bucket in buckets))
        if not all(heard):
            raise _NotHeard
        index = self._layout.interest_of(self._instance)
        ops: list[Op] = []
        for key in joins:
            bucket, hashed = self._layout.bucket_of(key), key_hash(key)
            message = encode_interest(Interest(self._instance, hashed, True))
            keys = [self._layout.interest(bucket, hashed), self._layout.state(bucket, hashed)]
            ops.append(Op(self._join, [*keys, self._layout.channel(bucket)], [self._instance, *self._cmd(message)]))
            ops.append(Op(None, args=[index, f"{bucket}:{hashed}"], command="sadd"))
        for key in leaves:
            bucket, hashed = self._layout.bucket_of(key), key_hash(key)
            message = encode_interest(Interest(self._instance, hashed, False))
            keys = [self._layout.interest(bucket, hashed), self._layout.channel(bucket)]
            ops.append(Op(self._leave, keys, [self._instance, *self._cmd(message)]))
            ops.append(Op(None, args=[index, f"{bucket}:{hashed}"], command="srem"))
        results = await self._conn.batch(ops)
        for key, (joined, _) in zip(joins, _pairs(results[: 2 * len(joins)]), strict=True):
            self._registered.add(key)
            members, told, generation = joined
            if key not in self._tracked:
                self._pending.setdefault(key, False)  # gone while we wrote: take it back out
                self._wake.set()
                continue
            await self._caught_up(key, *self._stored(key, told, generation))
            if key not in self._tracked:
                # Given up while its missed change was told (that yields): the leave is queued, and owning it
                # now would keep it polled, and counted as held, for nobody.
                continue
            hashed = key_hash(key)
            self._joining.discard(hashed)
            interested = {_text(member) for member in members}
            for instance, present in self._early.pop(hashed, {}).items():
                if present:
                    interested.add(instance)
                else:
                    interested.discard(instance)
            self._settle(self._own.track(hashed, interested))
        for key in leaves:
            self._registered.discard(key)

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        if channel in (HINTS_CHANNEL.encode(), HINTS_CHANNEL):
            self._hint_message(data)
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
            if message.hashed in self._joining:
                # Ours is being written: this is newer than what our write will read back; applied after it.
                self._early.setdefault(message.hashed, {})[origin] = message.present
                return
            self._settle(self._own.interest(message.hashed, origin, message.present))
            return
        event = message
        if not event.baseline and event.key in self._tracked:
            self._generation[event.key] = max(event.generation, self._generation.get(event.key, 0))
            if self._tracked[event.key].fingerprint == event.fingerprint:
                return  # what our streams already have (their watch saw it first): not news here
        self._metrics.bus_messages.labels("in").inc()
        # Synchronously, as it is read: the cache drops what it made stale before this replica serves another
        # request (the cache listens before the streams do).
        self._local.deliver(event)

    def _hint_message(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
            origin = str(message["o"])
            if origin == self._instance:
                return
            if message.get("left"):
                self._settle(self._own.set_live(self._own.live - {origin}))
                return
            contexts = frozenset(message["c"])
        except (ValueError, KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        for listener in self._revalidate_listeners:
            listener(contexts)
