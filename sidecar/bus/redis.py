"""Replicas on Redis (one, or a Redis Cluster): change events routed by bucket, and one poller per key chosen by
rendezvous hashing.

Coordination costs what changes, not keys x replicas: a heartbeat per replica (one script), interest written
when a replica's first stream on a key arrives and removed with its last, a change recorded and published in
one script. Names and layout: `sidecar.bus.layout`; the owner rule: `sidecar.bus.ownership`. Redis lost: every
replica polls its own keys (degraded) and local streams keep getting changes; coordination resumes when Redis
answers and the bus is heard again.

`RedisCluster` is this module's; its parts, each built on the one before:
`sidecar.bus.coordinator` (shared state, degraded or not), `sidecar.bus.publishing` (the publish path, catch-up
from stored states), `sidecar.bus.takeover` (heartbeats, ownership, take-over, clean-up of dead replicas),
`sidecar.bus.interest` (this replica's interest writer, the bus's message reader); here: lifecycle, the `Bus`
and `PollCoordinator` surface, event routing for the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import orjson

from sidecar.bus.connect import REDIS_FAILURES
from sidecar.bus.coordinator import DEFAULT_LEASE_MS
from sidecar.bus.interest import InterestWriter
from sidecar.bus.layout import (
    CONTEXT_NAMING_KEY,
    HINTS_CHANNEL,
    REPLICAS,
    key_hash,
)
from sidecar.changes import ChangeListener, WatchKey, WatchKind, WatchState

__all__ = ["DEFAULT_LEASE_MS", "RedisCluster", "RedisUnavailable"]

logger = logging.getLogger(__name__)


class RedisUnavailable(Exception):
    """Redis could not be reached at start."""


class RedisCluster(InterestWriter):
    """The Redis bus (Bus protocol), the poll coordinator (PollCoordinator) and event routing for the cache."""

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

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        return self._local.subscribe(listener)

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
