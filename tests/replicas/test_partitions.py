"""Partial failures (design invariant 23): one replica cut from Redis or from the upstream by a partition that holds
every byte both ways and sends no RST (`tests.kit.partition_proxy`), the other well. Real replica processes, a real
redis-server and the SDK shop upstream (`tests.replicas.partitions`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from sidecar.protocol.constants import META_ENDED
from tests.cluster import RedisServer, Replica, instances_where_first_polls, leases_held
from tests.kit import UPDATED, ListenStream, all_updated, eventually, read_resource, text_of
from tests.kit.session import Session
from tests.peers import Upstream
from tests.replicas.partitions import LEASE_MS, URI, Fleet, partitioned_fleet

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


async def _acquisitions(replica: Replica) -> float:
    return (await replica.metrics()).total("mcp_sidecar_lease_acquisitions_total")


def _said_unreadable(replica: Replica) -> bool:
    return any(line.get("msg", "").startswith("upstream unreadable from this replica") for line in replica.log_lines())


# -- cut from the upstream --------------------------------------------------------------------------------------------


def _ended_to_listen_again(stream: ListenStream) -> bool:
    """The stream ended with its complete result, which says why and that listening again helps."""
    if not stream.ended or not stream.frames or "result" not in stream.frames[-1]:
        return False
    result = stream.frames[-1]["result"]
    return result.get("resultType") == "complete" and result["_meta"].get(META_ENDED) == {
        "reason": "upstream_unreachable",
        "retryable": True,
    }


@pytest.mark.invariant(23)
async def test_a_replica_cut_from_the_upstream_gives_its_keys_and_its_clients_to_one_that_reads(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with partitioned_fleet(tmp_path, shop, redis, 2, instances=instances_where_first_polls(URI, 2)) as fleet:
        cut, well = fleet.members
        streams = await _streams(http, fleet)
        on_cut, on_well = streams[:2], streams[2:]
        try:
            await _holds(fleet, [1, 0])  # the replica cut next polls the key for both
            cut.upstream.hold()
            marks = [stream.mark() for stream in on_well]
            await shop.set_price(301)
            # The replica that reads polls the key now and its clients hear the change while the cut lasts.
            await all_updated(on_well, URI, WITHIN_S, marks)
            await _holds(fleet, [0, 1])
            # The cut replica's clients are told to listen again (through the load balancer) and it is not ready.
            await eventually(
                lambda: all(_ended_to_listen_again(stream) for stream in on_cut),
                WITHIN_S,
                what=f"{cut.name}'s streams end with the complete result and a retryable reason",
            )
            status, body = await cut.replica.readyz()
            assert status == 503 and "another replica can" in body["reason"], body
            assert (await cut.replica.metrics()).total("mcp_sidecar_upstream_cut") == 1
            refused = ListenStream(http, cut.replica.url, "again", [URI])
            with pytest.raises(AssertionError, match="answered 503"):
                await refused.open()
            moved = await ListenStream.connect(http, well.replica.url, "moved", [URI])
            streams.append(moved)
            assert await _price(http, well.replica) == "price=301"

            # Healed: it reads again, serves again, and the key goes back to the owner rendezvous hashing picks.
            cut.upstream.release()
            await eventually(cut.replica.is_ready, WITHIN_S, what=f"{cut.name} is ready again")
            back = await ListenStream.connect(http, cut.replica.url, "back", [URI])
            streams.append(back)
            await _holds(fleet, [1, 0])
            marks = [stream.mark() for stream in (moved, back)]
            await shop.set_price(302)
            await all_updated([moved, back], URI, WITHIN_S, marks)
        finally:
            for stream in streams:
                await stream.aclose()


@pytest.mark.invariant(23)
async def test_with_the_upstream_cut_from_every_replica_nothing_moves_and_every_stream_stays_open(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with partitioned_fleet(tmp_path, shop, redis, 2, instances=instances_where_first_polls(URI, 2)) as fleet:
        streams = await _streams(http, fleet)
        try:
            await _holds(fleet, [1, 0])
            acquired = [await _acquisitions(replica) for replica in fleet.replicas]
            for member in fleet.members:
                member.upstream.hold()
            # Each says it cannot read, and each hears the other say so (a bug would take that for a cut of one).
            for member in fleet.members:
                replica = member.replica
                await eventually(lambda r=replica: _said_unreadable(r), WITHIN_S, what=f"{replica.name} cannot read")
            await asyncio.sleep(2 * LEASE_MS / 1000)  # two more leases: time for a wrong move to happen
            assert await leases_held(fleet.replicas) == [1, 0]
            assert [await _acquisitions(replica) for replica in fleet.replicas] == acquired
            assert not any(stream.ended for stream in streams)
            marks = [stream.mark() for stream in streams]
            await shop.set_price(401)
            for member in fleet.members:
                member.upstream.release()
            await all_updated(streams, URI, WITHIN_S, marks)  # every watch re-reads once it answers (invariant 14)
            assert not any(stream.ended for stream in streams)
        finally:
            for stream in streams:
                await stream.aclose()


async def test_a_replica_whose_upstream_is_slow_but_answers_keeps_its_keys_and_its_clients(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with partitioned_fleet(tmp_path, shop, redis, 2, instances=instances_where_first_polls(URI, 2)) as fleet:
        slow = fleet.members[0]
        streams = await _streams(http, fleet)
        try:
            await _holds(fleet, [1, 0])
            acquired = [await _acquisitions(replica) for replica in fleet.replicas]
            marks = [stream.mark() for stream in streams]
            await shop.set_price(601)
            for _ in range(6):  # every answer a second late, under upstream.timeout_s, for several leases
                slow.upstream.hold()
                await asyncio.sleep(1.0)  # the scenario: an upstream that takes a second to answer
                slow.upstream.release()
                await asyncio.sleep(0.1)
            await all_updated(streams, URI, WITHIN_S, marks)
            assert not _said_unreadable(slow.replica)
            assert await leases_held(fleet.replicas) == [1, 0]
            assert [await _acquisitions(replica) for replica in fleet.replicas] == acquired
            assert not any(stream.ended for stream in streams)
        finally:
            for stream in streams:
                await stream.aclose()


@pytest.mark.invariant(23)
async def test_a_replica_cut_from_the_upstream_ends_its_2025_11_25_sessions_so_their_clients_initialize_elsewhere(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with partitioned_fleet(tmp_path, shop, redis, 2, instances=instances_where_first_polls(URI, 2)) as fleet:
        cut, well = fleet.members
        session, other = Session(http, cut.replica.url), Session(http, well.replica.url)
        try:
            for opened in (session, other):
                await opened.open()
                await opened.subscribe(URI)
            cut.upstream.hold()
            await shop.set_price(501)
            await other.wait_updates(1, WITHIN_S)
            await eventually(lambda: not session.streaming, WITHIN_S, what=f"{cut.name} ends the session's GET stream")
            status, _ = await session.call("ping", {})
            assert status == 404  # the session is gone: its client initializes again
            assert other.streaming
            await shop.set_price(502)
            await other.wait_updates(2, WITHIN_S)
        finally:
            cut.upstream.release()
            await other.close()
