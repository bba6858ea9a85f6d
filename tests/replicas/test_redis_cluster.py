"""Replicas on a real Redis Cluster (three masters with a replica each, `redis-server --cluster-enabled yes` and
`redis-cli --cluster create`): sharded pub/sub and hash-tagged buckets. The seed cases (one poller per key, every
stream told of every change) hold through a master's failover and a slot migration made while changes happen:
every change is told to every stream, none twice.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from tests.cluster import RedisClusterNodes, leases_held, redis_cluster, sidecar_replicas
from tests.kit import UPDATED, ListenStream, eventually
from tests.peers import Upstream

URIS = ["catalog://price", *(f"catalog://items/{n}" for n in range(24))]
"""Every one changes with the price; spread over the cluster's slots by their buckets."""
WITHIN_S = 20.0
RESHARD_SLOTS = 3000


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[RedisClusterNodes]:
    async with redis_cluster(tmp_path) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


class _Changes:
    """Makes changes one at a time, each once every stream was told of the previous one, and keeps the marks."""

    def __init__(self, shop: Upstream, streams: Sequence[ListenStream]) -> None:
        self.shop = shop
        self.streams = streams
        self.windows: list[list[int]] = []
        self.at_least_once: set[int] = set()
        """Changes made while a master failed over: told at least once (see `one`)."""
        self._prices = itertools.count(500)

    async def one(self, *, failing_over: bool = False) -> None:
        # During a master's failover a change may be told up to three times, never lost: by its key's owner; again
        # by that owner when the promoted replica lacks the state written with the last change (Redis replicates
        # asynchronously) and it sees that state behind its own look; and by a replica that lost Redis for the
        # moment and polled on its own meanwhile (degraded). Each is a signal: the client re-reads.
        marks = [stream.mark() for stream in self.streams]
        self.windows.append(marks)
        if failing_over:
            self.at_least_once.add(len(self.windows))
        await self.shop.set_price(next(self._prices))

        async def everyone() -> bool:
            return all(
                {frame["params"]["uri"] for frame in stream.updates(mark)} >= set(URIS)
                for stream, mark in zip(self.streams, marks, strict=True)
            )

        try:
            await eventually(everyone, WITHIN_S, what=f"every stream told of change {len(self.windows)}")
        except AssertionError as exc:
            missing = {
                stream.label: sorted(set(URIS) - {frame["params"]["uri"] for frame in stream.updates(mark)})
                for stream, mark in zip(self.streams, marks, strict=True)
            }
            raise AssertionError(f"{exc}; not told: {missing}") from None

    def assert_each_told_once(self) -> None:
        """Every window but the last (its repeats may still be on their way): each URI exactly once; during the
        failover at least once and at most three times (see `one`: more would be a storm, not a failover)."""
        for n, (start, end) in enumerate(itertools.pairwise(self.windows), start=1):
            for stream, since, until in zip(self.streams, start, end, strict=True):
                frames = stream.frames[since:until]
                counts = Counter(frame["params"]["uri"] for frame in frames if frame.get("method") == UPDATED)
                if n in self.at_least_once:
                    assert set(counts) == set(URIS) and max(counts.values()) <= 3, (
                        f"change {n} on {stream.label}: {counts}"
                    )
                else:
                    assert counts == dict.fromkeys(URIS, 1), f"change {n} on {stream.label}: {counts}"


async def test_on_redis_cluster_a_change_is_told_exactly_once_through_a_slot_migration_at_least_once_in_a_failover(
    tmp_path: Path, shop: Upstream, nodes: RedisClusterNodes, http: aiohttp.ClientSession
) -> None:
    async with sidecar_replicas(tmp_path, shop.url, nodes.url, 2) as replicas:
        streams = [await ListenStream.connect(http, replica.url, replica.name, URIS) for replica in replicas]
        try:

            async def one_poller_each() -> bool:
                return sum(await leases_held(replicas)) == len(URIS)

            await eventually(one_poller_each, WITHIN_S, what="every key has exactly one poller across the replicas")
            changes = _Changes(shop, streams)
            await changes.one()

            # Slots (and the buckets' keys in them) move between masters while changes go on: exactly once. First,
            # while every stored state is intact: after a failover the promoted replica may lack some, and the
            # resync that follows any later topology change would tell those changes again (see `one`).
            (source, _, _), (target, _, _), *_ = sorted(await nodes.masters(), key=lambda master: -master[2])
            migration = asyncio.create_task(nodes.reshard(source, target, RESHARD_SLOTS))
            while not migration.done():
                await changes.one()
            await migration
            await changes.one()
            await eventually(one_poller_each, WITHIN_S, what="one poller per key after the slot migration")

            # A master dies while changes go on: its replica is promoted, the clients follow. At least once.
            _, victim, _ = (await nodes.masters())[0]
            failover = asyncio.create_task(nodes.kill_master(victim))
            while not failover.done():
                await changes.one(failing_over=True)
            await failover
            await changes.one(failing_over=True)  # the clients may still be moving to the promoted replica
            await eventually(one_poller_each, WITHIN_S, what="one poller per key again after the failover")
            await changes.one(failing_over=True)  # closes the last window checked
            changes.assert_each_told_once()
            print(f"\n{len(changes.windows)} changes, each told once to each of {len(streams)} streams")
        finally:
            for stream in streams:
                await stream.aclose()
