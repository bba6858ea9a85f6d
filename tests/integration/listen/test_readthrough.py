"""The read-through layer against real SDK upstreams: identical reads share one upstream request, fresh
results are reused within the upstream's ttlMs, a private result stays in its authorization context, a
change empties the cache before anyone is told to re-read, and the cache keeps to its bounds.

Upstream reads are counted in the upstream's own request log. A forwarded client read keeps the client's
JSON-RPC id there, while the sidecar's polls and baselines use its own integer ids, so giving client reads
string ids ("burst-17") tells the two apart without timing assumptions.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS
from sidecar.observability.metrics import Metrics
from tests.kit import (
    ACK,
    SUB_ID_KEY,
    UPDATED,
    WAIT_S,
    ListenStream,
    Sidecar,
    eventually,
    headers,
    listen_request,
    read_resource,
    rpc,
    serve_sidecar,
    sse_messages,
    text_of,
)
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
READ = "resources/read"
BURST_S = 60.0
"""Upper bound for a burst of a thousand or more requests on this small machine."""

FAST_POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300, "linger_ms": 100}
"""Polls about every 300 ms whatever ttlMs the upstream grants (ttlMs is clamped to max_interval_ms)."""


# -- helpers -------------------------------------------------------------------------------------------


async def _client_reads(up: Upstream, uri: str, id_prefix: str) -> int:
    """Reads of `uri` that reached the upstream on behalf of clients whose request ids start with `id_prefix`."""
    return sum(
        1
        for entry in await up.log()
        if entry["method"] == READ
        and entry["uri"] == uri
        and isinstance(entry["id"], str)
        and entry["id"].startswith(id_prefix)
    )


def _value(metric: Any) -> float:
    value: float = metric._value.get()
    return value


def _metrics(sidecar: Sidecar) -> Metrics:
    return sidecar.app[METRICS]


async def _open_connections(http: aiohttp.ClientSession, sidecar: Sidecar, count: int) -> None:
    """`count` concurrent `server/discover` requests (answered by the sidecar itself, no upstream read), so
    the session holds that many idle keep-alive connections: a burst then measures the sidecar, not the
    kernel's accept backlog."""
    answers = await asyncio.gather(*(rpc(http, sidecar.url, "server/discover", request_id=i) for i in range(count)))
    assert {status for status, _ in answers} == {200}


# -- single flight ---------------------------------------------------------------------------------------


async def test_a_thousand_concurrent_reads_of_a_public_resource_reach_the_upstream_as_one_read(
    wide_http: aiohttp.ClientSession,
) -> None:
    # A minute of freshness: however long the burst takes on a busy machine, the first answer is still fresh for
    # the last reader, so one upstream read is what single flight and the cache together must give.
    async with await start_upstream("modern", read_ttl_ms=60_000) as up, serve_sidecar(up.url) as sidecar:
        await _open_connections(wide_http, sidecar, 1000)  # the sidecar's probe happens here too
        await up.reset_log()
        started = time.monotonic()
        async with asyncio.timeout(BURST_S):
            answers = await asyncio.gather(
                *(read_resource(wide_http, sidecar.url, PRICE, f"burst-{i}") for i in range(1000))
            )
        print(f"\n1000 concurrent reads in {time.monotonic() - started:.2f} s")
        assert [answer["id"] for answer in answers] == [f"burst-{i}" for i in range(1000)]
        assert {text_of(answer) for answer in answers} == {"price=100"}
        assert await up.count(READ, PRICE) == 1
        assert await up.count(READ) == 1
        metrics = _metrics(sidecar)
        assert _value(metrics.singleflight_joins) + _value(metrics.cache_hits) == 999


async def test_five_hundred_concurrent_private_reads_per_context_are_one_upstream_read_each_and_stay_apart(
    wide_http: aiohttp.ClientSession,
) -> None:
    async with await start_upstream("modern", read_ttl_ms=60_000) as up, serve_sidecar(up.url) as sidecar:
        await _open_connections(wide_http, sidecar, 1000)
        await up.reset_log()
        tokens = ["a", "b"] * 500
        async with asyncio.timeout(BURST_S):
            answers = await asyncio.gather(
                *(read_resource(wide_http, sidecar.url, PROFILE, f"p-{i}", token) for i, token in enumerate(tokens))
            )
        for token, answer in zip(tokens, answers, strict=True):
            assert text_of(answer) == f"profile of {token} v1"
            assert answer["result"]["cacheScope"] == "private"
        entries = [entry for entry in await up.log() if entry["method"] == READ]
        assert sorted(entry["authorization"] for entry in entries) == ["Bearer a", "Bearer b"]


