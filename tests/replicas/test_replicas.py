"""Scale-out on Redis, as operators run it: replica processes behind nginx (`run --workers N` is test_workers.py,
the config checks that guard both test_scale_out_config.py). Real redis-server, nginx, sidecar processes and SDK
upstream (see tests/cluster.py).

Design §4: a change detected anywhere reaches streams everywhere (pub/sub); exactly one replica polls a key at a
time (a lease, renewed at a third of its life); a dead owner's key is taken over within one lease period; Redis
down means local polling (degraded) and coordination resumes when it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from sidecar.bus.layout import Layout, key_hash
from sidecar.bus.ownership import rendezvous_owner
from sidecar.changes import WatchKey
from tests.cluster import (
    Nginx,
    RedisServer,
    Replica,
    nginx_proxy,
    sidecar_replicas,
)
from tests.kit import ListenStream, Streams, all_updated, eventually
from tests.peers import Upstream
from tests.procs import START_TIMEOUT_S

URI = "catalog://price"
READ_TTL_MS = 300
"""The upstream's ttlMs for reads: the poll interval (within polling's [100 ms, ...] clamp)."""
NOTIFY_WITHIN_S = 10.0
"""Generous bound for a change to reach a stream (an interval, a lease period and a hop through Redis)."""
NGINX_READ_TIMEOUT_S = 5
POLLS_PER_WINDOW = 20
REDIS_OUTAGE_S = 8.0
"""Long enough for every replica's bus reader to back off to its longest reconnect delays."""


@pytest.fixture
async def replicas(tmp_path: Path, shop: Upstream, redis: RedisServer) -> AsyncIterator[list[Replica]]:
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 3) as started:
        yield started


@pytest.fixture
async def lb(tmp_path: Path, replicas: list[Replica]) -> AsyncIterator[Nginx]:
    async with nginx_proxy(tmp_path, [replica.port for replica in replicas], NGINX_READ_TIMEOUT_S) as nginx:
        yield nginx


# -- helpers ----------------------------------------------------------------------------------------------------------


async def _gauge(replica: Replica, name: str) -> float:
    return (await replica.metrics()).total(name)


async def _polls(replica: Replica) -> float:
    return (await replica.metrics()).total("mcp_sidecar_polls_total", kind="resource", outcome="ok")


async def _lease_holders(replicas: Sequence[Replica]) -> list[Replica]:
    held = await asyncio.gather(*(_gauge(replica, "mcp_sidecar_leases_held") for replica in replicas))
    return [replica for replica, count in zip(replicas, held, strict=True) if count == 1]


async def _sole_lease_holder(replicas: Sequence[Replica], within_s: float = NOTIFY_WITHIN_S) -> Replica:
    """The one replica that holds the lease of the (only) watched key, once exactly one does."""
    holders: list[Replica] = []

    async def exactly_one() -> bool:
        nonlocal holders
        holders = await _lease_holders(replicas)
        return len(holders) == 1

    await eventually(exactly_one, within_s, what="exactly one replica holds the lease (mcp_sidecar_leases_held 1)")
    return holders[0]


async def _settled_lease_holder(replicas: Sequence[Replica], within_s: float = NOTIFY_WITHIN_S) -> Replica:
    """The sole lease holder once it is the one rendezvous hashing picks among all `replicas`. A stream's ack does
    not wait for its replica's interest to reach Redis: right after the streams open, the sole holder may still be
    an earlier replica, and the rightful owner gain the key a moment later, on its own, not by any take-over."""
    instances = {(await replica.status())["instance"]: replica for replica in replicas}
    picked = rendezvous_owner(instances, key_hash(WatchKey("resource", URI, "public")))
    assert picked is not None
    rightful = instances[picked]

    async def settled() -> bool:
        return await _lease_holders(replicas) == [rightful]

    await eventually(settled, within_s, what=f"{rightful.name} alone holds the lease (mcp_sidecar_leases_held 1)")
    return rightful


async def _reads_during_polls(shop: Upstream, clock: Replica, polls: int) -> int:
    """Upstream reads of URI (from every replica) while `clock`'s own poll count advances by `polls`."""
    await shop.reset_log()
    start = await _polls(clock)

    async def advanced() -> bool:
        return await _polls(clock) >= start + polls

    await eventually(advanced, polls * READ_TTL_MS / 1000 * 3 + 10, what=f"{clock.name} polled {polls} times")
    return await shop.count("resources/read", URI)


def _logs(replicas: Sequence[Replica]) -> str:
    return "\n".join(replica.service.log_tail(30) for replica in replicas)


# -- 1. coalescing across replicas, fan-out to every stream ------------------------------------------------------------


