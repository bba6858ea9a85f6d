"""Replicas on Redis (one, or a Redis Cluster): change events routed by bucket, and one poller per key chosen by
rendezvous hashing.

Coordination costs what changes, not keys x replicas: a heartbeat per replica (one script), interest written
when a replica's first stream on a key arrives and removed with its last, a change recorded and published in
one script. Names and layout: `sidecar.bus.layout`; the owner rule: `sidecar.bus.ownership`. Redis lost: every
replica polls its own keys (degraded) and local streams keep getting changes; coordination resumes when Redis
answers and the bus is heard again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import orjson

from sidecar.bus import scripts
from sidecar.bus.channels import Channels
from sidecar.bus.connect import REDIS_FAILURES, SLOTS_MOVING, Connection, Op, connect
from sidecar.bus.layout import (
    CONTEXT_NAMING_KEY,
    DEFAULT_BUCKETS,
    HINTS_CHANNEL,
    REPLICAS,
    Interest,
    Layout,
    decode,
    encode_event,
    encode_interest,
    key_hash,
)
from sidecar.bus.memory import MemoryBus
from sidecar.bus.ownership import Ownership
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey, WatchKind, WatchState
from sidecar.observability.metrics import Metrics

__all__ = ["DEFAULT_LEASE_MS", "RedisCluster", "RedisUnavailable"]

logger = logging.getLogger(__name__)

STATE_TTL_MS = 24 * 3600 * 1000
"""The last fingerprint told outlives any handoff by far; a key nobody changes for a day starts afresh."""
DEFAULT_LEASE_MS = 5_000
_HEARD_WITHIN_S = 2.0
_RETRY_S = 0.5
_RETRY_MAX_S = 30.0


class RedisUnavailable(Exception):
    """Redis could not be reached at start."""


class _NotHeard(Exception):
    """A bucket's subscription was not confirmed in time: our interest in its keys waits (and is retried)."""


