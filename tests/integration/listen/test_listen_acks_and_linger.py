"""What a listen's ack honours (exactly what the sidecar will notify), and what a closed stream stops costing.

Real SDK upstreams (subprocesses) behind a sidecar served in-process, the kit's raw listen streams or the SDK
client's `listen()`; waits are on events with bounded timeouts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from mcp import Client

from sidecar.app import HUB, METRICS
from tests.integration.listen_watches import POLLING, PRICE, TTL_MS, polled, polls, watch_count, watches
from tests.kit import (
    ACK,
    TOOLS_CHANGED,
    UPDATED,
    WAIT_S,
    ListenStream,
    eventually,
    headers,
    listen_request,
    listening,
    rpc,
    serve_sidecar,
    sse_messages,
)
from tests.peers import Upstream, start_bare_upstream, start_upstream

# -- 4. the ack lists exactly what is honoured ------------------------------------------------------------


def _tool_names(reply: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in reply["result"]["tools"]]


async def test_a_watched_list_stays_cached_across_polls_that_see_it_unchanged_and_not_past_a_change(
    http: aiohttp.ClientSession,
) -> None:
    # Lists are cached for a minute and polled every 300 ms: an answer dropped on each poll would be a miss.
    async with (
        await start_upstream("modern", list_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling={**POLLING, "max_interval_ms": TTL_MS}) as sidecar,
    ):
        hits = sidecar.app[METRICS].cache_hits
        stream = ListenStream(http, sidecar.url, "tools", None, toolsListChanged=True)
        async with listening(stream) as [ack]:
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            status, first = await rpc(http, sidecar.url, "tools/list")
            assert status == 200, first
            await polled(sidecar, "tools_list", 2)  # both after the answer was cached; neither saw a change
            before = hits._value.get()
            status, again = await rpc(http, sidecar.url, "tools/list")
            assert hits._value.get() == before + 1
            assert _tool_names(again) == _tool_names(first)

            await up.add("tool", "late_tool")
            assert (await stream.next_stamped())["method"] == TOOLS_CHANGED
            status, after = await rpc(http, sidecar.url, "tools/list")
            assert _tool_names(after) == [*_tool_names(first), "late_tool"]


@pytest.mark.invariant(2)
@pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)
async def test_the_ack_leaves_out_unknown_and_unreadable_uris(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        asked = [PRICE, "catalog://nope", "catalog://forbidden", PRICE]
        mixed = ListenStream(http, sidecar.url, 1, asked)
        none_left = ListenStream(http, sidecar.url, 2, ["catalog://nope", "catalog://forbidden"], toolsListChanged=True)
        async with listening(mixed, none_left, at_once=True) as (ack_mixed, ack_none):
            assert ack_mixed["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            # No URI could be honoured: the field is left out, the rest of the filter stands.
            assert ack_none["params"]["notifications"] == {"toolsListChanged": True}
            assert sorted((w.key.kind, w.key.uri) for w in watches(sidecar)) == [
                ("resource", PRICE),
                ("tools_list", None),
            ]
            await up.set_price(130)
            frame = await mixed.next_stamped()
            assert frame["method"] == UPDATED and frame["params"]["uri"] == PRICE


@pytest.mark.invariant(2)
@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_prompts_list_changed_is_left_out_of_the_ack_when_the_upstream_has_no_prompts(era: Any) -> None:
    async with (
        await start_bare_upstream(era, read_ttl_ms=TTL_MS, list_ttl_ms=TTL_MS) as up,
        serve_sidecar(up.url, polling=POLLING) as sidecar,
        Client(sidecar.url, cache=None) as client,
    ):
        async with client.listen(
            tools_list_changed=True,
            prompts_list_changed=True,
            resources_list_changed=True,
            resource_subscriptions=["bare://note"],
        ) as sub:
            assert sub.honored.tools_list_changed is True
            assert sub.honored.resources_list_changed is True
            assert sub.honored.resource_subscriptions == ["bare://note"]
            assert not sub.honored.prompts_list_changed
            kinds = {watch.key.kind for watch in watches(sidecar)}
        assert kinds == {"tools_list", "resources_list", "resource"}  # no prompts/list poller either
        assert not any(entry["method"] == "prompts/list" for entry in await up.log())


@pytest.mark.invariant(2)
@pytest.mark.invariant(4)
async def test_uris_over_the_per_stream_limit_are_left_out_of_the_ack_counted_and_never_notified(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    a1, a2 = "catalog://items/a1", "catalog://items/a2"
    async with serve_sidecar(up.url, polling=POLLING, streams={"max_uris_per_stream": 2}) as sidecar:
        stream = ListenStream(http, sidecar.url, "lim", [PRICE, a1, a2])
        async with listening(stream) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE, a1]}
            rejections = sidecar.app[METRICS].limit_rejections.labels("max_uris_per_stream")._value.get()
            assert rejections == 1
            assert sorted(watch.key.uri for watch in watches(sidecar)) == [a1, PRICE]
            # The price feeds every item: the two honoured URIs change, the dropped one is never announced.
            await up.set_price(120)
            first, second = await stream.next_stamped(), await stream.next_stamped()
            assert {first["params"]["uri"], second["params"]["uri"]} == {PRICE, a1}
            await polled(sidecar, "resource", 4)
            assert stream.pending() == []


# -- 5. linger ----------------------------------------------------------------------------------------------


async def test_a_closed_stream_stops_counting_at_once_and_its_watch_stops_polling_after_the_linger(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    linger_ms = 3000
    polling = {**POLLING, "linger_ms": linger_ms}
    async with serve_sidecar(up.url, polling=polling) as sidecar:
        metrics = sidecar.app[METRICS]
        body = listen_request([PRICE], "x")
        async with http.post(sidecar.url, json=body, headers=headers("subscriptions/listen")) as resp:
            frames = sse_messages(resp)
            async with asyncio.timeout(WAIT_S):
                assert (await anext(frames))["method"] == ACK
            assert metrics.listen_streams._value.get() == 1
            assert metrics.subscriptions._value.get() == 1
            await polled(sidecar, "resource", 1)  # the watch is live and polling

        # The stream stops counting as soon as the sidecar sees the disconnect; its watch lingers.
        await eventually(lambda: metrics.listen_streams._value.get() == 0, within_s=WAIT_S)
        assert metrics.subscriptions._value.get() == 0
        assert sidecar.app[HUB].stream_count == 0
        assert watch_count(sidecar, "resource") == 1

        await eventually(lambda: watch_count(sidecar, "resource") == 0, within_s=WAIT_S)
        assert watches(sidecar) == []

        # Gone means gone: a write through the sidecar (which hints every watch) makes no read of it.
        reads, polls_before = await up.count("resources/read", PRICE), polls(sidecar, "resource")
        status, reply = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert status == 200 and reply["result"]["content"][0]["text"] == "hi"
        await asyncio.sleep((50 + 2 * TTL_MS) / 1000)  # negative check: debounce plus two poll intervals
        assert await up.count("resources/read", PRICE) == reads
        assert polls(sidecar, "resource") == polls_before


async def test_with_no_linger_a_listen_is_still_acked_and_its_watch_goes_when_the_stream_closes(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling={**POLLING, "linger_ms": 0}) as sidecar:
        stream = ListenStream(http, sidecar.url, "z", [PRICE])
        async with listening(stream) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            await up.set_price(170)
            assert (await stream.next_stamped())["params"]["uri"] == PRICE
        await eventually(lambda: watch_count(sidecar, "resource") == 0, within_s=WAIT_S)
