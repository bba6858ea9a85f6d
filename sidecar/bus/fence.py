"""The publish fence: a change is recorded as its key's stored state and published in one script, fenced by the
generation this replica last knew; a change whose publishing failed is published again when Redis answers; and a
change told while this replica was not listening is caught up from the key's stored state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.layout import encode_event, key_hash, stored_generation, text
from sidecar.bus.link import Link
from sidecar.bus.machine import Adopt, BusCommand, BusMachine, Decide, Fenced, FenceRefused, Poll, Republish, StoredRead
from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey, WatchState
from sidecar.listeners import Listeners
from sidecar.observability.metrics import Metrics

__all__ = ["STATE_TTL_MS", "Fence"]

logger = logging.getLogger(__name__)

STATE_TTL_MS = 24 * 3600 * 1000
"""The last fingerprint told outlives any handoff by far; a key nobody changes for a day starts afresh."""


class Fence:
    """The fenced publish and the catch-up, made as the bus's machine decides (it knows each tracked key's latest
    generation), and the changes not yet published."""

    def __init__(
        self, link: Link, keys: TrackedKeys, local: MemoryBus, metrics: Metrics, machine: BusMachine, decide: Decide
    ) -> None:
        self._link = link
        self._keys = keys
        self._local = local
        self._metrics = metrics
        self._machine = machine
        self._decide = decide
        self._adopters: Listeners[ChangeListener] = Listeners()
        """Told a change a watch takes as its own without its streams being told here (`on_adopt`)."""
        self._unpublished: dict[WatchKey, ChangeEvent] = {}
        """Changes told here whose publishing failed (the latest per key): published when Redis answers again,
        so the other replicas' streams are told too."""
        self._unreadable: set[str] = set()
        """Tracked keys (hashes) whose stored state could not be read: reported once, while tracked."""

    async def publish(self, event: ChangeEvent) -> None:
        """Redis first, here second: when Redis answers, it has handed the event to every interested replica's
        connection, each of which drops its cache entries on receipt before telling its streams; only then are
        this replica's streams told (invariant 17). A change is recorded as the key's state in the same script
        that publishes it, fenced by the generation this replica last knew: a change another replica already
        told is not told again, and one told on a view that missed a newer change is re-read instead.
        Redis down: local streams are told all the same. Once a command timed out (a partition: nothing answers)
        Redis is not asked, so no change waits out the socket timeout, and the change is published when Redis
        answers again; otherwise (refused, reset, a cluster's slots moving) the fence is asked as usual and
        fails at once, so a change another replica told meanwhile is not told here twice."""
        key = event.key
        if not self._link.answering:
            if not event.baseline:
                self._unpublished[key] = event
            await self._local.publish(event)
            return
        layout = self._link.layout
        bucket = layout.bucket_of(key)
        state = layout.state(bucket, key_hash(key))
        channel = layout.channel(bucket)
        try:
            if event.baseline:
                message = encode_event(event, self._link.instance)
                args = [event.fingerprint, STATE_TTL_MS, *self._link.publish_args(message)]
                await self._link.scripts.baseline(keys=[state, channel], args=args)
            else:
                await self._publish_fenced(event, state, channel)
            self._metrics.bus_messages.labels("out").inc()
        except REDIS_FAILURES as exc:
            self._metrics.bus_publish_failures.inc()
            if not event.baseline:
                self._unpublished[key] = event
            self._link.failed(exc)
        await self._local.publish(event)

    @property
    def behind(self) -> bool:
        """Changes told here wait to be published to the others."""
        return bool(self._unpublished)

    async def publish_again(self) -> None:
        """The changes whose publishing failed, to the others now (unless a newer look here superseded one)."""
        pending, self._unpublished = self._unpublished, {}
        for key, event in pending.items():
            watch = self._keys.get(key)
            if watch is not None and watch.fingerprint != event.fingerprint:
                continue  # a newer look here was told (or is pending) instead
            try:
                await self.republish(event)
            except REDIS_FAILURES as exc:
                self._unpublished.setdefault(key, event)
                self._link.failed(exc)
                return

    async def republish(self, event: ChangeEvent) -> None:
        """An older look published (again after an outage, or a new owner's catch-up): see `_publish_fenced`."""
        layout = self._link.layout
        await self._publish_fenced(event, layout.state_of(event.key), layout.channel_of(event.key), fresh=False)

    def on_adopt(self, listener: ChangeListener) -> Callable[[], None]:
        return self._adopters.add(listener)

    async def carry_out(self, commands: list[BusCommand], watch: WatchState | None) -> None:
        """The machine's word on a key `watch` watches: a change it missed is told here (its owner, the watch
        registry, hears it and has the watch take it), or only to the adopters when its streams were told
        otherwise; what it saw is published again (Redis failures raised); it polls soon."""
        for command in commands:
            match command:
                case Adopt(event, tell=True):
                    await self._local.publish(event)
                case Adopt(event, tell=False):
                    for adopter in self._adopters:
                        adopter(event)
                case Republish(event):
                    await self.republish(event)
                case Poll() if watch is not None:
                    watch.hint()

    def forget(self, key: WatchKey) -> None:
        """The key is no longer tracked: nothing of it waits to be published, and its state is reported again."""
        self._unpublished.pop(key, None)
        self._unreadable.discard(key_hash(key))

    async def resync(self, keys: list[WatchKey]) -> None:
        """A bucket's subscription was (re)confirmed: a change published while it was not may have been missed;
        its keys' stored states say."""
        ops = [Op(None, args=[self._link.layout.state_of(key), "f", "g"], command="hmget") for key in keys]
        try:
            states = await self._link.batch(ops)
        except REDIS_FAILURES as exc:
            self._link.failed(exc)
            return
        for key, (told, generation) in zip(keys, states, strict=True):
            if self._machine.known(key) is not None:
                await self.caught_up(key, *self.stored(key, told, generation))

    def stored(self, key: WatchKey, told: bytes | str | None, generation: Any) -> tuple[str | None, int]:
        """A key's stored state (its last fingerprint told, its generation) as read: (None, 0) when there is
        none, or none this version can read (garbage, or a newer version's form): the key then starts from its
        own first look, as if nobody had told it yet, and the next change told is recorded over it. Reported
        once a key (by its hash, never its URI) while it is tracked."""
        readable = stored_generation(generation)
        if readable is not None:
            return (None if told is None else text(told)), readable
        hashed = key_hash(key)
        if hashed not in self._unreadable:
            self._unreadable.add(hashed)
            logger.warning(
                "a key's stored state cannot be read; it is taken as none (the key starts from its first look)",
                extra={"watch": key.short_hash},
            )
        return None, 0

    async def caught_up(self, key: WatchKey, told: str | None, stored: int) -> None:
        """Our interest was written again (Redis came back, our subscriptions were renewed): a change told while
        we were not listening is in the key's stored state (see `BusMachine`)."""
        watch = self._keys.get(key)
        ours = None if watch is None else watch.fingerprint
        await self.carry_out(self._decide(StoredRead(key, told, stored, ours, taking_over=False)), watch)

    async def _publish_fenced(self, event: ChangeEvent, state: str, channel: str, *, fresh: bool = True) -> None:
        """Published unless another replica told this fingerprint already (its message reaches the others; here it
        finds our watch holding the fingerprint and is not told twice: we tell our streams ourselves), or the
        generation moved on since we last heard. Then a fresh look (a poll just now) is published on the stored
        generation: it is what the upstream says now. An older one (published again after an outage, or a new
        owner's catch-up) is not: our watch takes the stored fingerprint and our streams are told it (the message
        that carried it may never have reached us), and the owner's next look tells whatever is newer."""
        key = event.key
        watch = self._keys.get(key)
        base = self._machine.known(key) or 0
        for _ in range(2 if fresh else 1):
            stamped = ChangeEvent(key, event.fingerprint, base + 1, event.detected_at)
            message = encode_event(stamped, self._link.instance)
            outcome, generation, told = await self._link.scripts.publish_change(
                keys=[state, channel], args=[event.fingerprint, base, STATE_TTL_MS, *self._link.publish_args(message)]
            )
            known = self._machine.known(key)
            base = max(int(generation), base if known is None else known)
            if self._keys.still(key, watch):
                # Only a key still watched keeps its fence: one given up meanwhile starts afresh when watched
                # again (its first interest write learns the generation), instead of taking that for a change
                # it missed and telling its new streams an older fingerprint than their own first look.
                self._decide(Fenced(key, base))
            if int(outcome) != -1:
                return
        still = watch if self._keys.still(key, watch) else None
        stored = None if told is None else text(told)
        ours = None if still is None else still.fingerprint
        await self.carry_out(self._decide(FenceRefused(key, stored, int(generation), ours, fresh)), still)
