"""No replay for a joiner (invariant 5): a client that left while another stream kept the watch live, and listens
again, joins that live watch. Its read after the ack is fresh, its own stream is told nothing of the change made
while it was away, and the stream that stayed is (the joiner's look found it). The twin that rejoins a lingering
watch nobody holds is in test_listen.py.

Raw listen streams (the kit's client), the SDK shop upstream with its reads cached a minute.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.kit import ListenStream, eventually, read_resource, serve_sidecar, text_of
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
SLOW = {"default_interval_ms": 60_000, "max_interval_ms": 60_000, "min_interval_ms": 50, "linger_ms": 60_000}
"""The live watch is polled once a minute: only the joiner's look can make a read fresh within the test."""
QUICK_COMMENTS = {"keepalive_s": 0.2}
"""A quiet stream hears a comment every 0.2 s: the marks that a whole quiet interval went by."""


@pytest.fixture
async def cached_shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=60_000, list_ttl_ms=60_000) as up:
        yield up


@pytest.mark.invariant(5)
async def test_listening_again_beside_a_stream_that_kept_the_watch_reads_what_changed_and_is_told_nothing_of_it(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar:
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()
        try:
            first = ListenStream(http, sidecar.url, "first", [PRICE])
            await first.open()
            assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
            await first.close()
            await cached_shop.set_price(140)  # while the client is away; the keeper holds the watch live
            again = ListenStream(http, sidecar.url, "again", [PRICE])
            await again.open()  # joins the live watch: its ack waits for its own look
            try:
                assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
                await keeper.wait_update(PRICE)  # the joiner's look found the change for the stream that stayed
                # The returning client recovers by that read; its new stream replays nothing: a whole quiet
                # interval (two comments) goes by with nothing on it.
                comments = len(again.comment_times)
                await eventually(lambda: len(again.comment_times) >= comments + 2, what="two keep-alive comments")
                assert again.pending() == []
            finally:
                await again.close()
        finally:
            await keeper.close()
