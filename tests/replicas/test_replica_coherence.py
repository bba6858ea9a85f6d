"""Coherence across replicas (invariants 16 and 17 on Redis): a notification or an ack from one replica
promises a fresh read from any replica, and a lease handover loses no change and invents none.

Real redis-server, three sidecar processes, the SDK shop upstream (a public price cached for a minute, so a
stale answer would last), and nginx in front where a client would not know which replica it reaches.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.observability.logs import INSTANCE_ENV
from tests.cluster import (
    RedisServer,
    Replica,
    free_port,
    instances_where_first_polls,
    nginx_proxy,
    sidecar_config,
    sidecar_replicas,
)
from tests.kit import ListenStream, eventually, rpc
from tests.peers import Upstream
from tests.procs import START_TIMEOUT_S

PRICE = "catalog://price"
WITHIN_S = 10.0
CACHED = {"polling": {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300}}
"""Polls every 300 ms while the upstream's ttlMs (a minute) keeps each replica's cached answer."""

READ_TTL_MS = 60_000
"""Reads are cached a minute: only a change the watch sees refreshes them (the `shop` fixture's ttlMs)."""


@pytest.fixture
async def replicas(tmp_path: Path, shop: Upstream, redis: RedisServer) -> AsyncIterator[list[Replica]]:
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 3, **CACHED) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        yield session


async def _price(http: aiohttp.ClientSession, url: str) -> str:
    status, message = await rpc(http, url, "resources/read", {"uri": PRICE})
    assert status == 200, message
    text: str = message["result"]["contents"][0]["text"]
    return text