class RedisCluster:
    """The Redis bus (Bus protocol), the poll coordinator (PollCoordinator) and event routing for the cache."""

    def __init__(
        self,
        url: str,
        *,
        instance: str,
        metrics: Metrics,
        lease_ms: int = DEFAULT_LEASE_MS,
        fallback: bool = False,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        self._conn: Connection = connect(url)
        self._redis: Any = self._conn.client
        self._publish_command = "SPUBLISH" if self._conn.sharded else "PUBLISH"
        self._layout = Layout(buckets)
        self._heartbeat = self._redis.register_script(scripts.HEARTBEAT)
        self._claim = self._redis.register_script(scripts.CLAIM)
        self._join = self._redis.register_script(scripts.JOIN)
        self._leave = self._redis.register_script(scripts.LEAVE)
        self._publish_change = self._redis.register_script(scripts.PUBLISH_CHANGE)
        self._baseline = self._redis.register_script(scripts.BASELINE)
        # The member's name among the replicas: unique per process (INSTANCE_ID), so per cluster member.
        self._instance = instance
        self._metrics = metrics
        self._lease_ms = lease_ms
        self._fallback = fallback
        self._local = MemoryBus()
        self._own = Ownership(self._instance)
        self._tracked: dict[WatchKey, WatchState] = {}
        self._by_hash: dict[str, WatchKey] = {}
        self._generation: dict[WatchKey, int] = {}
        """The latest cluster generation of each tracked key this replica knows of (the publish fence)."""
        self._registered: set[WatchKey] = set()
        """Keys whose interest of ours is written in Redis."""
        self._pending: dict[WatchKey, bool] = {}
        self._wake = asyncio.Event()
        self._cache_holds: dict[int, float] = {}
        """Bucket -> until when (monotonic) the cache holds an entry of it, so keeps hearing its changes."""
        self._joining: set[str] = set()
        """Keys (hashes) whose interest of ours is queued or being written: their interest messages wait in
        `_early`, as the members the write reads back replace this replica's view of who is interested."""
        self._early: dict[str, dict[str, bool]] = {}
        """Interest messages heard for keys whose interest of ours is still being written (hash -> instance ->
        present): newer than the members that write reads back, so they win over them."""
        self._bucket_keys: dict[int, set[WatchKey]] = {}
        self._unreadable: set[str] = set()
        """Tracked keys (hashes) whose stored state could not be read: reported once, while tracked."""
        self._unpublished: dict[WatchKey, ChangeEvent] = {}
        """Changes told here whose publishing failed (the latest per key): published when Redis answers again,
        so the other replicas' streams are told too."""
        self._cleaning: set[str] = set()
        self._taking: set[WatchKey] = set()
        """Keys this replica gained and has not yet taken over (see `_take_over`)."""
        self._take_over_task: asyncio.Task[None] | None = None
        self._slots: tuple[tuple[int, int, str], ...] | None = None
        """The cluster's slot map as of the last (re)subscription (Redis Cluster only)."""
        self._beaten = False
        self._revalidate_listeners: list[Callable[[frozenset[str]], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        """One-off tasks (resyncs, clean-ups of dead replicas): held here, so none is collected while pending,
        and each one's failure is logged when it ends; cancelled on close."""
        self._channels = Channels(
            self._conn.pubsub,
            self._layout,
            sharded=self._conn.sharded,
            on_message=self._dispatch,
            on_connected=lambda: self._set_up(True),
            on_confirmed=self._heard_again,
            on_lost=lambda reason: self._set_up(False, reason),
        )
        self.degraded: str | None = None
        """Why coordination is off (Redis unreachable), or None while it works."""

    @property
    def instance(self) -> str:
        return self._instance

    @property
    def owned_count(self) -> int:
        """The keys this replica polls for the cluster (`mcp_sidecar_leases_held`)."""
        return len(self._own.owned)

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> bytes:
        """Connect and return the shared key that names contexts; raises RedisUnavailable unless falling back."""
        shared = None
        try:
            await self._conn.initialize()
            await self._redis.set(CONTEXT_NAMING_KEY, secrets.token_hex(32), nx=True)
            shared = await self._redis.get(CONTEXT_NAMING_KEY)
            # A process restarted under the same name (MCP_SIDECAR_INSTANCE) forgets its predecessor's interest
            # first; then it is live before any interest of ours is read by others.
            await self._clean_up(self._instance, restarted=True)
            await self._beat()
        except REDIS_FAILURES as exc:
            if not self._fallback:
                raise RedisUnavailable(f"cannot reach Redis at bus.redis_url: {exc}") from exc
            self._set_up(False, f"redis unreachable at start: {exc}")
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._channels.run()),
            loop.create_task(self._heartbeat_loop()),
            loop.create_task(self._interest_loop()),
        ]
        if shared is None:
            return secrets.token_bytes(32)
        return shared.encode() if isinstance(shared, str) else bytes(shared)

    async def aclose(self) -> None:
        """Hand over first: our interest leaves Redis and the others hear it (and that we left), so each key we
        polled gets its next owner now rather than when our heartbeat runs out."""
        tasks = [*self._tasks, *self._background]
        if self._take_over_task is not None:
            tasks.append(self._take_over_task)
        for task in tasks:
            task.cancel()
        # A loop that died of a bug is reported, and must not keep our interest in Redis until our heartbeat
        # runs out: the handover happens whatever the loops ended with.
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                logger.error("a redis coordination loop had failed", exc_info=outcome)
        try:
            if self.degraded is None:
                with contextlib.suppress(*REDIS_FAILURES):
                    await self._write_interest([], list(self._registered))
                    await self._redis.zrem(REPLICAS, self._instance)
                    await self._redis.delete(self._layout.interest_of(self._instance))
                    await self._redis.publish(HINTS_CHANNEL, orjson.dumps({"o": self._instance, "left": True}))
        finally:
            self._metrics.leases_held.set(0)
            await self._channels.aclose()
            await self._conn.aclose()

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, SLOTS_MOVING):
            # Slots moved: a shard subscription may still be on a node that no longer owns its slot (a change
            # published meanwhile would not reach us). Subscribing afresh, on the owners, and resyncing each
            # confirmed bucket's keys from their stored states closes that gap.
            self._channels.reopen()
        self._set_up(False, str(exc))

    def _set_up(self, up: bool, reason: str | None = None) -> None:
        self._metrics.redis_up.set(1 if up else 0)
        if up and not self._channels.connected:
            # Coordination resumes only once we hear the bus again: an owner's change published before we
            # resubscribe would reach nobody here, and we would no longer be polling for ourselves.
            self._channels.retry_now()
            return
        if up and self.degraded is not None:
            logger.info("redis reachable again; coordinated polling resumes")
            self.degraded = None
            # Redis may have come back empty: write every interest again (and read the others' afresh).
            self._registered.clear()
            self._queue((key, True) for key in self._tracked)
            self._metrics.leases_held.set(len(self._own.owned))
        elif not up and self.degraded is None:
            logger.warning("redis unreachable; polling locally until it returns", extra={"reason": reason})
            self.degraded = reason or "redis unreachable"
            self._metrics.leases_held.set(0)

    # -- bus ------------------------------------------------------------------------------------------------

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        return self._local.subscribe(listener)

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

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a redis coordination task failed", exc_info=task.exception())

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

    def _state_of(self, key: WatchKey) -> str:
        return self._layout.state(self._layout.bucket_of(key), key_hash(key))

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

    def _cmd(self, message: bytes) -> tuple[str, bytes]:
        return self._publish_command, message

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

    # -- event routing for the cache ---------------------------------------------------------------------------

    def hold(self, kind: WatchKind, uri: str | None, since: float, until: float) -> bool:
        """The cache keeps an entry of (kind, uri) until `until` (monotonic): keep hearing its bucket till then.
        True when the bucket was heard since before `since` (when the entry's request started), so a change
        after that request is heard here and drops the entry; False: do not keep it (heard from now on)."""
        bucket = self._layout.bucket(kind, uri)
        held = self._cache_holds.get(bucket)
        if held is None:
            self._channels.hold(bucket)
        self._cache_holds[bucket] = max(until, held or until)
        confirmed = self._channels.confirmed_at(bucket)
        return self.degraded is None and confirmed is not None and confirmed <= since

    def _sweep_cache_holds(self) -> None:
        now = time.monotonic()
        for bucket, until in list(self._cache_holds.items()):
            if until < now:
                del self._cache_holds[bucket]
                self._channels.release(bucket)

    # -- coordination ---------------------------------------------------------------------------------------

    def may_poll(self, key: WatchKey) -> bool:
        return self.degraded is not None or self._own.owns(key_hash(key))

    def track(self, watch: WatchState) -> None:
        key = watch.key
        if key in self._tracked:
            return
        self._tracked[key] = watch
        self._by_hash[key_hash(key)] = key
        self._bucket_keys.setdefault(self._layout.bucket_of(key), set()).add(key)
        self._channels.hold(self._layout.bucket_of(key))
        self._queue([(key, True)])

    def untrack(self, key: WatchKey) -> None:
        if self._tracked.pop(key, None) is None:
            return
        hashed = key_hash(key)
        self._by_hash.pop(hashed, None)
        self._early.pop(hashed, None)
        self._unreadable.discard(hashed)
        self._unpublished.pop(key, None)
        same_bucket = self._bucket_keys.get(self._layout.bucket_of(key))
        if same_bucket is not None:
            same_bucket.discard(key)
            if not same_bucket:
                del self._bucket_keys[self._layout.bucket_of(key)]
        self._generation.pop(key, None)
        _, lost = self._own.untrack(hashed)
        if lost:
            self._metrics.leases_held.set(len(self._own.owned))
        self._channels.release(self._layout.bucket_of(key))
        self._queue([(key, False)])

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        with contextlib.suppress(*REDIS_FAILURES):
            await self._redis.publish(HINTS_CHANNEL, orjson.dumps({"o": self._instance, "c": sorted(contexts)}))

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._revalidate_listeners.append(listener)

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

    # -- heartbeats ---------------------------------------------------------------------------------------------

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

        It is first taken out of the replicas, and only while still dead: one that beat again since it was
        listed (it was only slow) keeps its place, its interest and its keys; and one that beats after this
        finds itself unlisted, so writes its interest again (whatever a removal here met of it). A clean-up cut
        short lists it again as it was, so the next heartbeat that lists it tries again."""
        try:
            claimed = await self._claim(keys=[REPLICAS], args=[instance, self._lease_ms, "1" if restarted else "0"])
        except _CLEAN_UP_FAILURES:
            self._cleaning.discard(instance)
            return  # the next heartbeat that lists it tries again
        if claimed is None:
            self._cleaning.discard(instance)
            return
        try:
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
            if await self._redis.zscore(REPLICAS, instance) is not None:
                # It beat while its interest was being removed (so writes it again): a removal here may have met
                # what it wrote. Unlisted once more, its next beat writes all of it again, after this.
                await self._redis.zrem(REPLICAS, instance)
        except _CLEAN_UP_FAILURES:
            with contextlib.suppress(*_CLEAN_UP_FAILURES):
                # Listed again as dead (unless it beat meanwhile): the next heartbeat that lists it tries again.
                await self._redis.zadd(REPLICAS, {instance: float(_text(claimed))}, nx=True)
        finally:
            self._cleaning.discard(instance)

    # -- interest ----------------------------------------------------------------------------------------

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


_CLEAN_UP_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, ValueError)
_WRITE_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, _NotHeard)


def _reraise_cancellation() -> None:
    # The redis client may turn a cancellation in the middle of a command into a connection error, or absorb it:
    # a loop must not go on after its own task was cancelled (shutdown would wait for it for ever).
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _pairs(items: list[Any]) -> Iterable[tuple[Any, Any]]:
    it = iter(items)
    return zip(it, it, strict=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _generation(raw: Any) -> int | None:
    """A stored generation (absent: 0), or None when it is not a whole number from 0 on (as the scripts read it)."""
    if raw is None:
        return 0
    try:
        generation = int(_text(raw)) if isinstance(raw, bytes | str) else int(raw)
    except (TypeError, ValueError):
        return None
    return generation if 0 <= generation < 2**53 else None
