"""An ack or a notification promises that the next read is fresh (invariants 16 and 17), on one process.

The three sequences a user meets first, written as the user runs them (SDK 2.3 client, SDK 2.3 shop
upstream, a public price whose `ttlMs` is 200 ms or a minute, changed behind the server's back):
1. A reads (now cached); the price changes; B listens, then reads.
2. A client listens and reads, disconnects; the price changes; it listens again at once, then reads.
3. The same while another client keeps the watch alive, polled only once a minute.
Plus: a reconnect storm costs one read per key, a hint never shortens a backoff, and hinted polls stay within
their budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from mcp import Client

from sidecar.app import METRICS
from tests.kit import ListenStream, eventually, rpc, serve_sidecar, waits
from tests.peers import Upstream, start_upstream
from tests.peers.faulty import Fault, FaultyUpstream

PRICE = "catalog://price"
SLOW = {"default_interval_ms": 60_000, "max_interval_ms": 60_000, "min_interval_ms": 50}
"""Nobody's poll comes in time: only the sync point can make the read fresh."""


@pytest.fixture(params=[200, 60_000], ids=["ttl-200ms", "ttl-60s"])
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=request.param) as up:
        yield up


async def _read(client: Client) -> str:
    result = await client.read_resource(PRICE)
    return result.contents[0].text  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def _listening(client: Client) -> AsyncIterator[None]:
    async with client.listen(resource_subscriptions=[PRICE]) as subscription:
        assert subscription.honored.resource_subscriptions == [PRICE]
        yield


@pytest.mark.invariant(17)
async def test_a_new_listener_reads_what_its_first_look_saw_not_an_older_cached_answer(shop: Upstream) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar, Client(sidecar.url, cache=None) as a:
        assert await _read(a) == "price=100"  # cached for the ttl
        await shop.set_price(140)
        async with Client(sidecar.url, cache=None) as b, _listening(b):
            assert await _read(b) == "price=140"


@pytest.mark.invariant(16)
async def test_a_client_that_read_disconnected_and_listens_again_reads_the_new_value(shop: Upstream) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar, Client(sidecar.url, cache=None) as client:
        await shop.set_price(120)
        async with _listening(client):
            assert await _read(client) == "price=120"
        await shop.set_price(140)  # while disconnected; the watch lingers, unpolled
        async with _listening(client):
            assert await _read(client) == "price=140"


@pytest.mark.invariant(16)
async def test_rejoining_a_watch_another_client_keeps_alive_reads_the_new_value_and_tells_the_other(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()
        try:
            async with Client(sidecar.url, cache=None) as client:
                async with _listening(client):
                    assert await _read(client) == "price=100"
                await shop.set_price(140)
                async with _listening(client):
                    assert await _read(client) == "price=140"
            frame = await keeper.next()  # the rejoiner's look found the change: the keeper is told too
            assert frame["params"]["uri"] == PRICE
        finally:
            await keeper.close()


async def test_a_reconnect_storm_costs_one_read_per_key_not_one_per_client() -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as shop,
        serve_sidecar(shop.url, polling=SLOW) as sidecar,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,  # 201 streams at once
    ):
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()
        storm = [ListenStream(http, sidecar.url, n, [PRICE]) for n in range(200)]
        try:
            await shop.reset_log()
            acks = await asyncio.gather(*(stream.open() for stream in storm))
            assert all(ack["params"]["notifications"]["resourceSubscriptions"] == [PRICE] for ack in acks)
            reads = await shop.count("resources/read", PRICE)
            assert 1 <= reads <= 5, f"{reads} upstream reads for 200 clients joining one watch at once"
        finally:
            for stream in [keeper, *storm]:
                await stream.close()


async def test_a_hint_never_shortens_a_backoff(http: aiohttp.ClientSession) -> None:
    polling = {"backoff_initial_ms": 5000, "backoff_max_ms": 5000, "min_interval_ms": 50, "default_interval_ms": 100}
    async with FaultyUpstream() as up, serve_sidecar(up.url, polling=polling) as sidecar:
        keeper = ListenStream(http, sidecar.url, "k", ["ok://a"])
        await keeper.open()
        try:
            failed = sidecar.app[METRICS].polls.labels("resource", "error")
            up.fail(Fault.HTML_500, uri="ok://a")
            await eventually(lambda: failed._value.get() >= 1)
            # Writes every 20 ms for a second hint the failing watch fifty times; the backoff holds it to none but
            # the one early retry when the upstream is seen answering again (a write's success, once a streak).
            for _ in range(50):
                await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
                await asyncio.sleep(0.02)  # paced writes, as a busy client sends them
            assert failed._value.get() <= 2, "hints brought polls of a backing-off watch forward"
            assert len(up.reads("ok://a")) <= 3  # the baseline, the failed poll, the one retry
        finally:
            await keeper.close()


async def test_hinted_polls_beyond_the_budget_are_deferred_not_dropped(http: aiohttp.ClientSession) -> None:
    uris = [f"ok://budget/{n}" for n in range(40)]
    polling = {**SLOW, "max_hinted_polls_per_s": 10}
    async with FaultyUpstream() as up, serve_sidecar(up.url, polling=polling) as sidecar:
        stream = ListenStream(http, sidecar.url, "b", uris)
        await stream.open()
        try:
            metrics = sidecar.app[METRICS]
            polled = metrics.polls.labels("resource", "ok")
            for uri in uris:
                up.contents[uri] = "changed"
            await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})  # hints all 40
            await eventually(lambda: polled._value.get() >= 40, within_s=30)  # every one polled
            assert waits(sidecar, "hinted_polls") >= 25  # most had to wait their turn
            told = {(await stream.next())["params"]["uri"] for _ in uris}
            assert told == set(uris)
        finally:
            await stream.close()


@pytest.mark.invariant(16)
async def test_the_ack_of_a_rejoin_waits_for_its_look_even_when_that_look_is_slow(http: aiohttp.ClientSession) -> None:
    # A minute's ttl and a minute's linger keep the first answer cached and the watch alive, unpolled. From the
    # change on, every read upstream takes a while: an ack sent before the rejoin's look has been applied would
    # let the client's read find the old answer still cached.
    async with (
        FaultyUpstream(ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling={**SLOW, "linger_ms": 60_000}) as sidecar,
    ):
        up.contents[PRICE] = "price=100"
        first = ListenStream(http, sidecar.url, "first", [PRICE])
        await first.open()
        try:
            status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and reply["result"]["contents"][0]["text"] == "price=100"
        finally:
            await first.close()
        up.contents[PRICE] = "price=140"
        up.delays[PRICE] = 1.0
        again = ListenStream(http, sidecar.url, "again", [PRICE])
        ack = await again.open()
        try:
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [PRICE]
            status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and reply["result"]["contents"][0]["text"] == "price=140"
        finally:
            await again.close()
