"""The invariants on a stream that listens to list kinds only (1, 3, 4, 6, 8, 13 and 16): a list change is a signal
carrying the listen id and nothing else, only for the kinds the stream asked for; polls that see the baseline tell
nothing; many streams of one list kind share its reads; shutdown ends the stream with the complete result; and
joining a live list watch is a sync point. Their twins on resource streams are in test_listen.py,
test_listen_contexts_and_lists.py and test_coherence.py.

Raw listen streams (the kit's client), the SDK shop upstream whose lists are changed through its admin routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS
from sidecar.config.sections import DEFAULT_JITTER
from tests.integration.listen_watches import answered, most_in_flight
from tests.kit import SUB_ID_KEY, ListenStream, eventually, listening, rpc, serve_sidecar
from tests.kit.polling import FAST, SLOW
from tests.peers import Upstream, start_upstream


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=300, list_ttl_ms=300) as up:
        yield up


def _list_changed(kind: str, listen_id: Any) -> dict[str, Any]:
    method = f"notifications/{kind}/list_changed"
    return {"jsonrpc": "2.0", "method": method, "params": {"_meta": {SUB_ID_KEY: listen_id}}}


@pytest.mark.invariant(1)
@pytest.mark.invariant(3)
@pytest.mark.invariant(13)
@pytest.mark.parametrize("listen_id", [7, "l-1"], ids=["number", "string"])
async def test_a_list_change_is_a_bare_signal_with_the_listen_id_and_shutdown_completes_the_stream(
    shop: Upstream, http: aiohttp.ClientSession, listen_id: Any
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        stream = ListenStream(http, sidecar.url, listen_id, toolsListChanged=True, promptsListChanged=True)
        ack = await stream.open()
        try:
            assert ack["params"]["notifications"] == {"toolsListChanged": True, "promptsListChanged": True}
            await shop.add("tool", "fresh")
            told = await stream.next()
            assert told == _list_changed("tools", listen_id)
            assert type(told["params"]["_meta"][SUB_ID_KEY]) is type(listen_id)
            await shop.add("prompt", "fresh")
            assert await stream.next() == _list_changed("prompts", listen_id)
            await sidecar.runner.shutdown()
            final = await stream.next()
            complete = {"resultType": "complete", "_meta": {SUB_ID_KEY: listen_id}}
            assert final == {"jsonrpc": "2.0", "id": listen_id, "result": complete}
            assert type(final["id"]) is type(listen_id)
        finally:
            await stream.close()


@pytest.mark.invariant(4)
async def test_a_stream_of_one_list_kind_hears_nothing_of_another_kind_or_of_resources(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        prompts = ListenStream(http, sidecar.url, "prompts", promptsListChanged=True)
        everything = ListenStream(
            http, sidecar.url, "all", ["catalog://price"], toolsListChanged=True, promptsListChanged=True
        )
        await prompts.open()
        await everything.open()
        try:
            await shop.add("tool", "fresh")  # a tools change...
            await shop.set_price(140)  # ...and a resource's
            told = {(await everything.next())["method"] for _ in range(2)}
            assert told == {"notifications/tools/list_changed", "notifications/resources/updated"}
            # Had either reached the prompts stream, it would sit before this prompts change.
            await shop.add("prompt", "fresh")
            assert (await everything.next())["method"] == "notifications/prompts/list_changed"
            assert await prompts.next() == _list_changed("prompts", "prompts")
        finally:
            await prompts.close()
            await everything.close()


@pytest.mark.invariant(16)
async def test_joining_a_live_tools_list_watch_is_a_sync_point_the_next_list_read_is_fresh(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=SLOW) as sidecar:
        keeper = ListenStream(http, sidecar.url, "keeper", toolsListChanged=True)
        await keeper.open()  # the list watch is live, polled once a minute
        try:
            status, listed = await rpc(http, sidecar.url, "tools/list")  # cached a minute
            assert status == 200
            before = {tool["name"] for tool in listed["result"]["tools"]}
            await cached_shop.add("tool", "fresh")
            joiner = ListenStream(http, sidecar.url, "joiner", toolsListChanged=True)
            await joiner.open()  # its ack waits for a look that started after it asked
            try:
                status, listed = await rpc(http, sidecar.url, "tools/list")
                assert {tool["name"] for tool in listed["result"]["tools"]} == before | {"fresh"}
                assert await keeper.next() == _list_changed("tools", "keeper")  # the joiner's look found it
            finally:
                await joiner.close()
        finally:
            await keeper.close()


@pytest.mark.invariant(6)
async def test_polls_that_see_a_lists_baseline_tell_nothing_and_its_first_change_is_told(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        polled = sidecar.app[METRICS].polls.labels("tools_list", "ok")
        stream = ListenStream(http, sidecar.url, "tools", toolsListChanged=True)
        await stream.open()
        try:
            seen = polled._value.get()
            await eventually(lambda: polled._value.get() >= seen + 3)  # three polls that saw the baseline
            await shop.add("tool", "fresh")
            assert await stream.next() == _list_changed("tools", "tools")  # a spurious change would come first
            await eventually(lambda: polled._value.get() >= seen + 6)
            assert stream.pending() == []
        finally:
            await stream.close()


@pytest.mark.invariant(8)
async def test_sixty_streams_of_the_tools_list_share_its_first_read_and_one_read_per_poll(shop: Upstream) -> None:
    connector = aiohttp.TCPConnector(limit=0)  # a connection per stream
    async with serve_sidecar(shop.url, polling=FAST) as sidecar, aiohttp.ClientSession(connector=connector) as http:
        streams = [ListenStream(http, sidecar.url, n, toolsListChanged=True) for n in range(60)]
        async with listening(*streams, at_once=True):
            # Joining cost by the upstream's own times: the first read, shared, and the joiners' sync point (16),
            # one look shared by every listen arriving while it is in flight; never more of them in hand at once.
            joining: list[dict[str, Any]] = []

            async def joined() -> bool:
                joining[:] = [entry for entry in await shop.log() if entry["method"] == "tools/list"]
                return answered(joining)

            await eventually(joined)
            assert most_in_flight(joining) <= 2
            # Steady cost: one read per poll interval that passed (300 ms less its jitter at the shortest), not one
            # per stream, by the upstream's clock.
            polled = sidecar.app[METRICS].polls.labels("tools_list", "ok")
            seen = polled._value.get()
            await eventually(lambda: polled._value.get() >= seen + 3)
            steady = [entry for entry in await shop.log() if entry["method"] == "tools/list"][len(joining) :]
            shortest_s = 0.3 * (1 - DEFAULT_JITTER)
            assert len(steady) >= 3
            assert len(steady) <= (steady[-1]["at"] - steady[0]["at"]) / shortest_s + 1
            await shop.add("tool", "fresh")
            told = [await stream.next() for stream in streams]
            assert told == [_list_changed("tools", n) for n in range(60)]
