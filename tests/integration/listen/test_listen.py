"""Listen streams through the sidecar, against real SDK upstreams that cannot push."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated

from sidecar.app import HUB, METRICS, REGISTRY
from tests.kit import SUB_ID_KEY, Sidecar, eventually, headers, request, serve_sidecar, sse_messages
from tests.peers import Upstream, start_upstream

FAST = {
    "min_interval_ms": 100,
    "default_interval_ms": 300,
    "linger_ms": 100,
    "backoff_initial_ms": 100,
    "backoff_max_ms": 500,
}


async def _open(http: aiohttp.ClientSession, sidecar: Sidecar, request_id: Any, **notifications: Any) -> Any:
    return await http.post(
        sidecar.url,
        json=request("subscriptions/listen", {"notifications": notifications}, request_id),  # as given
        headers=headers("subscriptions/listen"),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )


async def _read(client: Client, uri: str = "catalog://price") -> str:
    result = await client.read_resource(uri)
    return result.contents[0].text  # type: ignore[union-attr]


async def _next_update(sub: Any) -> Any:
    async with asyncio.timeout(15):
        async for event in sub:
            if isinstance(event, ResourceUpdated):
                return event
    raise AssertionError("the stream ended without an update")


@pytest.mark.invariant(6)
@pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)
async def test_a_change_while_listening_is_notified_and_the_reread_is_fresh(fast_upstream: Upstream) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar, Client(sidecar.url, cache=None) as client:
        async with client.listen(resource_subscriptions=["catalog://price"]) as sub:
            assert sub.honored.resource_subscriptions == ["catalog://price"]
            assert await _read(client) == "price=100"
            await fast_upstream.set_price(120)
            event = await _next_update(sub)
            assert event.uri == "catalog://price"
            assert await _read(client) == "price=120"


@pytest.mark.invariant(5)
async def test_a_change_while_disconnected_is_seen_on_the_read_after_listening_again() -> None:
    # The answer is cached for a minute and the watch lingers for a minute, unpolled, after the stream ends:
    # the change made while nobody listens can reach the read only through the look the new listen makes.
    lingering = {**FAST, "linger_ms": 60_000}
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=lingering) as sidecar,
        Client(sidecar.url, cache=None) as client,
    ):
        async with client.listen(resource_subscriptions=["catalog://price"]):
            assert await _read(client) == "price=100"
        await up.set_price(140)
        assert len(list(sidecar.app[REGISTRY].watches())) == 1  # lingering: the listen below rejoins it
        async with client.listen(resource_subscriptions=["catalog://price"]) as sub:
            assert sub.honored.resource_subscriptions == ["catalog://price"]
            assert await _read(client) == "price=140"


@pytest.mark.invariant(6)
async def test_polls_that_see_the_baseline_are_no_change_and_the_first_real_change_is(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        metrics = sidecar.app[METRICS]
        changes, polls = metrics.changes.labels("resource"), metrics.polls.labels("resource", "ok")
        async with await _open(http, sidecar, "b", resourceSubscriptions=["catalog://price"]) as resp:
            frames = sse_messages(resp)
            await anext(frames)
            await eventually(lambda: polls._value.get() >= 2)  # the first polls saw what the baseline saw
            assert changes._value.get() == 0
            await fast_upstream.set_price(125)
            update = await asyncio.wait_for(anext(frames), 15)  # the first frame after the ack
            assert update["method"] == "notifications/resources/updated"
            assert changes._value.get() == 1


async def test_two_quick_changes_give_at_least_one_update_and_the_last_value() -> None:
    # Cached for a minute, so a read shows a new value only once the watch has seen it. The second change comes
    # once the sidecar has seen the first, before the client has taken its update.
    polling = {**FAST, "max_interval_ms": 300}
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=polling) as sidecar,
        Client(sidecar.url, cache=None) as client,
    ):
        changes = sidecar.app[METRICS].changes.labels("resource")
        async with client.listen(resource_subscriptions=["catalog://price"]) as sub:
            assert await _read(client) == "price=100"
            await up.set_price(150)
            await eventually(lambda: changes._value.get() >= 1)
            await up.set_price(160)
            await _next_update(sub)
            async with asyncio.timeout(15):
                while await _read(client) != "price=160":
                    await _next_update(sub)
            # The client has re-read the last value: a change after that is told again, not merged into the past.
            await up.set_price(170)
            await _next_update(sub)
            assert await _read(client) == "price=170"


@pytest.mark.invariant(1)
@pytest.mark.invariant(3)
@pytest.mark.parametrize("listen_id", [7, "l-1"], ids=["number", "string"])
async def test_every_frame_carries_the_listen_id_with_its_type(
    fast_upstream: Upstream, http: aiohttp.ClientSession, listen_id: Any
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        async with await _open(http, sidecar, listen_id, resourceSubscriptions=["catalog://price"]) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert resp.headers["Cache-Control"] == "no-cache"
            assert resp.headers["X-Accel-Buffering"] == "no"
            frames = sse_messages(resp)
            ack = await anext(frames)
            await fast_upstream.set_price(121)
            update = await asyncio.wait_for(anext(frames), 15)
            await sidecar.runner.shutdown()  # graceful end: the complete result closes the stream
            final = await asyncio.wait_for(anext(frames), 15)
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert update["method"] == "notifications/resources/updated"
    complete = {"resultType": "complete", "_meta": {SUB_ID_KEY: listen_id}}
    assert final == {"jsonrpc": "2.0", "id": listen_id, "result": complete}
    for frame in (ack, update):
        assert frame["params"]["_meta"][SUB_ID_KEY] == listen_id
        assert type(frame["params"]["_meta"][SUB_ID_KEY]) is type(listen_id)
    assert set(update["params"]) == {"_meta", "uri"}  # a signal, never content (invariant 1)


@pytest.mark.invariant(1)
@pytest.mark.invariant(13)
async def test_shutdown_ends_every_stream_with_the_complete_result(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        responses = [await _open(http, sidecar, i, resourceSubscriptions=["catalog://price"]) for i in range(5)]
        streams = [sse_messages(resp) for resp in responses]
        for stream in streams:
            assert (await anext(stream))["method"] == "notifications/subscriptions/acknowledged"
        await sidecar.runner.shutdown()
        for i, stream in enumerate(streams):
            final = await asyncio.wait_for(anext(stream), 15)
            assert final["id"] == i and final["result"]["resultType"] == "complete"
            with pytest.raises(StopAsyncIteration):
                await anext(stream)
        for resp in responses:
            resp.release()


@pytest.mark.invariant(12)
async def test_a_quiet_stream_gets_keepalive_comments(fast_upstream: Upstream, http: aiohttp.ClientSession) -> None:
    # The rule is a comment every quiet interval, not one: several in a row, nothing else between them, however
    # long the machine takes to write them (the wait is bounded, never a count over a window).
    async with serve_sidecar(fast_upstream.url, polling=FAST, streams={"keepalive_s": 0.2}) as sidecar:
        async with await _open(http, sidecar, 1, resourceSubscriptions=["catalog://price"]) as resp:
            lines: list[bytes] = []
            async with asyncio.timeout(30):
                async for raw in resp.content:
                    if raw.strip():
                        lines.append(raw.strip())
                    if sum(line.startswith(b":") for line in lines) == 3:
                        break
            assert lines[0].startswith(b"data: ") and lines[1:] == [b": ping"] * 3, lines
            assert sidecar.app[METRICS].keepalives._value.get() >= 3


@pytest.mark.invariant(2)
@pytest.mark.parametrize(
    "notifications",
    [
        {"resourceSubscriptions": "catalog://price"},
        {"resourceSubscriptions": [42]},
        {"resourceSubscriptions": ["not a uri"]},
        {"toolsListChanged": "yes"},
    ],
    ids=["uris-not-a-list", "uri-not-a-string", "not-a-uri", "flag-not-a-boolean"],
)
async def test_a_malformed_filter_is_invalid_params_before_any_stream(
    fast_upstream: Upstream, http: aiohttp.ClientSession, notifications: dict[str, Any]
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        async with await _open(http, sidecar, "bad", **notifications) as resp:
            assert resp.status == 400
            body = await resp.json()
    assert body["id"] == "bad" and body["error"]["code"] == -32602


async def test_listen_without_notifications_is_invalid_params(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        body = request("subscriptions/listen", {}, 3)
        async with http.post(sidecar.url, json=body, headers=headers("subscriptions/listen")) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == -32602


async def test_streams_over_the_limit_are_refused_and_existing_ones_are_untouched(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST, streams={"max_streams": 2}) as sidecar:
        first = await _open(http, sidecar, 1, resourceSubscriptions=["catalog://price"])
        second = await _open(http, sidecar, 2, resourceSubscriptions=["catalog://price"])
        frames = sse_messages(first)
        await anext(frames)
        async with await _open(http, sidecar, 3, resourceSubscriptions=["catalog://price"]) as third:
            assert third.status == 503
            assert (await third.json())["error"]["code"] == -32603
        await fast_upstream.set_price(130)
        update = await asyncio.wait_for(anext(frames), 15)
        assert update["method"] == "notifications/resources/updated"
        assert sidecar.app[METRICS].limit_rejections.labels("max_streams")._value.get() == 1
        first.release()
        second.release()


async def test_a_write_through_the_sidecar_is_notified_without_waiting_for_the_poll(
    http: aiohttp.ClientSession,
) -> None:
    # A 60 s interval: an update within the test's timeout can only come from revalidate-on-write.
    slow = {"default_interval_ms": 60_000, "min_interval_ms": 100}
    async with await start_upstream("modern", read_ttl_ms=60_000) as up, serve_sidecar(up.url, polling=slow) as sidecar:
        async with Client(sidecar.url, cache=None) as client:
            async with client.listen(resource_subscriptions=["catalog://price"]) as sub:
                await client.call_tool("set_price", {"value": 175})
                event = await _next_update(sub)
                assert event.uri == "catalog://price"
                assert await _read(client) == "price=175"


@pytest.mark.invariant(14)
@pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)
async def test_an_upstream_outage_keeps_streams_open_and_loses_no_change(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        async with await _open(http, sidecar, "o", resourceSubscriptions=["catalog://price"]) as resp:
            frames = sse_messages(resp)
            await anext(frames)
            await fast_upstream.set_price(120)
            assert (await asyncio.wait_for(anext(frames), 15))["method"] == "notifications/resources/updated"
            await fast_upstream.kill()

            async def not_ready() -> bool:
                async with http.get(f"{sidecar.base_url}/readyz") as ready:
                    return ready.status == 503

            await eventually(not_ready)
            # The restarted upstream has lost its state: price=100 again, a change from 120.
            await fast_upstream.restart()
            update = await asyncio.wait_for(anext(frames), 20)
            assert update["method"] == "notifications/resources/updated"
            assert update["params"]["uri"] == "catalog://price"


async def test_hub_counts_streams_back_to_zero_when_clients_leave(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        hub = sidecar.app[HUB]
        for i in range(10):
            async with await _open(http, sidecar, i, resourceSubscriptions=["catalog://price"]) as resp:
                await anext(sse_messages(resp))
        await eventually(lambda: hub.stream_count == 0)
        assert sidecar.app[METRICS].listen_streams._value.get() == 0


@pytest.mark.invariant(14)
async def test_the_upstream_answering_again_makes_a_backed_off_watch_look_at_once(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    # A minute of backoff after the first failed poll: a change made during the outage can reach the stream
    # within the test only through the recovery (the first answer after the outage makes every failing watch
    # look again), never through the backoff running out.
    backing_off = {**FAST, "backoff_initial_ms": 60_000, "backoff_max_ms": 60_000}
    async with serve_sidecar(fast_upstream.url, polling=backing_off) as sidecar:
        async with await _open(http, sidecar, "r", resourceSubscriptions=["catalog://price"]) as resp:
            frames = sse_messages(resp)
            await anext(frames)
            await fast_upstream.set_price(120)
            assert (await asyncio.wait_for(anext(frames), 15))["method"] == "notifications/resources/updated"
            failed = sidecar.app[METRICS].polls.labels("resource", "error")
            await fast_upstream.kill()
            await eventually(lambda: failed._value.get() >= 1)
            await fast_upstream.restart()  # price=100 again: a change from 120
            async with http.post(sidecar.url, json=request("tools/list", {}, "t"), headers=headers("tools/list")) as r:
                assert r.status == 200  # the upstream answers again
            update = await asyncio.wait_for(anext(frames), 20)
            assert update["params"]["uri"] == "catalog://price"
