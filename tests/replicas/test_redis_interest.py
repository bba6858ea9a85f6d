"""The Redis coordinator's interest bookkeeping, against a real redis-server: a key given up while its interest is
being written, while a change of it is published or while it is taken over leaves nothing behind; a key whose stored
state this version cannot read starts from its own first look (polled, following interest, its changes told, reported
once by hash); the interest writer outlives an error that is not Redis's and writes the failed key again, and a
one-off task's failure is logged; closing hands over.

The coordinator is driven directly (no upstream): a watch here is the few fields a coordinator reads of one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from sidecar.bus.layout import REPLICAS, Layout, key_hash
from sidecar.bus.ownership import rendezvous_owner
from sidecar.bus.redis import RedisBus
from sidecar.changes import ChangeEvent
from sidecar.observability.metrics import Metrics
from tests.cluster import LEASE_MS, RedisServer
from tests.kit import eventually
from tests.replicas.bus_replicas import (
    KEY,
    OTHER,
    Watch,
    held_by_redis,
    interest_key,
    interested,
    neither_interested_nor_owning,
    no_interest,
    replicas_on,
    state_key,
    subscribed,
)

PAUSE_MS = 1_000
"""Under the client's socket timeout: the interest write waits for Redis, it does not fail."""


async def test_a_key_given_up_while_its_interest_is_written_leaves_no_interest_and_no_ownership(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    metrics = Metrics()
    async with replicas_on(redis, "r1", metrics=metrics) as (cluster,):
        channel = Layout().channel(Layout().bucket_of(KEY))
        await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
        cluster.track(Watch(KEY))
        # Heard first, then written: once the bucket is subscribed, the write is on its way (held by Redis).
        await eventually(lambda: subscribed(redis, channel))
        cluster.untrack(KEY)
        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        # Whatever order the write and the give-up met in, the key ends with neither interest nor an owner here.
        await neither_interested_nor_owning(admin, cluster, metrics)


async def test_closing_hands_over_a_key_whose_stored_state_it_cannot_read(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    layout = Layout()
    # A state this version cannot read (written by hand, or by another version).
    await admin.hset(layout.state(layout.bucket_of(KEY), key_hash(KEY)), mapping={"f": "f1", "g": "not a number"})
    cluster = RedisBus(redis.url, instance="r1", metrics=Metrics(), lease_ms=LEASE_MS)
    await cluster.start()
    cluster.track(Watch(KEY))
    await eventually(lambda: interested(admin, KEY, "r1"))
    await cluster.aclose()
    # Handed over: gone from the live replicas and from every key's interest, without waiting for its heartbeat
    # to run out.
    assert await admin.zscore(REPLICAS, "r1") is None
    assert not await admin.sismember(interest_key(KEY), "r1")


async def test_a_key_given_up_while_a_change_it_missed_is_told_on_rejoining_is_neither_owned_nor_interested(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    metrics = Metrics()
    async with replicas_on(redis, "r1", metrics=metrics) as (cluster,):
        cluster.track(Watch(KEY))
        await eventually(lambda: cluster.owned_count == 1)
        # A change told while this replica was taken for dead (its message never reached it), stored beside the key.
        await admin.hset(state_key(KEY), mapping={"f": "f1", "g": 5})
        told: list[ChangeEvent] = []
        # The key's last stream goes away just as that change is told to it on rejoining.
        cluster.subscribe(_giving_up(cluster, told))
        await admin.zrem(REPLICAS, "r1")  # taken for dead: its next heartbeat writes its interest again
        await eventually(lambda: bool(told))
        await neither_interested_nor_owning(admin, cluster, metrics)


async def test_a_key_given_up_while_its_change_is_published_starts_afresh_when_watched_again(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    async with replicas_on(redis, "r1") as (cluster,):
        cluster.track(Watch(KEY))
        await eventually(lambda: cluster.owned_count == 1)
        await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
        try:
            publishing = asyncio.create_task(cluster.publish(ChangeEvent(KEY, "f1", 0, time.time())))
            await eventually(lambda: held_by_redis(admin))  # the change's script waits on Redis
            cluster.untrack(KEY)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        await publishing
        await eventually(lambda: no_interest(admin, KEY))
        await _watched_again_without_a_stale_change(cluster, admin)


async def test_a_key_given_up_while_it_is_taken_over_starts_afresh_when_watched_again(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    hashed = key_hash(KEY)
    names = ("ra", "rb") if rendezvous_owner(("ra", "rb"), hashed) == "rb" else ("rb", "ra")
    async with replicas_on(redis, names[0], names[1]) as (heir, owner):
        heir.track(Watch(KEY))
        owner.track(Watch(KEY))
        await eventually(lambda: owner.owned_count == 1 and heir.owned_count == 0)
        await eventually(lambda: interested(admin, KEY, names[0]))
        await eventually(lambda: interested(admin, KEY, names[1]))
        # A change the owner told that never reached the heir (its message lost), stored beside the key.
        await admin.hset(state_key(KEY), mapping={"f": "f1", "g": 5})
        told: list[ChangeEvent] = []
        unsubscribe = heir.subscribe(_giving_up(heir, told))
        # The owner leaves: the heir takes the key over, tells its stream the missed change, whose last stream goes.
        await owner.aclose()
        await eventually(lambda: bool(told))
        unsubscribe()
        await eventually(lambda: no_interest(admin, KEY))
        await _watched_again_without_a_stale_change(heir, admin)


def _giving_up(cluster: RedisBus, told: list[ChangeEvent]) -> Callable[[ChangeEvent], None]:
    """A listener whose stream, the key's last, closes as a change is told to it."""

    def listener(event: ChangeEvent) -> None:
        told.append(event)
        cluster.untrack(KEY)

    return listener


async def _watched_again_without_a_stale_change(cluster: RedisBus, admin: aioredis.Redis) -> None:
    """The key, given up, changes elsewhere (told while nobody here listened); watched again, its first look here is
    newer than that and stands: no change is told from what this replica knew before it gave the key up."""
    generation = int(await admin.hget(state_key(KEY), "g") or 0)
    await admin.hset(state_key(KEY), mapping={"f": "f-elsewhere", "g": generation + 1})
    told: list[ChangeEvent] = []
    cluster.subscribe(told.append)
    watch = Watch(KEY, "f-first-look")
    cluster.track(watch)
    await eventually(lambda: cluster.owned_count == 1)
    assert watch.fingerprint == "f-first-look"
    assert told == []


class _WatchBug(Exception):
    pass


class _BrokenWatch(Watch):
    """A watch with a bug: once `fails` is set, reading what its streams were told fails that many times (an error
    that is not Redis's)."""

    fails = 0

    @property  # type: ignore[override]
    def fingerprint(self) -> str:
        if self.fails:
            self.fails -= 1
            raise _WatchBug("a watch whose fingerprint cannot be read")
        return self._fingerprint

    @fingerprint.setter
    def fingerprint(self, fingerprint: str) -> None:
        self._fingerprint = fingerprint


async def test_after_the_interest_writer_failed_on_an_error_not_redis_s_it_retries_and_follows_interest(
    redis: RedisServer, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar.bus")
    hashed = key_hash(KEY)
    first, winner = ("ra", "rb") if rendezvous_owner(("ra", "rb"), hashed) == "rb" else ("rb", "ra")
    async with replicas_on(redis, first, winner) as (cluster, rival):
        broken = _BrokenWatch(KEY, "f0")
        cluster.track(broken)
        await eventually(lambda: cluster.owned_count == 1)
        broken.fails = 1
        # A change it missed, read when its interest is written again (taken for dead): the watch fails.
        await admin.hset(state_key(KEY), mapping={"f": "f1", "g": 5})
        await admin.zrem(REPLICAS, first)
        await eventually(lambda: any(record.name.startswith("sidecar.bus") for record in caplog.records))
        # The writer carries on: a key watched later reaches Redis, so the other replicas learn of it.
        cluster.track(Watch(OTHER))
        await eventually(lambda: interested(admin, OTHER, first))
        # The failed key is written again: a replica joining it that wins its draw takes its polling over.
        rival.track(Watch(KEY, "f1"))
        await eventually(lambda: rival.owned_count == 1 and cluster.owned_count == 1)
        assert not cluster._machine.settling(hashed)


async def test_a_resync_that_fails_on_an_error_not_redis_s_is_logged(
    redis: RedisServer, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar.bus")
    async with replicas_on(redis, "r1") as (cluster,):
        broken = _BrokenWatch(KEY)
        cluster.track(broken)
        await eventually(lambda: cluster.owned_count == 1)
        broken.fails = 1_000
        await admin.hset(state_key(KEY), mapping={"f": "f1", "g": 5})
        # Subscribed afresh (as after a slot migration): the bucket's keys resync from their stored states.
        assert cluster._channels.reopen()
        await eventually(lambda: any(record.name.startswith("sidecar.bus") for record in caplog.records))


async def test_a_key_whose_stored_state_cannot_be_read_is_polled_from_its_first_look_and_follows_interest(
    redis: RedisServer, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.bus")
    await admin.hset(state_key(KEY), mapping={"f": "f1", "g": "not a number"})
    hashed = key_hash(KEY)
    first, winner = ("ra", "rb") if rendezvous_owner(("ra", "rb"), hashed) == "rb" else ("rb", "ra")
    async with replicas_on(redis, first, winner) as (alone, other):
        watch = Watch(KEY, "f-first-look")
        alone.track(watch)
        # The one replica interested polls the key, from its own first look: the unreadable state is no change.
        await eventually(lambda: alone.owned_count == 1)
        assert watch.fingerprint == "f-first-look"
        reports = [record for record in caplog.records if getattr(record, "watch", None) == KEY.short_hash]
        assert len(reports) == 1, [record.getMessage() for record in caplog.records]
        # Another replica's interest comes and goes: the poller follows it (its messages applied, none kept).
        other.track(Watch(KEY, "f-first-look"))
        await eventually(lambda: other.owned_count == 1 and alone.owned_count == 0)
        other.untrack(KEY)
        await eventually(lambda: alone.owned_count == 1)
        assert not alone._machine.settling(hashed)
        assert all(KEY.uri not in record.getMessage() for record in caplog.records)
        assert all(KEY.uri not in str(record.__dict__) for record in caplog.records)


async def test_a_change_of_a_key_whose_stored_state_cannot_be_read_is_told_to_the_other_replicas(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    await admin.hset(state_key(KEY), mapping={"f": "f1", "g": "not a number"})
    async with replicas_on(redis, "r1", "r2") as (owner, other):
        owner.track(Watch(KEY))
        other.track(Watch(KEY))
        await eventually(lambda: interested(admin, KEY, "r1"))
        await eventually(lambda: interested(admin, KEY, "r2"))
        await eventually(lambda: owner.owned_count + other.owned_count == 1)
        poller, listener = (owner, other) if owner.owned_count else (other, owner)
        heard = asyncio.Event()
        told: list[ChangeEvent] = []
        listener.subscribe(lambda event: (told.append(event), heard.set()) and None)
        here: list[ChangeEvent] = []
        poller.subscribe(here.append)
        await poller.publish(ChangeEvent(KEY, "f2", 0, time.time()))
        async with asyncio.timeout(10):
            await heard.wait()
        assert [event.fingerprint for event in told] == ["f2"]
        assert [event.fingerprint for event in here] == ["f2"]
        # The key's stored state is readable again: the change is recorded over what could not be read.
        assert await admin.hgetall(state_key(KEY)) == {"f": "f2", "g": "1"}


async def test_a_first_look_of_a_key_whose_stored_state_cannot_be_read_becomes_its_stored_state(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    await admin.hset(state_key(KEY), mapping={"f": "f1", "g": "1.5"})
    async with replicas_on(redis, "r1") as (cluster,):
        cluster.track(Watch(KEY, "f-first-look"))
        await eventually(lambda: cluster.owned_count == 1)
        await cluster.publish(ChangeEvent(KEY, "f-first-look", 0, time.time(), baseline=True))
        # What a replica joining later starts from: this first look, at generation 0.
        assert await admin.hgetall(state_key(KEY)) == {"f": "f-first-look", "g": "0"}