@pytest.mark.invariant(8)
async def test_thirty_streams_over_three_replicas_cost_the_upstream_one_poller_and_all_get_the_change(
    shop: Upstream, replicas: list[Replica], lb: Nginx, streams: Streams
) -> None:
    # Baseline: interest on one replica only, so it alone polls; its poll count is the clock of the window.
    solo = await streams.open(replicas[0].url, "solo")
    assert await _sole_lease_holder(replicas) is replicas[0]
    single = await _reads_during_polls(shop, replicas[0], POLLS_PER_WINDOW)

    # Thirty streams round-robin through nginx: every replica now has interest in the same key.
    spread = await streams.open_many(lb.url, "lb", 30)
    counts = [await _gauge(replica, "mcp_sidecar_listen_streams") for replica in replicas]
    via_lb = [counts[0] - 1, *counts[1:]]  # replica 0 also holds the solo stream
    assert sum(via_lb) == 30, counts
    assert all(count >= 1 for count in via_lb), f"nginx left a replica without streams: {via_lb}"

    # Still one poller for the whole cluster: reads over the same number of the owner's poll intervals match.
    owner = await _sole_lease_holder(replicas)
    before = [await _polls(replica) for replica in replicas]
    clustered = await _reads_during_polls(shop, owner, POLLS_PER_WINDOW)
    after = [await _polls(replica) for replica in replicas]
    deltas = {replica.name: a - b for replica, a, b in zip(replicas, after, before, strict=True)}
    assert clustered <= 1.2 * single, (
        f"{clustered} upstream reads over {POLLS_PER_WINDOW} poll intervals with 3 replicas vs {single} with one; "
        f"polls per replica: {deltas}, owner {owner.name}"
    )

    everyone = [solo, *spread]
    assert not any(stream.updates() for stream in everyone), "an update before any change"
    await shop.set_price(150)
    await all_updated(everyone, URI, NOTIFY_WITHIN_S)


# -- 2. nginx: keep-alives beat proxy_read_timeout, nothing is held in its buffers -------------------------------------


@pytest.mark.invariant(12)
async def test_a_quiet_stream_through_nginx_outlives_its_read_timeout_and_frames_arrive_unbuffered(
    shop: Upstream, lb: Nginx, streams: Streams
) -> None:
    loop = asyncio.get_running_loop()
    # The ack comes through at once (ListenStream.open waits for it, bounded), not when a buffer fills.
    stream = await streams.open(lb.url, "quiet")
    acked_at = loop.time()
    await asyncio.sleep(NGINX_READ_TIMEOUT_S + 2)  # quiet for longer than nginx's proxy_read_timeout
    # A comment every quiet interval: however late a loaded machine writes them, three come (bounded wait).
    await eventually(lambda: len(stream.comment_times) >= 3 or stream.ended, within_s=30)
    assert not stream.ended, "nginx closed the quiet stream"
    assert stream.frames == stream.frames[:1], f"frames besides the ack on a quiet stream: {stream.frames}"
    keepalives = [t - acked_at for t in stream.comment_times]
    # 1 s keep-alives arrive one by one as they are written, spread over the quiet time, not in one burst.
    assert len(keepalives) >= 3, keepalives
    assert keepalives[0] < NGINX_READ_TIMEOUT_S and keepalives[-1] - keepalives[0] >= 2, keepalives

    mark = stream.mark()
    await shop.set_price(125)
    update = await stream.wait_update(URI, NOTIFY_WITHIN_S, since=mark)
    assert set(update["params"]) == {"uri", "_meta"}


# -- 3. the lease owner dies -------------------------------------------------------------------------------------------


async def test_when_the_lease_owner_is_killed_a_survivor_takes_over_and_the_next_change_arrives(
    shop: Upstream, replicas: list[Replica], streams: Streams
) -> None:
    # Two streams on each replica, opened on it directly (through nginx we could not tell where they landed).
    by_replica = {replica.name: await streams.open_many(replica.url, replica.name, 2) for replica in replicas}
    owner = await _settled_lease_holder(replicas)
    survivors = [replica for replica in replicas if replica is not owner]
    acquired = {replica.name: await _acquisitions(replica) for replica in survivors}

    await owner.service.kill()  # kill -9: no lease release, no goodbye
    await shop.set_price(175)

    survivor_streams = [stream for replica in survivors for stream in by_replica[replica.name]]
    await all_updated(survivor_streams, URI, NOTIFY_WITHIN_S)
    # The key's new owner is a survivor. Waited for, not read at the update: a survivor that lost Redis for a
    # moment under load polls on its own meanwhile (degraded), and the change can reach the streams that way first.
    gained: list[Replica] = []

    async def taken_over() -> bool:
        nonlocal gained
        gained = [replica for replica in survivors if await _acquisitions(replica) > acquired[replica.name]]
        return bool(gained)

    await eventually(taken_over, NOTIFY_WITHIN_S, what=f"a survivor acquires the lease ({acquired})")
    assert await _sole_lease_holder(survivors) in gained