@pytest.mark.invariant(17)
async def test_after_a_notification_every_replica_serves_the_new_value(
    shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    stream = await ListenStream.connect(http, replicas[0].url, "l", [PRICE])
    try:
        previous = "price=100"
        for price in range(150, 160):
            for replica in replicas:  # every replica holds the old answer in its cache
                assert await _price(http, replica.url) == previous
            previous = f"price={price}"
            mark = stream.mark()
            await shop.set_price(price)
            await stream.wait_update(PRICE, WITHIN_S, since=mark)
            for replica in replicas:  # told by one replica: every replica's cache let go first
                assert await _price(http, replica.url) == f"price={price}", replica.name
    finally:
        await stream.aclose()


@pytest.mark.invariant(17)
async def test_a_listener_on_one_replica_reads_fresh_from_another_that_cached_before_anyone_watched(
    shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    first, second = replicas[0], replicas[1]
    assert await _price(http, first.url) == "price=100"  # cached on the first; nobody watches yet
    await shop.set_price(140)
    stream = await ListenStream.connect(http, second.url, "b", [PRICE])  # its first look sees 140
    try:
        assert await _price(http, first.url) == "price=140"
    finally:
        await stream.aclose()


@pytest.mark.invariant(16)
async def test_through_nginx_a_client_that_read_and_left_listens_again_and_reads_the_new_value(
    tmp_path: Path, shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    async with nginx_proxy(tmp_path, [replica.port for replica in replicas]) as lb:
        await shop.set_price(120)
        stream = await ListenStream.connect(http, lb.url, "l-1", [PRICE])
        assert {await _price(http, lb.url) for _ in replicas} == {"price=120"}
        await stream.aclose()
        await shop.set_price(140)
        stream = await ListenStream.connect(http, lb.url, "l-2", [PRICE])
        try:
            assert {await _price(http, lb.url) for _ in range(6)} == {"price=140"}
        finally:
            await stream.aclose()


async def _lease_owner(replicas: list[Replica]) -> Replica:
    async def one() -> bool:
        held = [(await replica.metrics()).total("mcp_sidecar_leases_held") for replica in replicas]
        return held.count(1) == 1

    await eventually(one, START_TIMEOUT_S, what="exactly one replica holds the lease")
    for replica in replicas:
        if (await replica.metrics()).total("mcp_sidecar_leases_held") == 1:
            return replica
    raise AssertionError("the lease holder went away")


async def test_an_owner_killed_after_seeing_a_change_and_before_telling_it_loses_nothing(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    # The owner is started holding every change it sees before publishing it (a test seam), then killed there;
    # named so that rendezvous hashing keeps the key with it when the others' interest arrives.
    names = instances_where_first_polls(PRICE, 3)
    async with contextlib.AsyncExitStack() as stack:
        owner = await _holding_owner(stack, tmp_path, shop, redis, http, {INSTANCE_ENV: names[0]})
        survivors = await stack.enter_async_context(
            sidecar_replicas(tmp_path / "more", shop.url, redis.url, 2, instances=names[1:], **CACHED)
        )
        streams = [await ListenStream.connect(http, replica.url, replica.name, [PRICE]) for replica in survivors]
        for stream in streams:
            stack.push_async_callback(stream.aclose)

        await shop.set_price(177)
        await eventually(
            lambda: _logged(owner, "holding a change before publishing it"),
            START_TIMEOUT_S,
            what="the owner saw the change and holds it",
        )
        await owner.service.kill()  # kill -9 between seeing and telling
        for stream in streams:  # a survivor takes the lease, polls at once, and tells the change
            update = await stream.wait_update(PRICE, WITHIN_S)
            assert update["params"]["uri"] == PRICE
        assert {await _price(http, replica.url) for replica in survivors} == {"price=177"}


async def _holding_owner(
    stack: contextlib.AsyncExitStack,
    tmp_path: Path,
    shop: Upstream,
    redis: RedisServer,
    http: aiohttp.ClientSession,
    env: dict[str, str] | None = None,
) -> Replica:
    """A replica started holding every change it sees before publishing it (a test seam), listening to the price
    and polling it (its owner); stopped with `stack`."""
    config = sidecar_config(shop.url, free_port(), redis.url, **CACHED)
    owner = Replica(
        "owner", tmp_path / "owner", config, env={"MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH": "1", **(env or {})}
    )
    await owner.start()
    stack.push_async_callback(owner.service.stop)
    owner_stream = await ListenStream.connect(http, owner.url, "o", [PRICE])
    stack.push_async_callback(owner_stream.aclose)
    assert await _lease_owner([owner]) is owner
    return owner


async def _logged(replica: Replica, message: str) -> bool:
    return any(str(line.get("msg", "")).startswith(message) for line in replica.log_lines())


async def test_a_new_owner_tells_no_change_its_clients_joined_after(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    # The owner sees a change and dies holding it; the others' clients joined after the change (their first
    # look saw it). The new owner polls at once and finds what its clients saw: nothing to tell; the next
    # change is told once.
    async with contextlib.AsyncExitStack() as stack:
        owner = await _holding_owner(stack, tmp_path, shop, redis, http)
        await shop.set_price(130)
        await eventually(
            lambda: _logged(owner, "holding a change"), START_TIMEOUT_S, what="the owner saw the change and holds it"
        )
        more = sidecar_replicas(tmp_path / "more", shop.url, redis.url, 2, **CACHED)
        others = await stack.enter_async_context(more)
        streams = [await ListenStream.connect(http, replica.url, replica.name, [PRICE]) for replica in others]
        for stream in streams:
            stack.push_async_callback(stream.aclose)
        await owner.service.kill()
        new_owner = await _lease_owner(others)
        polled = (await new_owner.metrics()).total("mcp_sidecar_polls_total", kind="resource", outcome="ok")

        async def polled_since() -> bool:
            now = (await new_owner.metrics()).total("mcp_sidecar_polls_total", kind="resource", outcome="ok")
            return now > polled

        await eventually(polled_since, START_TIMEOUT_S, what="the new owner polled")
        await shop.set_price(131)
        for stream in streams:
            await stream.wait_update(PRICE, WITHIN_S)
            assert len(stream.updates()) == 1, f"{stream.label}: told of a change before its ack: {stream.frames}"
