"""The Redis coordinator's interest bookkeeping, against a real redis-server: a key given up while its interest is
being written leaves nothing behind, and closing hands over even after a loop of the coordinator failed.

The coordinator is driven directly (no upstream): a watch here is the few fields a coordinator reads of one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from sidecar.bus.layout import REPLICAS, Layout, key_hash
from sidecar.bus.redis import RedisCluster
from sidecar.changes import WatchKey
from sidecar.observability.metrics import Metrics
from tests.cluster import LEASE_MS, RedisServer, redis_server
from tests.helpers import eventually

KEY = WatchKey("resource", "catalog://price", "public")
PAUSE_MS = 1_000
"""Under the client's socket timeout: the interest write waits for Redis, it does not fail."""


class _Watch:
    """What a coordinator needs of a watch (`sidecar.changes.WatchState`)."""

    def __init__(self, key: WatchKey) -> None:
        self.key = key
        self.fingerprint = "f0"
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
        await eventually(lambda: _no_interest(admin, KEY))
        assert cluster.owned_count == 0
        assert metrics.leases_held._value.get() == 0
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


async def _subscribed(redis: RedisServer, channel: str) -> bool:
    return await redis.subscribers(channel) >= 1


async def _interested(admin: aioredis.Redis, key: WatchKey, instance: str) -> bool:
    return bool(await admin.sismember(_interest_key(key), instance))


async def _no_interest(admin: aioredis.Redis, key: WatchKey) -> bool:
    return not await admin.smembers(_interest_key(key))