async def _acquisitions(replica: Replica) -> float:
    return (await replica.metrics()).total("mcp_sidecar_lease_acquisitions_total")


# -- 4. Redis goes away and comes back ---------------------------------------------------------------------------------


async def _degraded(replica: Replica) -> bool:
    status, body = await replica.readyz()
    return status == 200 and "degraded" in body


async def _coordinated(replica: Replica) -> bool:
    status, body = await replica.readyz()
    return status == 200 and "degraded" not in body and await _gauge(replica, "mcp_sidecar_redis_up") == 1


async def _redis_restart_with_streams_open(
    shop: Upstream, redis: RedisServer, replicas: list[Replica], streams: Streams
) -> list[ListenStream]:
    """Streams on every replica; Redis stopped; a change made while it is down reaches all; Redis started again
    and coordination resumes (every replica up, exactly one lease holder). Returns the streams."""
    everyone = [stream for replica in replicas for stream in await streams.open_many(replica.url, replica.name, 2)]
    await _sole_lease_holder(replicas)

    await redis.stop()
    for replica in replicas:
        await eventually(
            lambda r=replica: _degraded(r), START_TIMEOUT_S, what=f"{replica.name} reports degraded on /readyz"
        )
    polled = [await _polls(replica) for replica in replicas]
    await shop.set_price(111)
    await all_updated(everyone, URI, NOTIFY_WITHIN_S)  # every replica polls on its own while Redis is down
    for replica, before in zip(replicas, polled, strict=True):
        assert await _polls(replica) > before, f"{replica.name} did not poll while Redis was down"

    await redis.start()  # same port, empty
    for replica in replicas:
        await eventually(
            lambda r=replica: _coordinated(r), START_TIMEOUT_S, what=f"{replica.name} coordinated again (redis_up 1)"
        )
    await _sole_lease_holder(replicas)
    return everyone


async def test_while_redis_is_down_every_replica_polls_locally_and_after_it_returns_one_holds_the_lease(
    shop: Upstream, redis: RedisServer, replicas: list[Replica], streams: Streams
) -> None:
    await _redis_restart_with_streams_open(shop, redis, replicas, streams)
    # Coordination holds: the single holder stays the single holder.
    owner = await _sole_lease_holder(replicas)
    start = await _polls(owner)
    await eventually(lambda: _polls_advanced(owner, start + 5), START_TIMEOUT_S, what=f"{owner.name} keeps polling")
    assert await _lease_holders(replicas) == [owner]


async def _polls_advanced(replica: Replica, target: float) -> bool:
    return await _polls(replica) >= target


async def test_after_a_redis_outage_coordinating_replicas_listen_again_and_the_first_change_reaches_all(
    shop: Upstream, redis: RedisServer, replicas: list[Replica], streams: Streams
) -> None:
    everyone = [stream for replica in replicas for stream in await streams.open_many(replica.url, replica.name, 2)]
    await _sole_lease_holder(replicas)
    await redis.stop()
    await asyncio.sleep(REDIS_OUTAGE_S)  # the scenario: a Redis restart or failover that takes some seconds
    await redis.start()
    for replica in replicas:
        await eventually(
            lambda r=replica: _coordinated(r), START_TIMEOUT_S, what=f"{replica.name} coordinated again (redis_up 1)"
        )
    await _sole_lease_holder(replicas)

    # Every replica that coordinates again (polls only what it owns) must hear the others' changes again.
    channel = Layout().channel(Layout().bucket("resource", URI))
    listening = await redis.subscribers(channel)
    marks = [stream.mark() for stream in everyone]
    await shop.set_price(222)
    outcomes = await asyncio.gather(
        *(stream.wait_update(URI, NOTIFY_WITHIN_S, since=mark) for stream, mark in zip(everyone, marks, strict=True)),
        return_exceptions=True,
    )
    missed = [
        stream.label for stream, outcome in zip(everyone, outcomes, strict=True) if isinstance(outcome, Exception)
    ]
    assert listening == len(replicas) and not missed, (
        f"{listening} of {len(replicas)} replicas subscribed to {channel} once coordinated again; "
        f"streams that missed the change: {missed}"
    )


# -- 5. --workers: one process tree, one port --------------------------------------------------------------------------


# -- 6. the config checks that guard scale-out -------------------------------------------------------------------------


# -- packaging ------------------------------------------------------------------------------------------------------
