"""The publish path of the Redis bus: a change recorded as its key's stored state and published in one script,
fenced by generation, and the catch-up from stored states after a resync.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.coordinator import (
    STATE_TTL_MS,
    Coordinator,
    _generation,
    _text,
)
from sidecar.bus.layout import (
    encode_event,
    key_hash,
)
from sidecar.changes import ChangeEvent, WatchKey

__all__ = ["Publishing"]

logger = logging.getLogger(__name__)


class Publishing(Coordinator):
    """Publishing changes (Redis first, local streams second) and catching up from stored states."""

    async def publish(self, event: ChangeEvent) -> None:
        """Redis first, here second: when Redis answers, it has handed the event to every interested replica's
        connection, each of which drops its cache entries on receipt before telling its streams; only then are
        this replica's streams told (invariant 17). A change is recorded as the key's state in the same script
        that publishes it, fenced by the generation this replica last knew: a change another replica already
        told is not told again, and one told on a view that missed a newer change is re-read instead.
        Redis down: local streams are told all the same."""
        key = event.key
        bucket = self._layout.bucket_of(key)
        state = self._layout.state(bucket, key_hash(key))
        channel = self._layout.channel(bucket)
        try:
            if event.baseline:
                message = encode_event(event, self._instance)
                await self._baseline(keys=[state, channel], args=[event.fingerprint, STATE_TTL_MS, *self._cmd(message)])
            else:
                await self._publish_fenced(event, state, channel)
            self._metrics.bus_messages.labels("out").inc()
        except REDIS_FAILURES as exc:
            self._metrics.bus_publish_failures.inc()
            if not event.baseline:
                self._unpublished[key] = event
            self._failed(exc)
        await self._local.publish(event)

    async def _publish_again(self) -> None:
        """The changes whose publishing failed, to the others now (unless a newer look here superseded one)."""
        pending, self._unpublished = self._unpublished, {}
        for key, event in pending.items():
            watch = self._tracked.get(key)
            if watch is not None and watch.fingerprint != event.fingerprint:
                continue  # a newer look here was told (or is pending) instead
            channel = self._layout.channel(self._layout.bucket_of(key))
            try:
                await self._publish_fenced(event, self._state_of(key), channel, fresh=False)
            except REDIS_FAILURES as exc:
                self._unpublished.setdefault(key, event)
                self._failed(exc)
                return

    def _heard_again(self, bucket: int) -> None:
        """A bucket's subscription is (re)confirmed: after a reconnection or a slot migration, a change published
        while it was not may have been missed; its keys' stored states say."""
        keys = [key for key in self._bucket_keys.get(bucket, ()) if key in self._registered]
        if keys:
            self._spawn(self._resync(keys))

    async def _resync(self, keys: list[WatchKey]) -> None:
        ops = [Op(None, args=[self._state_of(key), "f", "g"], command="hmget") for key in keys]
        try:
            states = await self._conn.batch(ops)
        except REDIS_FAILURES as exc:
            self._failed(exc)
            return
        for key, (told, generation) in zip(keys, states, strict=True):
            if key in self._generation:
                await self._caught_up(key, *self._stored(key, told, generation))

    def _stored(self, key: WatchKey, told: bytes | str | None, generation: Any) -> tuple[str | None, int]:
        """A key's stored state (its last fingerprint told, its generation) as read: (None, 0) when there is
        none, or none this version can read (garbage, or a newer version's form): the key then starts from its
        own first look, as if nobody had told it yet, and the next change told is recorded over it. Reported
        once a key (by its hash, never its URI) while it is tracked."""
        stored = _generation(generation)
        if stored is not None:
            return (None if told is None else _text(told)), stored
        hashed = key_hash(key)
        if hashed not in self._unreadable:
            self._unreadable.add(hashed)
            logger.warning(
                "a key's stored state cannot be read; it is taken as none (the key starts from its first look)",
                extra={"watch": key.short_hash},
            )
        return None, 0

    async def _caught_up(self, key: WatchKey, told: str | None, stored: int) -> None:
        """Our interest was written again (Redis came back, our subscriptions were renewed): a change told while
        we were not listening is in the key's stored state; our streams are told it now. (A first write only
        learns the generation: the watch's own first look is newer than anything stored.)"""
        known = self._generation.get(key)
        self._generation[key] = max(stored, known or 0)
        watch = self._tracked.get(key)
        if known is None or stored <= known or told is None or watch is None or told == watch.fingerprint:
            return
        watch.adopt(told)
        await self._local.publish(ChangeEvent(key, told, stored, time.time()))

    async def _publish_fenced(self, event: ChangeEvent, state: str, channel: str, *, fresh: bool = True) -> None:
        """Published unless another replica told this fingerprint already (its message reaches the others; here it
        finds our watch holding the fingerprint and is not told twice: we tell our streams ourselves), or the
        generation moved on since we last heard. Then a fresh look (a poll just now) is published on the stored
        generation: it is what the upstream says now. An older one (published again after an outage, or a new
        owner's catch-up) is not: our watch takes the stored fingerprint and our streams are told it (the message
        that carried it may never have reached us), and the owner's next look tells whatever is newer."""
        key = event.key
        watch = self._tracked.get(key)
        base = self._generation.get(key, 0)
        for _ in range(2 if fresh else 1):
            stamped = ChangeEvent(key, event.fingerprint, base + 1, event.detected_at)
            message = encode_event(stamped, self._instance)
            outcome, generation, told = await self._publish_change(
                keys=[state, channel], args=[event.fingerprint, base, STATE_TTL_MS, *self._cmd(message)]
            )
            base = max(int(generation), self._generation.get(key, base))
            if watch is not None and self._tracked.get(key) is watch:
                # Only a key still watched keeps its fence: one given up meanwhile starts afresh when watched
                # again (its first interest write learns the generation), instead of taking that for a change
                # it missed and telling its new streams an older fingerprint than their own first look.
                self._generation[key] = base
            if int(outcome) != -1:
                return
        if watch is None or self._tracked.get(key) is not watch or told is None or _text(told) == watch.fingerprint:
            return
        watch.adopt(_text(told))
        if not fresh:
            await self._local.publish(ChangeEvent(key, _text(told), int(generation), time.time()))
