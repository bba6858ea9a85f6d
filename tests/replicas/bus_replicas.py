"""Replicas of the Redis bus driven directly, with no upstream, and what a test reads of Redis about them: a watch
stand-in (the few fields a bus reads of one), `replicas_on` a redis-server (a membership double per instance, to
stage a race), and the interest, state and heartbeat keys as a test checks them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import redis.asyncio as aioredis

from sidecar.bus.layout import REPLICAS, Layout, key_hash
from sidecar.bus.membership import Membership
from sidecar.bus.redis import RedisBus
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey
from sidecar.observability.metrics import Metrics
from tests.cluster import LEASE_MS, RedisServer
from tests.kit import eventually

__all__ = [
    "KEY",
    "OTHER",
    "Watch",
    "beat_since",
    "held_by_redis",
    "interest_key",
    "interested",
    "neither_interested_nor_owning",
    "no_interest",
    "replicas_on",
    "state_key",
    "subscribed",
]


KEY = WatchKey("resource", "catalog://price", "public")


OTHER = WatchKey("resource", "catalog://stock", "public")


class Watch:
    """What a coordinator needs of a watch (`sidecar.changes.WatchState`); its owner (`owner_of`) has it take
    the changes it hears."""

    def __init__(self, key: WatchKey, fingerprint: str = "f0") -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.hints = 0

    def hint(self) -> None:
        self.hints += 1


def owner_of(cluster: RedisBus) -> ChangeListener:
    """What the watch registry does with a change heard on the bus or adopted through it: the watch of its key
    takes it as its own (a first look elsewhere is no change)."""

    def heard(event: ChangeEvent) -> None:
        watch = cluster._keys.get(event.key)
        if isinstance(watch, Watch) and not event.baseline:
            watch.fingerprint = event.fingerprint

    return heard


@contextlib.asynccontextmanager
async def replicas_on(
    redis: RedisServer,
    *instances: str,
    metrics: Metrics | None = None,
    membership: Mapping[str, type[Membership]] | None = None,
) -> AsyncIterator[tuple[RedisBus, ...]]:
    """Replicas on `redis`, started in order and closed however the test ends (closing twice is harmless);
    `membership` names the membership double a replica is built with (a race staged), by instance."""
    started: list[RedisBus] = []
    try:
        for instance in instances:
            cluster = RedisBus(
                redis.url,
                instance=instance,
                metrics=metrics or Metrics(),
                lease_ms=LEASE_MS,
                membership=(membership or {}).get(instance, Membership),
            )
            heard = owner_of(cluster)
            cluster.subscribe(heard)
            cluster.on_adopt(heard)
            await cluster.start()
            started.append(cluster)
        yield tuple(started)
    finally:
        for cluster in started:
            await cluster.aclose()


def interest_key(key: WatchKey) -> str:
    layout = Layout()
    return layout.interest(layout.bucket_of(key), key_hash(key))


async def beat_since(admin: aioredis.Redis, instance: str, now_ms: int) -> bool:
    deadline = await admin.zscore(REPLICAS, instance)
    return deadline is not None and deadline > now_ms


async def held_by_redis(admin: aioredis.Redis) -> bool:
    return int((await admin.info("clients"))["blocked_clients"]) >= 1


def state_key(key: WatchKey) -> str:
    layout = Layout()
    return layout.state(layout.bucket_of(key), key_hash(key))


async def subscribed(redis: RedisServer, channel: str) -> bool:
    return await redis.subscribers(channel) >= 1


async def interested(admin: aioredis.Redis, key: WatchKey, instance: str) -> bool:
    return bool(await admin.sismember(interest_key(key), instance))


async def neither_interested_nor_owning(admin: aioredis.Redis, cluster: RedisBus, metrics: Metrics) -> None:
    """The key ends with no interest in Redis and no ownership here (nothing polled or counted for nobody)."""
    await eventually(lambda: no_interest(admin, KEY))
    assert cluster.owned_count == 0
    assert metrics.leases_held._value.get() == 0


async def no_interest(admin: aioredis.Redis, key: WatchKey) -> bool:
    return not await admin.smembers(interest_key(key))
