"""Replicas on Redis: change events on pub/sub, and one poller per key across the cluster through leases.

Keys (all under `mcp-sidecar:`): `lease:<key hash>` holds the owning instance (SET NX PX, renewed at a
third of its life); `state:<key hash>` holds the last fingerprint and generation the cluster saw;
`partition-key` is the shared secret that names authorization contexts, so every replica computes the
same partition for the same credential. Redis lost: every replica polls its own keys (degraded) and
local streams keep getting changes; coordination resumes when Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey, WatchState
from sidecar.observability.metrics import Metrics

__all__ = ["RedisCluster", "RedisUnavailable"]

logger = logging.getLogger(__name__)

PREFIX = "mcp-sidecar:"
EVENTS_CHANNEL = PREFIX + "events"
HINTS_CHANNEL = PREFIX + "revalidate"
STATE_TTL_MS = 24 * 3600 * 1000
"""The last fingerprint outlives every lease by far; a key nobody watches for a day starts afresh."""
DEFAULT_LEASE_MS = 5_000
_RECONNECT_S = (0.2, 5.0)
_SOCKET_TIMEOUT_S = 2.0

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end
"""
_PUBLISH_CHANGE = """
redis.call('HSET', KEYS[1], 'f', ARGV[1])
local generation = redis.call('HINCRBY', KEYS[1], 'g', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return generation
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end
"""


class RedisUnavailable(Exception):
    """Redis could not be reached at start."""


def _key_hash(key: WatchKey) -> str:
    return hashlib.sha256(f"{key.kind}\0{key.uri or ''}\0{key.partition}".encode()).hexdigest()[:32]


def _encode(event: ChangeEvent, origin: str) -> bytes:
    key = event.key
    return orjson.dumps(
        {
            "o": origin,
            "k": key.kind,
            "u": key.uri,
            "p": key.partition,
            "f": event.fingerprint,
            "g": event.generation,
            "t": event.detected_at,
            "b": event.baseline,
        }
    )


def _decode(raw: bytes) -> tuple[str, ChangeEvent]:
    data = orjson.loads(raw)
    key = WatchKey(data["k"], data["u"], data["p"])
    event = ChangeEvent(key, data["f"], int(data["g"]), float(data["t"]), baseline=bool(data.get("b", False)))
    return data["o"], event