async def test_after_a_change_notified_to_two_thousand_streams_their_simultaneous_rereads_cost_one_upstream_read(
    wide_http: aiohttp.ClientSession,
) -> None:
    # The upstream grants a minute of freshness while the sidecar polls every 300 ms (ttlMs is clamped to
    # max_interval_ms): only invalidation can make the re-reads fresh, and one upstream read can serve them
    # all however long the burst takes on this machine. (With read_ttl_ms=300 the cache entry expires
    # several times during a 2,000-client burst, which lasts seconds here, and each expiry rightly costs
    # a read.)
    clients = 2000
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=FAST_POLLING) as sidecar,
    ):
        acked = 0
        all_acked = asyncio.Event()
        changed = asyncio.Event()
        updated_at: list[float] = []

        async def client(n: int) -> str:
            nonlocal acked
            request_id = f"listen-{n}"
            async with wide_http.post(
                sidecar.url,
                json=listen_request([PRICE], request_id),
                headers=headers("subscriptions/listen"),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as resp:
                assert resp.status == 200, await resp.text()
                frames = sse_messages(resp)
                ack = await anext(frames)
                assert ack["method"] == ACK, ack
                acked += 1
                if acked == clients:
                    all_acked.set()
                update = await anext(frames)
                updated_at.append(time.monotonic())
                assert changed.is_set(), f"an update before the change: {update}"
                assert update["method"] == UPDATED and update["params"]["uri"] == PRICE, update
                assert update["params"]["_meta"][SUB_ID_KEY] == request_id, update
                # The re-read goes out while the stream is still open, as a real client's would.
                return text_of(await read_resource(wide_http, sidecar.url, PRICE, f"reread-{n}"))

        polls = _metrics(sidecar).polls.labels("resource", "ok")
        started = time.monotonic()
        async with asyncio.timeout(BURST_S * 2):
            tasks = [asyncio.create_task(client(n)) for n in range(clients)]
            waiter = asyncio.create_task(all_acked.wait())
            done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            assert waiter in done, [task.exception() for task in done if task is not waiter]
            opened = time.monotonic()
            warm = await rpc(wide_http, sidecar.url, READ, {"uri": PRICE}, request_id="warm")
            assert text_of(warm[1]) == "price=100"  # the cache now holds the old price, for a minute
            polls_before = _value(polls)
            changed.set()
            await up.set_price(107)
            changed_at = time.monotonic()
            texts = await asyncio.gather(*tasks)
            finished = time.monotonic()
        print(
            f"\n{clients} streams: opened in {opened - started:.2f} s; change to first update "
            f"{min(updated_at) - changed_at:.2f} s; first update to last re-read {finished - min(updated_at):.2f} s; "
            f"{_value(polls) - polls_before:.0f} polls meanwhile"
        )
        assert texts == ["price=107"] * clients
        # Client reads keep their ids upstream, so the sidecar's own polls are not counted here.
        assert await _client_reads(up, PRICE, "reread-") == 1


async def test_with_ttl_zero_every_sequential_read_reaches_the_upstream() -> None:
    async with aiohttp.ClientSession() as http:
        async with await start_upstream("modern", read_ttl_ms=0) as up, serve_sidecar(up.url) as sidecar:
            for i in range(20):
                answer = await read_resource(http, sidecar.url, PRICE, f"seq-{i}")
                assert text_of(answer) == "price=100"
                assert not answer["result"].get("ttlMs")
            assert await _client_reads(up, PRICE, "seq-") == 20
            assert await up.count(READ) == 20
            assert _value(_metrics(sidecar).cache_hits) == 0


# -- bounds ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_entries", "max_bytes"),
    [(50, 20_000), (10_000, 2_000)],
    ids=["entry-bound", "byte-bound"],
)
async def test_the_cache_stays_within_its_bounds_under_a_stream_of_distinct_uris(
    max_entries: int, max_bytes: int
) -> None:
    cache = {"max_entries": max_entries, "max_bytes": max_bytes}
    async with (
        aiohttp.ClientSession() as http,
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, cache=cache) as sidecar,
    ):
        metrics = _metrics(sidecar)
        for i in range(500):
            answer = await read_resource(http, sidecar.url, f"catalog://items/sku-{i}", f"fill-{i}")
            assert text_of(answer) == f"item sku-{i} costs 100"
            assert _value(metrics.cache_bytes) <= max_bytes
        assert await _client_reads(up, "catalog://items/sku-499", "fill-") == 1
        assert _value(metrics.cache_evictions) > 0
        assert 0 < _value(metrics.cache_bytes) <= max_bytes
        await up.reset_log()

        hits = _value(metrics.cache_hits)
        recent = await read_resource(http, sidecar.url, "catalog://items/sku-499", "again-499")
        assert text_of(recent) == "item sku-499 costs 100"
        assert _value(metrics.cache_hits) == hits + 1
        assert await up.count(READ) == 0, "the most recent sku should have been served from the cache"

        oldest = await read_resource(http, sidecar.url, "catalog://items/sku-0", "again-0")
        assert text_of(oldest) == "item sku-0 costs 100"
        assert await up.count(READ, "catalog://items/sku-0") == 1, "the oldest sku should have been evicted"
        assert _value(metrics.cache_bytes) <= max_bytes


