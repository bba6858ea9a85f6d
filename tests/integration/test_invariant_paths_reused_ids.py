"""A client that listens (or subscribes) again with the request id of a stream that ended (invariants 5, 11, 13).

Clients reuse ids: some send every request with id 1, so one client's second listen stream carries the id of its
first. Whatever a stream's end touches is the stream's own, never keyed by its id: a new stream with the same id
starts with nothing pending from the one that ended (and nothing replayed), merges its own signals, and ends with
its own complete result carrying that id. Both eras: 2026-07-28 listen streams (raw, as such a client sends them)
and 2025-11-25 sessions whose `resources/subscribe` requests all carry id 1.

How a signal pends deterministically before an ack (a second URI's first read hangs at the fault-injecting
upstream) is told in test_invariant_paths_ended_streams.py, whose invariant-5 listen pin runs with a reused id too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from sidecar.app import HUB, METRICS, REGISTRY
from sidecar.observability.metrics import Metrics
from tests.kit import SUB_ID_KEY, ListenStream, eventually, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import FAST, QUICK_COMMENTS, SLOW
from tests.kit.session import Session
from tests.peers import Upstream
from tests.peers.faulty import Fault, FaultyUpstream

REUSED_ID = 1
"""The id every listen (and every subscribe) of these clients carries."""
SEEN = "x://seen"
"""Its watch starts at once; it changes while a stream waits for its ack."""
HUNG = "x://hung"
"""Its first read never comes back (until the upstream stops)."""
PRICE = "catalog://price"
UPDATED = "notifications/resources/updated"
POLLED = {"min_interval_ms": 50, "default_interval_ms": 100, "max_interval_ms": 100}


def _changes(metrics: Metrics) -> float:
    value: float = metrics.changes.labels("resource")._value.get()
    return value


def _coalesced(metrics: Metrics) -> float:
    value: float = metrics.coalesced._value.get()
    return value


async def _seen_changes(metrics: Metrics, change: Any, versions: range) -> None:
    """Make each change in turn and wait until a poll saw it (each one a signal of its own)."""
    for version in versions:
        seen = _changes(metrics)
        await change(version)
        await eventually(lambda: _changes(metrics) > seen, what=f"a poll saw change {version}")  # noqa: B023


async def _left_before_its_ack(stream: ListenStream, opening: asyncio.Future[Any]) -> None:
    """The client goes away while its stream waits for its ack."""
    opening.cancel()
    await asyncio.gather(opening, return_exceptions=True)
    await stream.close()


@pytest.mark.invariant(11)
@pytest.mark.invariant(13)
async def test_a_stream_with_the_id_of_one_that_ended_merges_only_its_own_signals_and_ends_with_its_complete_result(
    http: aiohttp.ClientSession,
) -> None:
    async with FaultyUpstream(ttl_ms=100) as up, serve_sidecar(up.url, polling=POLLED) as sidecar:
        metrics = sidecar.app[METRICS]
        up.fail(Fault.HANG, uri=HUNG)

        async def change(version: int) -> None:
            up.contents[SEEN] = f"version {version}"

        first = ListenStream(http, sidecar.url, REUSED_ID, [SEEN, HUNG])
        opening = asyncio.ensure_future(first.open())
        try:
            await eventually(lambda: metrics.subscriptions._value.get() == 1, what="SEEN joined, HUNG still out")
            await _seen_changes(metrics, change, range(1, 3))  # one signal pends on the first stream, merged once
            assert _coalesced(metrics) == 1
        finally:
            await _left_before_its_ack(first, opening)  # it ends with that signal pending
        await eventually(lambda: sidecar.app[HUB].stream_count == 0, what="the first stream ended")
        again = ListenStream(http, sidecar.url, REUSED_ID, [SEEN, HUNG])
        opening = asyncio.ensure_future(again.open())
        try:
            await eventually(lambda: sidecar.app[HUB].stream_count == 1, what="the second stream waits for its ack")
            # Three changes while nothing may be written: one pending signal on the new stream, merged twice, and
            # nothing more (a stream of the same id still told, or told into a queue, would count otherwise).
            await _seen_changes(metrics, change, range(3, 6))
            assert _coalesced(metrics) == 1 + 2
            await sidecar.app[HUB].close_all()  # what shutdown does first: every stream is to end
            await up.stop()  # HUNG's first read fails: it is left out of the ack, and the stream goes on to its end
            ack = await opening
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [SEEN]
            update = {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": SEEN, "_meta": {SUB_ID_KEY: REUSED_ID}}}
            complete = {
                "jsonrpc": "2.0",
                "id": REUSED_ID,
                "result": {"resultType": "complete", "_meta": {SUB_ID_KEY: REUSED_ID}},
            }
            assert await again.next() == update  # its own pending signal, once
            assert await again.next() == complete  # then its own complete result, last
            await eventually(lambda: again.ended, what="the stream closed after the complete result")
            assert again.pending() == []
        finally:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            await again.close()


async def _subscribe_with_the_reused_id(http: aiohttp.ClientSession, url: str, session: Session, uri: str) -> None:
    """`resources/subscribe` on the session with id 1, as every request of such a client; answered empty."""
    body = {"jsonrpc": "2.0", "id": REUSED_ID, "method": "resources/subscribe", "params": {"uri": uri}}
    async with http.post(url, json=body, headers=session.headers) as response:
        answer = await response.json(content_type=None)
    assert response.status == 200 and answer == {"jsonrpc": "2.0", "id": REUSED_ID, "result": {}}, answer


async def _quiet_interval(session: Session) -> None:
    """Until a whole keep-alive interval of the GET stream went by with nothing to write (two comments from now)."""
    seen = len(session.comment_times)
    await session.wait_until(lambda: len(session.comment_times) >= seen + 2)


@pytest.mark.invariant(5)
async def test_a_new_session_subscribing_with_the_id_of_an_ended_one_reads_what_changed_and_is_told_nothing_of_it(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar:
        first = Session(http, sidecar.url)
        try:
            await first.open()
            await _subscribe_with_the_reused_id(http, sidecar.url, first, PRICE)
            assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
        finally:
            await first.close()  # the session ends (DELETE), its GET stream with it
        await eventually(
            lambda: all(watch.refs == 0 for watch in sidecar.app[REGISTRY].watches()), what="the session let go"
        )
        await cached_shop.set_price(140)  # while the client is away; the watch lingers, unpolled
        again = Session(http, sidecar.url)
        try:
            await again.open()
            await _subscribe_with_the_reused_id(http, sidecar.url, again, PRICE)  # answered once its look is applied
            assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
            await _quiet_interval(again)  # the change while away is recovered by that read, never replayed
            assert again.updates() == []
            status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "set_price", "arguments": {"value": 150}})
            assert status == 200  # a write through the sidecar: the watch looks soon, and the new session is told
            (told,) = await again.wait_updates(1)
            assert told == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}
        finally:
            await again.close()


@pytest.mark.invariant(11)
async def test_a_new_session_subscribing_with_the_id_of_an_ended_one_merges_only_its_own_signals(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=FAST, streams=QUICK_COMMENTS) as sidecar:
        metrics = sidecar.app[METRICS]

        async def change(version: int) -> None:
            await cached_shop.set_price(100 + 10 * version)

        # No GET stream: what the session is told pends until it opens one.
        first = Session(http, sidecar.url)
        try:
            await first.open(get_stream=False)
            await _subscribe_with_the_reused_id(http, sidecar.url, first, PRICE)
            await _seen_changes(metrics, change, range(1, 3))  # one signal pends on the first session, merged once
            assert _coalesced(metrics) == 1
        finally:
            await first.close()  # it ends with that signal pending
        again = Session(http, sidecar.url)
        try:
            await again.open(get_stream=False)
            await _subscribe_with_the_reused_id(http, sidecar.url, again, PRICE)
            # Three changes before it reads: one pending signal, merged twice, and nothing more (an ended session
            # still told, or signals queued, would count otherwise).
            await _seen_changes(metrics, change, range(3, 6))
            assert _coalesced(metrics) == 1 + 2
            await again.open_get_stream()
            (told,) = await again.wait_updates(1)
            assert told == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}
            await _quiet_interval(again)  # once: a whole quiet interval, and no second update
            assert len(again.updates()) == 1
        finally:
            await again.close()
