"""Who shares a watch and who gets which notification: private contexts, public coalescing, the list
kinds, the ack's honoured subset, and what a closed stream stops costing.

Every test drives real SDK upstreams (subprocesses) through a sidecar served in-process, with raw aiohttp
listen streams (a reader task queues every frame after the ack) or the SDK client's `listen()`. Positive
assertions wait on events with bounded timeouts; a negative one ("B got nothing") first waits until the
watches that could have produced the unwanted frame have polled again, then checks nothing arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from mcp import Client

from sidecar.app import HUB, METRICS, REGISTRY
from sidecar.changes import WatchKind
from sidecar.identity import ANONYMOUS, PUBLIC
from sidecar.watch.poller import Watch
from tests.helpers import (
    SUB_ID_KEY,
    Sidecar,
    context_of,
    eventually,
    headers,
    request,
    rpc,
    serve_sidecar,
    sse_messages,
)
from tests.peers import Upstream, start_bare_upstream, start_upstream

TTL_MS = 300
"""read and list ttlMs of the upstreams: the sidecar polls each watch about every 300 ms."""
POLLING = {"min_interval_ms": 100, "default_interval_ms": TTL_MS, "linger_ms": 100}
WAIT_S = 10.0
"""Upper bound for anything that should happen within a poll or two."""

PRICE = "catalog://price"
PROFILE = "catalog://profile"
ACK = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
RESOURCES_CHANGED = "notifications/resources/list_changed"


class Listen:
    """One raw listen stream: `open` returns the ack; a reader task queues every later frame."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        sidecar: Sidecar,
        request_id: Any,
        notifications: dict[str, Any],
        authorization: str | None = None,
    ) -> None:
        self.request_id = request_id
        self._http = http
        self._url = sidecar.url
        self._notifications = notifications
        self._authorization = authorization
        self._frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._response: aiohttp.ClientResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> dict[str, Any]:
        extra = {"Authorization": self._authorization} if self._authorization else {}
        self._response = await self._http.post(
            self._url,
            json=request("subscriptions/listen", {"notifications": self._notifications}, self.request_id),
            headers=headers("subscriptions/listen", **extra),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        assert self._response.status == 200, await self._response.text()
        frames = sse_messages(self._response)
        async with asyncio.timeout(WAIT_S):
            ack = await anext(frames)
        assert ack["method"] == ACK, ack
        assert ack["params"]["_meta"][SUB_ID_KEY] == self.request_id
        self._reader = asyncio.get_running_loop().create_task(self._read(frames))
        return ack

    async def _read(self, frames: AsyncIterator[dict[str, Any]]) -> None:
        async for frame in frames:
            self._frames.put_nowait(frame)

    async def next(self) -> dict[str, Any]:
        """The next frame after the ack; every one must carry this stream's id."""
        async with asyncio.timeout(WAIT_S):
            frame = await self._frames.get()
        assert frame["params"]["_meta"][SUB_ID_KEY] == self.request_id, frame
        return frame

    def received(self) -> list[dict[str, Any]]:
        """Every frame that arrived and was not taken by `next` yet (emptying the queue)."""
        frames = []
        while not self._frames.empty():
            frames.append(self._frames.get_nowait())
        return frames

    async def close(self) -> None:
        """Close the connection: the client cancels its subscription."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await self._reader
        if self._response is not None:
            self._response.close()


@contextlib.asynccontextmanager
async def listening(*streams: Listen) -> AsyncIterator[list[dict[str, Any]]]:
    """Open every stream (concurrently), yield their acks, close them all on the way out."""
    try:
        yield list(await asyncio.gather(*(stream.open() for stream in streams)))
    finally:
        for stream in streams:
            await stream.close()


def polls(sidecar: Sidecar, kind: WatchKind) -> float:
    """Successful polls of watches of this kind so far."""
    value: float = sidecar.app[METRICS].polls.labels(kind, "ok")._value.get()
    return value


def watch_count(sidecar: Sidecar, kind: WatchKind) -> float:
    value: float = sidecar.app[METRICS].watches.labels(kind)._value.get()
    return value


def watches(sidecar: Sidecar) -> list[Watch]:
    return list(sidecar.app[REGISTRY].watches())


async def polled(sidecar: Sidecar, kind: WatchKind, times: int) -> None:
    """Wait until the sidecar has polled watches of `kind` `times` more times (from now)."""
    start = polls(sidecar, kind)
    await eventually(lambda: polls(sidecar, kind) >= start + times, within_s=WAIT_S)


async def watch_polled_twice(watch: Watch) -> None:
    """Wait until this one watch has finished two more polls (the second started after now)."""
    for _ in range(2):
        last = watch.last_poll_at
        await eventually(lambda: watch.last_poll_at != last, within_s=WAIT_S)  # noqa: B023


async def read_text(http: aiohttp.ClientSession, sidecar: Sidecar, uri: str, authorization: str | None = None) -> str:
    extra = {"Authorization": authorization} if authorization else None
    status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": uri}, extra_headers=extra)
    assert status == 200, reply
    text: str = reply["result"]["contents"][0]["text"]
    return text


def reads_of(log: list[dict[str, Any]], uri: str) -> list[dict[str, Any]]:
    return [entry for entry in log if entry["method"] == "resources/read" and entry["uri"] == uri]


@pytest.fixture(params=["modern", "legacy"])
async def fast_upstream(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    """A shop server of either era whose reads and lists have ttlMs 300 (legacy ones carry none)."""
    async with await start_upstream(request.param, read_ttl_ms=TTL_MS, list_ttl_ms=TTL_MS) as up:
        yield up


@pytest.fixture
async def modern_fast_upstream() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=TTL_MS, list_ttl_ms=TTL_MS) as up:
        yield up


# -- 1. private contexts ------------------------------------------------------------------------------


@pytest.mark.invariant(10)
@pytest.mark.invariant(4)
async def test_a_private_resource_changes_only_for_its_owner_and_is_polled_only_with_each_owners_token(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        a = Listen(http, sidecar, "a", {"resourceSubscriptions": [PROFILE]}, authorization="Bearer a")
        b = Listen(http, sidecar, "b", {"resourceSubscriptions": [PROFILE]}, authorization="Bearer b")
        try:
            acks = await asyncio.gather(a.open(), b.open())
            for ack in acks:
                assert ack["params"]["notifications"] == {"resourceSubscriptions": [PROFILE]}
            # Two authorization contexts, two watches: nobody shares a private view.
            by_context = {watch.key.context: watch for watch in watches(sidecar)}
            assert set(by_context) == {context_of(sidecar, "Bearer a"), context_of(sidecar, "Bearer b")}
            assert sidecar.app[METRICS].watched_contexts._value.get() == 2
            watch_b = by_context[context_of(sidecar, "Bearer b")]

            assert await up.bump_profile("a") == "profile of a v2"
            update = await a.next()
            assert update["method"] == UPDATED and update["params"]["uri"] == PROFILE

            # B's own watch has looked at the upstream twice since A heard of the change: B hears nothing.
            await asyncio.gather(polled(sidecar, "resource", 4), watch_polled_twice(watch_b))
            assert b.received() == []
            assert a.received() == []  # one change, one notification

            assert await read_text(http, sidecar, PROFILE, "Bearer a") == "profile of a v2"
            assert await read_text(http, sidecar, PROFILE, "Bearer b") == "profile of b v1"

            # B leaves: its watch lingers 100 ms, then goes, and its token with it.
            await b.close()
            await eventually(lambda: watch_count(sidecar, "resource") == 1, within_s=WAIT_S)
            assert [watch.key.context for watch in watches(sidecar)] == [context_of(sidecar, "Bearer a")]
            assert sidecar.app[METRICS].watched_contexts._value.get() == 1
            after_b_left = len(await up.log())
            await polled(sidecar, "resource", 2)  # A's polls go on
            log = await up.log()
        finally:
            await a.close()
            await b.close()

    reads = reads_of(log, PROFILE)
    assert {entry["authorization"] for entry in reads} == {"Bearer a", "Bearer b"}  # never anonymous
    tokens_before = [entry["authorization"] for entry in reads_of(log[:after_b_left], PROFILE)]
    tokens_after = [entry["authorization"] for entry in reads_of(log[after_b_left:], PROFILE)]
    assert tokens_before.count("Bearer b") >= 3  # B's baseline and polls (and B's own re-read)
    assert tokens_after and set(tokens_after) == {"Bearer a"}  # B's token is not used once B has gone


# -- 2. public coalescing ---------------------------------------------------------------------------------


@pytest.mark.invariant(8)
async def test_two_hundred_anonymous_streams_on_a_public_resource_cost_one_read_per_poll(
    fast_upstream: Upstream,
) -> None:
    up = fast_upstream
    n = 200
    connector = aiohttp.TCPConnector(limit=0)  # one connection per stream; the default pool holds 100
    async with (
        serve_sidecar(up.url, polling=POLLING) as sidecar,
        aiohttp.ClientSession(connector=connector) as http,
    ):
        streams = [Listen(http, sidecar, i, {"resourceSubscriptions": [PRICE]}) for i in range(n)]
        async with listening(*streams) as acks:
            for i, ack in enumerate(acks):
                assert ack["params"]["_meta"][SUB_ID_KEY] == i
                assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            # One watch for all: public, or (a legacy read has no cacheScope) the anonymous context.
            assert [watch.key.context for watch in watches(sidecar)] == [PUBLIC if up.era == "modern" else ANONYMOUS]
            assert sidecar.app[HUB].stream_count == n

            # Joining cost: one first read, then each joiner's sync point (invariant 16), one read shared by every
            # joiner arriving while it is in flight: far fewer reads than streams.
            reads_at_ack = await up.count("resources/read", PRICE)
            assert reads_at_ack - polls(sidecar, "resource") <= n // 10

            # Steady cost: one read per poll, not one per stream.
            reads_before = await up.count("resources/read", PRICE)
            await polled(sidecar, "resource", 3)
            reads_after = await up.count("resources/read", PRICE)
            assert reads_after - reads_before <= 4

            # And one poll that sees a change tells every stream.
            await up.set_price(150)
            updates = await asyncio.gather(*(stream.next() for stream in streams))
            assert all(frame["method"] == UPDATED and frame["params"]["uri"] == PRICE for frame in updates)


# -- 3. list kinds ------------------------------------------------------------------------------------------


@pytest.mark.invariant(4)
async def test_each_list_change_reaches_only_the_stream_that_asked_for_that_list(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        tools = Listen(http, sidecar, "tools", {"toolsListChanged": True})
        prompts = Listen(http, sidecar, "prompts", {"promptsListChanged": True})
        resources = Listen(http, sidecar, "resources", {"resourcesListChanged": True})
        streams = {"tools_list": tools, "prompts_list": prompts, "resources_list": resources}
        async with listening(tools, prompts, resources) as acks:
            assert [ack["params"]["notifications"] for ack in acks] == [
                {"toolsListChanged": True},
                {"promptsListChanged": True},
                {"resourcesListChanged": True},
            ]
            steps: list[tuple[Any, str, WatchKind, str]] = [
                ("tool", "t1", "tools_list", TOOLS_CHANGED),
                ("prompt", "p1", "prompts_list", PROMPTS_CHANGED),
                ("resource", "r1", "resources_list", RESOURCES_CHANGED),
                # A new template changes resources/templates/list, which counts as the resources list.
                ("template", "tt1", "resources_list", RESOURCES_CHANGED),
            ]
            for kind, name, changed, method in steps:
                await up.add(kind, name)
                frame = await streams[changed].next()
                assert frame["method"] == method, (kind, frame)
                assert set(frame["params"]) == {"_meta"}
                # Every other list has been polled twice since: still nothing for the other streams.
                others: list[WatchKind] = [other for other in streams if other != changed]
                await asyncio.gather(*(polled(sidecar, other, 2) for other in others))
                for stream in streams.values():
                    assert stream.received() == [], (kind, stream.request_id)


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
        stream = Listen(http, sidecar, "tools", {"toolsListChanged": True})
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
            assert (await stream.next())["method"] == TOOLS_CHANGED
            status, after = await rpc(http, sidecar.url, "tools/list")
            assert _tool_names(after) == [*_tool_names(first), "late_tool"]


@pytest.mark.invariant(2)
async def test_the_ack_leaves_out_unknown_and_unreadable_uris(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        asked = [PRICE, "catalog://nope", "catalog://forbidden", PRICE]
        mixed = Listen(http, sidecar, 1, {"resourceSubscriptions": asked})
        none_left = Listen(
            http,
            sidecar,
            2,
            {"toolsListChanged": True, "resourceSubscriptions": ["catalog://nope", "catalog://forbidden"]},
        )
        async with listening(mixed, none_left) as (ack_mixed, ack_none):
            assert ack_mixed["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            # No URI could be honoured: the field is left out, the rest of the filter stands.
            assert ack_none["params"]["notifications"] == {"toolsListChanged": True}
            assert sorted((w.key.kind, w.key.uri) for w in watches(sidecar)) == [
                ("resource", PRICE),
                ("tools_list", None),
            ]
            await up.set_price(130)
            frame = await mixed.next()
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
    modern_fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = modern_fast_upstream
    a1, a2 = "catalog://items/a1", "catalog://items/a2"
    async with serve_sidecar(up.url, polling=POLLING, streams={"max_uris_per_stream": 2}) as sidecar:
        stream = Listen(http, sidecar, "lim", {"resourceSubscriptions": [PRICE, a1, a2]})
        async with listening(stream) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE, a1]}
            rejections = sidecar.app[METRICS].limit_rejections.labels("max_uris_per_stream")._value.get()
            assert rejections == 1
            assert sorted(watch.key.uri for watch in watches(sidecar)) == [a1, PRICE]
            # The price feeds every item: the two honoured URIs change, the dropped one is never announced.
            await up.set_price(120)
            first, second = await stream.next(), await stream.next()
            assert {first["params"]["uri"], second["params"]["uri"]} == {PRICE, a1}
            await polled(sidecar, "resource", 4)
            assert stream.received() == []


# -- 5. linger ----------------------------------------------------------------------------------------------


async def test_a_closed_stream_stops_counting_at_once_and_its_watch_stops_polling_after_the_linger(
    modern_fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = modern_fast_upstream
    linger_ms = 3000
    polling = {**POLLING, "linger_ms": linger_ms}
    async with serve_sidecar(up.url, polling=polling) as sidecar:
        metrics = sidecar.app[METRICS]
        body = request("subscriptions/listen", {"notifications": {"resourceSubscriptions": [PRICE]}}, "x")
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
    modern_fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = modern_fast_upstream
    async with serve_sidecar(up.url, polling={**POLLING, "linger_ms": 0}) as sidecar:
        stream = Listen(http, sidecar, "z", {"resourceSubscriptions": [PRICE]})
        async with listening(stream) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            await up.set_price(170)
            assert (await stream.next())["params"]["uri"] == PRICE
        await eventually(lambda: watch_count(sidecar, "resource") == 0, within_s=WAIT_S)
