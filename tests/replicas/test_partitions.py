"""Partial failures (design invariant 23): one replica cut from Redis or from the upstream by a partition that holds
every byte both ways and sends no RST (`tests.kit.partition_proxy`), the other well. Real replica processes, a real
redis-server and the SDK shop upstream (`tests.replicas.partitions`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from tests.cluster import RedisServer, Replica, instances_where_first_polls, leases_held
from tests.kit import UPDATED, ListenStream, all_updated, eventually, read_resource, text_of
from tests.peers import Upstream
from tests.replicas.partitions import URI, Fleet, partitioned_fleet

WITHIN_S = 15.0
"""Generous bound for a change to reach a stream or a fleet to settle on a loaded machine."""


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def _streams(http: aiohttp.ClientSession, fleet: Fleet, per_replica: int = 2) -> list[ListenStream]:
    return [
        await ListenStream.connect(http, replica.url, f"{replica.name}-{n}", [URI])
        for replica in fleet.replicas
        for n in range(per_replica)
    ]


async def _price(http: aiohttp.ClientSession, replica: Replica) -> str:
    return text_of(await read_resource(http, replica.url, URI))


async def _holds(fleet: Fleet, expected: Sequence[int]) -> None:
    async def held() -> bool:
        return await leases_held(fleet.replicas) == list(expected)

    await eventually(held, WITHIN_S, what=f"the replicas hold {list(expected)} leases")


async def _degraded(replica: Replica) -> bool:
    status, body = await replica.readyz()
    return status == 200 and "degraded" in body


async def _coordinated(replica: Replica) -> bool:
    status, body = await replica.readyz()
    return status == 200 and "degraded" not in body and (await replica.metrics()).total("mcp_sidecar_redis_up") == 1


# -- cut from Redis ---------------------------------------------------------------------------------------------------


@pytest.mark.invariant(23)
async def test_a_replica_cut_from_redis_keeps_telling_its_own_streams_and_rejoins_without_telling_anything_twice(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with partitioned_fleet(tmp_path, shop, redis, 2, instances=instances_where_first_polls(URI, 2)) as fleet:
        cut = fleet.members[0]
        streams = await _streams(http, fleet)
        try:
            await _holds(fleet, [1, 0])  # the replica cut next polls the key for both
            cut.redis.hold()
            await eventually(lambda: _degraded(cut.replica), WITHIN_S, what=f"{cut.name} reports degraded")

            before = [stream.mark() for stream in streams]
            await shop.set_price(201)
            await all_updated(streams, URI, WITHIN_S, before)  # its own streams from its own polls, the other's too
            assert [await _price(http, replica) for replica in fleet.replicas] == ["price=201"] * 2

            cut.redis.release()
            await eventually(lambda: _coordinated(cut.replica), WITHIN_S, what=f"{cut.name} coordinates again")
            await _holds(fleet, [1, 0])
            after = [stream.mark() for stream in streams]
            await shop.set_price(202)
            await all_updated(streams, URI, WITHIN_S, after)
            closing = [stream.mark() for stream in streams]
            await shop.set_price(203)
            await all_updated(streams, URI, WITHIN_S, closing)
            # Each change told once to each stream: the rejoin told nothing again.
            counts = [
                (_updates(stream, before[n], after[n]), _updates(stream, after[n], closing[n]))
                for n, stream in enumerate(streams)
            ]
            assert counts == [(1, 1)] * len(streams), f"updates per stream in each window: {counts}"
            assert [await _price(http, replica) for replica in fleet.replicas] == ["price=203"] * 2
        finally:
            for stream in streams:
                await stream.aclose()


def _updates(stream: ListenStream, since: int, until: int) -> int:
    return sum(1 for frame in stream.frames[since:until] if frame.get("method") == UPDATED)