async def test_an_entry_bound_of_fifty_keeps_exactly_the_fifty_most_recently_used() -> None:
    async with (
        aiohttp.ClientSession() as http,
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, cache={"max_entries": 50, "max_bytes": 1_000_000}) as sidecar,
    ):
        for i in range(100):
            await read_resource(http, sidecar.url, f"catalog://items/sku-{i}", f"fill-{i}")
        await up.reset_log()
        for i in (99, 50):  # the newest and the oldest of the fifty kept
            await read_resource(http, sidecar.url, f"catalog://items/sku-{i}", f"again-{i}")
        assert await up.count(READ) == 0
        await read_resource(http, sidecar.url, "catalog://items/sku-49", "again-49")  # the newest evicted one
        assert await up.count(READ, "catalog://items/sku-49") == 1
        assert _value(_metrics(sidecar).cache_evictions) == 51


# -- invalidation ----------------------------------------------------------------------------------------


async def test_a_public_change_empties_the_cache_before_the_notification_so_the_reread_is_fresh() -> None:
    async with (
        aiohttp.ClientSession() as http,
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=FAST_POLLING) as sidecar,
    ):
        listen = await ListenStream.connect(http, sidecar.url, "price-watch", [PRICE])
        try:
            first = await read_resource(http, sidecar.url, PRICE, "before-1")
            again = await read_resource(http, sidecar.url, PRICE, "before-2")
            assert text_of(first) == text_of(again) == "price=100"
            assert await _client_reads(up, PRICE, "before-") == 1, "the second read should come from the cache"
            assert again["result"]["ttlMs"] > 50_000  # without invalidation it would be served for a minute

            await up.set_price(120)
            await listen.next_update()
            after = await read_resource(http, sidecar.url, PRICE, "after-1")
            assert text_of(after) == "price=120"
            assert await _client_reads(up, PRICE, "after-") == 1
            # ... and the fresh answer is what the cache holds now.
            assert text_of(await read_resource(http, sidecar.url, PRICE, "after-2")) == "price=120"
            assert await _client_reads(up, PRICE, "after-") == 1
        finally:
            await listen.close()


# -- listen streams: found while writing the tests above -----------------------------------------------


async def test_a_listen_stream_that_ended_leaves_no_task_behind() -> None:
    async with (
        aiohttp.ClientSession() as http,
        await start_upstream("modern") as up,
        serve_sidecar(up.url, polling=FAST_POLLING) as sidecar,
    ):
        before = asyncio.all_tasks()
        listen = await ListenStream.connect(http, sidecar.url, "short-lived", [PRICE])
        await listen.close()
        await eventually(lambda: _value(_metrics(sidecar).listen_streams) == 0, within_s=WAIT_S)
        await asyncio.sleep(0)  # let any cancellation the stream's end started run
        # Keep-alives come from one ticker for every stream (started with the first); the client's connection may
        # stay open for its next request. Nothing else the stream started may outlive it.
        left = [
            task
            for task in asyncio.all_tasks() - before
            if task.get_name() != "sse-keepalive" and "RequestHandler.start" not in repr(task.get_coro())
        ]
        assert left == []


# -- private results: a property over interleaved users ------------------------------------------------