class RedisCluster:
    """The Redis bus (Bus protocol) and the lease coordinator (PollCoordinator protocol) in one client."""

    def __init__(
        self, url: str, *, instance: str, metrics: Metrics, lease_ms: int = DEFAULT_LEASE_MS, fallback: bool = False
    ) -> None:
        self._redis = aioredis.from_url(url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S)
        self._publish_change = self._redis.register_script(_PUBLISH_CHANGE)
        # Unique per cluster member even when two share a process (tests) and so an INSTANCE_ID.
        self._instance = f"{instance}-{secrets.token_hex(4)}"
        self._metrics = metrics
        self._lease_ms = lease_ms
        self._fallback = fallback
        self._local = MemoryBus()
        self._tracked: dict[WatchKey, WatchState] = {}
        self._owned: set[WatchKey] = set()
        self._revalidate_listeners: list[Callable[[frozenset[str]], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = False
        self._resubscribe_now = asyncio.Event()
        self.degraded: str | None = None
        """Why coordination is off (Redis unreachable), or None while it works."""

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> bytes:
        """Connect and return the shared partition key; raises RedisUnavailable unless falling back."""
        try:
            await self._redis.set(PREFIX + "partition-key", secrets.token_hex(32), nx=True)
            shared = await self._redis.get(PREFIX + "partition-key")
            self._set_up(True)
        except (RedisError, OSError) as exc:
            if not self._fallback:
                raise RedisUnavailable(f"cannot reach Redis at bus.redis_url: {exc}") from exc
            self._set_up(False, f"redis unreachable at start: {exc}")
            shared = None
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_loop()), loop.create_task(self._lease_loop())]
        if shared is None:
            return secrets.token_bytes(32)
        return shared.encode() if isinstance(shared, str) else bytes(shared)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owned and self.degraded is None:
            with contextlib.suppress(RedisError, OSError):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key in self._owned:
                        pipe.eval(_RELEASE, 1, PREFIX + "lease:" + _key_hash(key), self._instance)
                    await pipe.execute()
        self._metrics.leases_held.set(0)
        await self._redis.aclose()

    def _set_up(self, up: bool, reason: str | None = None) -> None:
        self._metrics.redis_up.set(1 if up else 0)
        if up and not self._subscribed:
            # Coordination resumes only once we hear the bus again: an owner's change published before we
            # resubscribe would reach nobody here, and we would no longer be polling for ourselves.
            self._resubscribe_now.set()
            return
        if up and self.degraded is not None:
            logger.info("redis reachable again; coordinated polling resumes")
            self.degraded = None
        elif not up and self.degraded is None:
            logger.warning("redis unreachable; polling locally until it returns", extra={"reason": reason})
            self.degraded = reason or "redis unreachable"
            self._owned.clear()
            self._metrics.leases_held.set(0)

    # -- bus ------------------------------------------------------------------------------------------------

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        return self._local.subscribe(listener)

    async def publish(self, event: ChangeEvent) -> None:
        """Redis first, here second: when Redis answers, it has handed the event to every replica's connection,
        each of which drops its cache entries on receipt before telling its streams; only then are this
        replica's streams told. A client told here and re-reading through another replica finds that replica's
        cache already cleared (invariant 17). A change is recorded as the key's cluster state in the same
        step as it is published (one script), so it is never recorded and untold, nor told and unrecorded.
        Redis down: local streams are told all the same."""
        try:
            if event.baseline:
                await self._redis.publish(EVENTS_CHANNEL, _encode(event, self._instance))
            else:
                state = PREFIX + "state:" + _key_hash(event.key)
                message = _encode(event, self._instance)
                await self._publish_change(
                    keys=[state], args=[event.fingerprint, STATE_TTL_MS, EVENTS_CHANNEL, message]
                )
            self._metrics.bus_messages.labels("out").inc()
        except (RedisError, OSError) as exc:
            self._metrics.bus_publish_failures.inc()
            self._set_up(False, str(exc))
        await self._local.publish(event)

    async def _read_loop(self) -> None:
        delay = _RECONNECT_S[0]
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(EVENTS_CHANNEL, HINTS_CHANNEL)
                self._subscribed = True
                delay = _RECONNECT_S[0]
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._dispatch(message)
            except (RedisError, OSError) as exc:
                self._subscribed = False
                self._set_up(False, str(exc))
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            # Back off, but retry at once when the lease loop sees Redis answering again.
            self._resubscribe_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resubscribe_now.wait(), delay)
            delay = min(delay * 2, _RECONNECT_S[1])

    def _dispatch(self, message: dict[str, Any]) -> None:
        try:
            if message["channel"] == HINTS_CHANNEL.encode():
                data = orjson.loads(message["data"])
                if data["o"] != self._instance:
                    for listener in self._revalidate_listeners:
                        listener(frozenset(data["c"]))
                return
            origin, event = _decode(message["data"])
        except (ValueError, KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        if origin == self._instance:
            return  # delivered locally when it was published
        self._metrics.bus_messages.labels("in").inc()
        # Synchronously, as it is read: the cache drops what it made stale before this replica serves another
        # request (the cache listens before the streams do).
        self._local.deliver(event)

    # -- coordination ---------------------------------------------------------------------------------------

    def may_poll(self, key: WatchKey) -> bool:
        return self.degraded is not None or key in self._owned

    def track(self, watch: WatchState) -> None:
        self._tracked[watch.key] = watch

    def untrack(self, key: WatchKey) -> None:
        self._tracked.pop(key, None)
        if key in self._owned:
            self._owned.discard(key)
            self._metrics.leases_held.set(len(self._owned))
            asyncio.get_running_loop().create_task(self._release(key))

    async def _release(self, key: WatchKey) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.eval(_RELEASE, 1, PREFIX + "lease:" + _key_hash(key), self._instance)

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.publish(HINTS_CHANNEL, orjson.dumps({"o": self._instance, "c": sorted(contexts)}))

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._revalidate_listeners.append(listener)

    async def _lease_loop(self) -> None:
        while True:
            try:
                await self._renew_and_acquire()
            except (RedisError, OSError) as exc:
                self._set_up(False, str(exc))
            await asyncio.sleep(self._lease_ms / 3000)

    async def _renew_and_acquire(self) -> None:
        keys = list(self._tracked)
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                lease = PREFIX + "lease:" + _key_hash(key)
                if key in self._owned:
                    pipe.eval(_RENEW, 1, lease, self._instance, self._lease_ms)
                else:
                    pipe.set(lease, self._instance, nx=True, px=self._lease_ms)
            results = await pipe.execute() if keys else []
        was_degraded = self.degraded is not None
        self._set_up(True)
        gained: list[WatchKey] = []
        for key, ok in zip(keys, results, strict=True):
            if key not in self._tracked:
                continue  # untracked while the pipeline ran
            if ok and key not in self._owned:
                gained.append(key)
                self._owned.add(key)
                self._metrics.lease_acquisitions.inc()
            elif not ok and key in self._owned:
                self._owned.discard(key)
                self._metrics.lease_losses.inc()
        self._metrics.leases_held.set(len(self._owned))
        for key in gained:
            await self._take_over(key, fresh=was_degraded)

    async def _take_over(self, key: WatchKey, *, fresh: bool) -> None:
        """A new owner polls at once and compares with what its own streams were last told (its watch's own
        fingerprint, kept current by the bus): a change the old owner saw but did not live to publish is told
        now; one it did publish is not told twice. The cluster's recorded state is not adopted: it may be
        older than this replica's own first look (a spurious update), or newer than what its streams heard
        (a lost one)."""
        watch = self._tracked.get(key)
        if watch is None:
            return
        watch.hint()
        logger.debug("lease acquired", extra={"watch": key.short_hash, "after_outage": fresh})
