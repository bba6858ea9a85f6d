"""The Redis coordinator's interest bookkeeping, against a real redis-server: a key given up while its interest is
being written, while a change of it is published or while it is taken over leaves nothing behind; the interest
writer outlives an error that is not Redis's, and a one-off task's failure is logged; closing hands over even after
a loop of the coordinator failed.

The coordinator is driven directly (no upstream): a watch here is the few fields a coordinator reads of one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from sidecar.bus.layout import REPLICAS, Layout, key_hash
from sidecar.bus.ownership import rendezvous_owner
from sidecar.bus.redis import RedisCluster
from sidecar.changes import ChangeEvent, WatchKey
from sidecar.observability.metrics import Metrics
from tests.cluster import LEASE_MS, RedisServer, redis_server
from tests.helpers import eventually

KEY = WatchKey("resource", "catalog://price", "public")
OTHER = WatchKey("resource", "catalog://stock", "public")
PAUSE_MS = 1_000
"""Under the client's socket timeout: the interest write waits for Redis, it does not fail."""


class _Watch:
    """What a coordinator needs of a watch (`sidecar.changes.WatchState`)."""

    def __init__(self, key: WatchKey, fingerprint: str = "f0") -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.hints = 0

    def adopt(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def hint(self) -> None:
        self.hints += 1


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def admin(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    async with aioredis.Redis(host="127.0.0.1", port=redis.port, decode_responses=True) as client:
        yield client


def _interest_key(key: WatchKey) -> str:
    layout = Layout()
    return layout.interest(layout.bucket_of(key), key_hash(key))


async def test_a_key_given_up_while_its_interest_is_written_leaves_no_interest_and_no_ownership(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    metrics = Metrics()
    cluster = RedisCluster(redis.url, instance="r1", metrics=metrics, lease_ms=LEASE_MS)
    await cluster.start()
    try:
        channel = Layout().channel(Layout().bucket_of(KEY))
        await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
        cluster.track(_Watch(KEY))
        # Heard first, then written: once the bucket is subscribed, the write is on its way (held by Redis).
        await eventually(lambda: _subscribed(redis, channel))
        cluster.untrack(KEY)
        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        # Whatever order the write and the give-up met in, the key ends with neither interest nor an owner here.
        await _neither_interested_nor_owning(admin, cluster, metrics)
    finally:
        await cluster.aclose()


async def test_closing_hands_over_even_after_the_interest_writer_failed_on_a_state_it_cannot_read(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    layout = Layout()
    # A state this version cannot read (written by hand, or by another version): the interest write fails on it.
    await admin.hset(layout.state(layout.bucket_of(KEY), key_hash(KEY)), mapping={"f": "f1", "g": "not a number"})
    cluster = RedisCluster(redis.url, instance="r1", metrics=Metrics(), lease_ms=LEASE_MS)
    await cluster.start()
    cluster.track(_Watch(KEY))
    await eventually(lambda: _interested(admin, KEY, "r1"))
    await cluster.aclose()
    # Handed over: gone from the live replicas and from every key's interest, without waiting for its heartbeat
    # to run out.
    assert await admin.zscore(REPLICAS, "r1") is None
    assert not await admin.sismember(_interest_key(KEY), "r1")


async def test_a_key_given_up_while_a_change_it_missed_is_told_on_rejoining_is_neither_owned_nor_interested(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    metrics = Metrics()
    cluster = RedisCluster(redis.url, instance="r1", metrics=metrics, lease_ms=LEASE_MS)
    await cluster.start()
    try:
        cluster.track(_Watch(KEY))
        await eventually(lambda: cluster.owned_count == 1)
        # A change told while this replica was taken for dead (its message never reached it), stored beside the key.
        await admin.hset(_state_key(KEY), mapping={"f": "f1", "g": 5})
        told: list[ChangeEvent] = []
        # The key's last stream goes away just as that change is told to it on rejoining.
        cluster.subscribe(_giving_up(cluster, told))
        await admin.zrem(REPLICAS, "r1")  # taken for dead: its next heartbeat writes its interest again
        await eventually(lambda: bool(told))
        await _neither_interested_nor_owning(admin, cluster, metrics)
    finally:
        await cluster.aclose()


async def test_a_key_given_up_while_its_change_is_published_starts_afresh_when_watched_again(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    cluster = RedisCluster(redis.url, instance="r1", metrics=Metrics(), lease_ms=LEASE_MS)
    await cluster.start()
    try:
        cluster.track(_Watch(KEY))
        await eventually(lambda: cluster.owned_count == 1)
        await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
        try:
            publishing = asyncio.create_task(cluster.publish(ChangeEvent(KEY, "f1", 0, time.time())))
            await eventually(lambda: _held_by_redis(admin))  # the change's script waits on Redis
            cluster.untrack(KEY)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        await publishing
        await eventually(lambda: _no_interest(admin, KEY))
        await _watched_again_without_a_stale_change(cluster, admin)
    finally:
        await cluster.aclose()


async def test_a_key_given_up_while_it_is_taken_over_starts_afresh_when_watched_again(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    hashed = key_hash(KEY)
    names = ("ra", "rb") if rendezvous_owner(("ra", "rb"), hashed) == "rb" else ("rb", "ra")
    heir = RedisCluster(redis.url, instance=names[0], metrics=Metrics(), lease_ms=LEASE_MS)
    owner = RedisCluster(redis.url, instance=names[1], metrics=Metrics(), lease_ms=LEASE_MS)
    await heir.start()
    await owner.start()
    try:
        heir.track(_Watch(KEY))
        owner.track(_Watch(KEY))
        await eventually(lambda: owner.owned_count == 1 and heir.owned_count == 0)
        await eventually(lambda: _interested(admin, KEY, names[0]))
        await eventually(lambda: _interested(admin, KEY, names[1]))
        # A change the owner told that never reached the heir (its message lost), stored beside the key.
        await admin.hset(_state_key(KEY), mapping={"f": "f1", "g": 5})
        told: list[ChangeEvent] = []
        unsubscribe = heir.subscribe(_giving_up(heir, told))
        # The owner leaves: the heir takes the key over, tells its stream the missed change, whose last stream goes.
        await owner.aclose()
        await eventually(lambda: bool(told))
        unsubscribe()
        await eventually(lambda: _no_interest(admin, KEY))
        await _watched_again_without_a_stale_change(heir, admin)
    finally:
        await heir.aclose()
        await owner.aclose()


def _giving_up(cluster: RedisCluster, told: list[ChangeEvent]) -> Callable[[ChangeEvent], None]:
    """A listener whose stream, the key's last, closes as a change is told to it."""

    def listener(event: ChangeEvent) -> None:
        told.append(event)
        cluster.untrack(KEY)

    return listener


async def _watched_again_without_a_stale_change(cluster: RedisCluster, admin: aioredis.Redis) -> None:
    """The key, given up, changes elsewhere (told while nobody here listened); watched again, its first look here is
    newer than that and stands: no change is told from what this replica knew before it gave the key up."""
    generation = int(await admin.hget(_state_key(KEY), "g") or 0)
    await admin.hset(_state_key(KEY), mapping={"f": "f-elsewhere", "g": generation + 1})
    told: list[ChangeEvent] = []
    cluster.subscribe(told.append)
    watch = _Watch(KEY, "f-first-look")
    cluster.track(watch)
    await eventually(lambda: cluster.owned_count == 1)
    assert watch.fingerprint == "f-first-look"
    assert told == []


async def test_after_the_interest_writer_failed_on_a_state_it_cannot_read_later_interest_is_still_written(
    redis: RedisServer, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar.bus.redis")
    await admin.hset(_state_key(KEY), mapping={"f": "f1", "g": "not a number"})
    cluster = RedisCluster(redis.url, instance="r1", metrics=Metrics(), lease_ms=LEASE_MS)
    await cluster.start()
    try:
        cluster.track(_Watch(KEY))
        await eventually(lambda: _interested(admin, KEY, "r1"))
        # The writer carries on: a key watched later reaches Redis, so the other replicas learn of it.
        cluster.track(_Watch(OTHER))
        await eventually(lambda: _interested(admin, OTHER, "r1"))
        assert any(record.name == "sidecar.bus.redis" for record in caplog.records), "the failure was not logged"
    finally:
        await cluster.aclose()


async def test_a_resync_that_fails_on_a_state_it_cannot_read_is_logged(
    redis: RedisServer, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar.bus.redis")
    cluster = RedisCluster(redis.url, instance="r1", metrics=Metrics(), lease_ms=LEASE_MS)
    await cluster.start()
    try:
        cluster.track(_Watch(KEY))
        await eventually(lambda: cluster.owned_count == 1)
        await admin.hset(_state_key(KEY), mapping={"f": "f1", "g": "not a number"})
        # Subscribed afresh (as after a slot migration): the bucket's keys resync from their stored states.
        assert cluster._channels.reopen()
        await eventually(lambda: any(record.name == "sidecar.bus.redis" for record in caplog.records))
    finally:
        await cluster.aclose()


async def _held_by_redis(admin: aioredis.Redis) -> bool:
    return int((await admin.info("clients"))["blocked_clients"]) >= 1


def _state_key(key: WatchKey) -> str:
    layout = Layout()
    return layout.state(layout.bucket_of(key), key_hash(key))


async def _subscribed(redis: RedisServer, channel: str) -> bool:
    return await redis.subscribers(channel) >= 1


async def _interested(admin: aioredis.Redis, key: WatchKey, instance: str) -> bool:
    return bool(await admin.sismember(_interest_key(key), instance))


async def _neither_interested_nor_owning(admin: aioredis.Redis, cluster: RedisCluster, metrics: Metrics) -> None:
    """The key ends with no interest in Redis and no ownership here (nothing polled or counted for nobody)."""
    await eventually(lambda: _no_interest(admin, KEY))
    assert cluster.owned_count == 0
    assert metrics.leases_held._value.get() == 0


async def _no_interest(admin: aioredis.Redis, key: WatchKey) -> bool:
    return not await admin.smembers(_interest_key(key))
