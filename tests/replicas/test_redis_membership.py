"""Membership on a real redis-server: a replica taken for dead that beats again before its clean-up keeps its
place and its interest; one whose heartbeat ran out leaves the replicas and every interest; a clean-up cut short
is taken up by another replica; and the scripts read a stored generation as the replica does.

The bus is driven directly (no upstream); races are staged with a membership double given to the constructor."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from sidecar.bus import scripts
from sidecar.bus.layout import REPLICAS, Layout, key_hash, stored_generation
from sidecar.bus.membership import Membership
from sidecar.bus.ownership import rendezvous_owner
from tests.cluster import LEASE_MS, RedisServer
from tests.kit import eventually
from tests.replicas.bus_replicas import (
    KEY,
    OTHER,
    Watch,
    beat_since,
    interested,
    no_interest,
    replicas_on,
)


def _holding_beats(held: asyncio.Event, go: asyncio.Event) -> type[Membership]:
    """A membership that beats as usual until `held` is set; from then on each beat waits for `go` first (a
    replica only slow, or, `go` never set, one frozen)."""

    class HeldBeats(Membership):
        async def beat(self) -> None:
            if held.is_set():
                await go.wait()
            await super().beat()

    return HeldBeats


async def test_a_replica_taken_for_dead_that_beats_again_before_its_clean_up_keeps_its_place_and_its_interest(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    hashed = key_hash(KEY)
    slow, peer = ("ra", "rb") if rendezvous_owner(("ra", "rb"), hashed) == "ra" else ("rb", "ra")
    beats_held, beats_go = asyncio.Event(), asyncio.Event()
    clean_up_reached, clean_up_go, clean_up_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class GatedCleanUp(Membership):
        """Cleans the slow replica up only once the test lets it."""

        async def clean_up(self, instance: str, *, restarted: bool = False) -> None:
            if instance != slow:
                return await super().clean_up(instance, restarted=restarted)
            clean_up_reached.set()
            await clean_up_go.wait()
            try:
                await super().clean_up(instance, restarted=restarted)
            finally:
                clean_up_done.set()

    doubles = {slow: _holding_beats(beats_held, beats_go), peer: GatedCleanUp}
    async with replicas_on(redis, peer, slow, membership=doubles) as (cleaner, late):
        cleaner.track(Watch(KEY))
        late.track(Watch(KEY))
        await eventually(lambda: late.owned_count == 1 and cleaner.owned_count == 0)
        await eventually(lambda: interested(admin, KEY, peer))
        # The late replica stops beating for a while, long enough to be listed dead...
        beats_held.set()
        seconds, micros = await admin.time()
        now_ms = seconds * 1000 + micros // 1000
        await admin.zadd(REPLICAS, {slow: now_ms - 3 * LEASE_MS}, xx=True)
        async with asyncio.timeout(10):
            await clean_up_reached.wait()
        # ... then beats again (it was only slow) before the clean-up that listing started has run.
        beats_go.set()
        await eventually(lambda: beat_since(admin, slow, now_ms))
        clean_up_go.set()
        async with asyncio.timeout(10):
            await clean_up_done.wait()
        # The live replica keeps its place among the replicas and its interest, as any replica reading them sees;
        # the key it won is its own again once it is heard live.
        assert await admin.zscore(REPLICAS, slow) is not None
        assert await interested(admin, KEY, slow)
        await eventually(lambda: cleaner.owned_count == 0)


async def test_a_replica_whose_heartbeat_ran_out_leaves_the_replicas_and_every_interest(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    frozen_now, never = asyncio.Event(), asyncio.Event()
    async with replicas_on(redis, "r1", "r2", membership={"r2": _holding_beats(frozen_now, never)}) as (
        survivor,
        frozen,
    ):
        survivor.track(Watch(KEY))
        frozen.track(Watch(KEY))
        frozen.track(Watch(OTHER))
        await eventually(lambda: interested(admin, KEY, "r2"))
        await eventually(lambda: interested(admin, OTHER, "r2"))
        frozen_now.set()
        # Silent for twice its life: cleaned up by the survivor, whose polling of the shared key resumes.
        # It leaves the replicas last: once it is gone, so is everything the clean-up removes before it.
        await eventually(lambda: gone_from_replicas(admin, "r2"), what="the dead replica gone from the replicas")
        assert await no_interest(admin, OTHER)
        assert not await interested(admin, KEY, "r2")
        assert not await admin.exists(Layout.interest_of("r2"))
        await eventually(lambda: survivor.owned_count == 1)


async def test_a_clean_up_cut_short_is_taken_up_by_another_replica(redis: RedisServer, admin: aioredis.Redis) -> None:
    claimed, frozen_now, never = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class ClaimsThenStops(Membership):
        """Claims the frozen replica's clean-up, then shuts down before it removes anything."""

        async def clean_up(self, instance: str, *, restarted: bool = False) -> None:
            if instance != "r3":
                return await super().clean_up(instance, restarted=restarted)
            if await self.claim(instance):
                claimed.set()
                await never.wait()

    class AfterTheFirstClaims(Membership):
        async def clean_up(self, instance: str, *, restarted: bool = False) -> None:
            if instance == "r3":
                await claimed.wait()
            return await super().clean_up(instance, restarted=restarted)

    doubles: dict[str, type[Membership]] = {
        "r1": ClaimsThenStops,
        "r2": AfterTheFirstClaims,
        "r3": _holding_beats(frozen_now, never),
    }
    async with replicas_on(redis, "r1", "r2", "r3", membership=doubles) as (first, _, frozen):
        frozen.track(Watch(OTHER))
        await eventually(lambda: interested(admin, OTHER, "r3"))
        frozen_now.set()
        async with asyncio.timeout(10):
            await claimed.wait()
        await first.aclose()
        # Its claim runs out unfinished: the dead replica is listed dead again and the other replica cleans it up.
        await eventually(lambda: no_interest(admin, OTHER), what="the dead replica's interest removed")
        # It leaves the replicas last (a clean-up cut short leaves it listed, to be tried again): once it is gone,
        # so is everything the clean-up removes before it.
        await eventually(lambda: gone_from_replicas(admin, "r3"), what="the dead replica gone from the replicas")
        assert not await admin.exists(Layout.interest_of("r3"))


@pytest.mark.parametrize(
    "text", ["0", "7", "9007199254740991", "9007199254740992", "-1", "7.0", "1e3", "0x10", " 7", "7_0", "", "seven"]
)
async def test_the_scripts_and_the_replica_read_a_stored_generation_alike(admin: aioredis.Redis, text: str) -> None:
    lua = await admin.eval(scripts.GENERATION + "return generation(ARGV[1]) or -1", 0, text)  # type: ignore[misc]
    assert (None if lua == -1 else lua) == stored_generation(text)


async def gone_from_replicas(admin: aioredis.Redis, instance: str) -> bool:
    return await admin.zscore(REPLICAS, instance) is None
