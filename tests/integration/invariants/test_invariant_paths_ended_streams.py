"""Listen streams that end with signals pending (invariants 5, 11 and 13), and clients that listen (or subscribe)
again with the request id of a stream that ended: SDK clients number every listen 1 (python-sdk #3060), so what a
stream's end touches must be the stream's own, never keyed by its id. Both eras: 2026-07-28 listen streams (raw, as
such a client sends them) and 2025-11-25 sessions whose `resources/subscribe` requests all carry id 1.

A signal pends on a live stream only while its send buffer is full, which over loopback takes megabytes of
notifications into a client that stopped reading (the kernel's socket buffers, autotuned, come before the
sidecar's own mark): a count that depends on the machine. It pends deterministically before the ack: a stream
asking for two URIs holds the first one's watch (and hears its changes) while the second one's first read is
still out, and nothing may be written before the ack. Here that second read hangs at the fault-injecting upstream
(in the test's loop), so the test decides when the stream ends: its client leaves, or the sidecar closes it.
Socket-free twins, with the send buffer full, are in tests/unit/downstream/test_listen_stream.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from sidecar.app import HUB, METRICS, REGISTRY
from sidecar.observability.metrics import Metrics
from tests.kit import SUB_ID_KEY, UPDATED, ListenStream, eventually, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import FAST, QUICK_COMMENTS, SLOW
from tests.kit.session import Session
from tests.peers import Upstream
from tests.peers.faulty import Fault, FaultyUpstream

SEEN = "x://seen"
"""Its watch starts at once; it changes while the stream waits for its ack."""
HUNG = "x://hung"
"""Its first read never comes back (until the upstream stops)."""
PRICE = "catalog://price"
REUSED_ID = 1
"""The id every listen (and every subscribe) of the clients that reuse ids carries."""
POLLED = {"min_interval_ms": 50, "default_interval_ms": 100, "max_interval_ms": 100}


def _changes(metrics: Metrics) -> float:
    value: float = metrics.changes.labels("resource")._value.get()
    return value


@pytest.mark.invariant(11)
@pytest.mark.invariant(13)
async def test_a_stream_closed_with_signals_pending_keeps_one_per_subscription_and_ends_with_them_then_complete(
    http: aiohttp.ClientSession,
) -> None:
    async with FaultyUpstream(ttl_ms=100) as up, serve_sidecar(up.url, polling=POLLED) as sidecar:
        metrics = sidecar.app[METRICS]
        up.fail(Fault.HANG, uri=HUNG)
        stream = ListenStream(http, sidecar.url, 7, [SEEN, HUNG])
        opening = asyncio.ensure_future(stream.open())
        try:
            await eventually(lambda: metrics.subscriptions._value.get() == 1, what="SEEN joined, HUNG still out")
            # Three changes, each seen by a poll, while nothing may be written: one pending signal, merged twice.
            for version in range(1, 4):
                seen = _changes(metrics)
                up.contents[SEEN] = f"version {version}"
                await eventually(lambda: _changes(metrics) > seen, what="the poll saw the change")  # noqa: B023
            assert metrics.coalesced._value.get() == 2
            await sidecar.app[HUB].close_all()  # what shutdown does first: every stream is to end
            await up.stop()  # HUNG's first read fails: it is left out of the ack, and the stream goes on to its end
            ack = await opening
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [SEEN]
            update = {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": SEEN, "_meta": {SUB_ID_KEY: 7}}}
            complete = {"jsonrpc": "2.0", "id": 7, "result": {"resultType": "complete", "_meta": {SUB_ID_KEY: 7}}}
            assert await stream.next() == update  # the pending signal, once
            assert await stream.next() == complete  # then the complete result, last
            await eventually(lambda: stream.ended, what="the stream closed after the complete result")
            assert stream.pending() == []
        finally:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            await stream.close()


@pytest.mark.invariant(5)
@pytest.mark.parametrize(
    ("first_id", "again_id"),
    # SDK clients number every listen 1 (python-sdk #3060): the new stream then has the ended one's id.
    [("first", "again"), (1, 1)],
    ids=["new-id", "reused-id"],
)
async def test_a_stream_that_ended_with_a_signal_pending_is_recovered_by_listening_again_and_nothing_is_replayed(
    http: aiohttp.ClientSession, first_id: str | int, again_id: str | int
) -> None:
    async with (
        FaultyUpstream(ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar,
    ):
        metrics = sidecar.app[METRICS]
        up.fail(Fault.HANG, uri=HUNG)
        first = ListenStream(http, sidecar.url, first_id, [SEEN, HUNG])
        opening = asyncio.ensure_future(first.open())
        try:
            await eventually(lambda: metrics.subscriptions._value.get() == 1, what="SEEN joined, HUNG still out")
            up.contents[SEEN] = "version 1"
            status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "w"}})
            assert status == 200  # a write: SEEN's watch looks soon, and its change pends on the waiting stream
            await eventually(lambda: _changes(metrics) == 1, what="the hinted look saw the change")
            assert text_of(await read_resource(http, sidecar.url, SEEN)) == "version 1"  # cached a minute
            opening.cancel()  # the client leaves before its ack: the stream ends with the signal pending
            await asyncio.gather(opening, return_exceptions=True)
            await first.close()
            await eventually(lambda: sidecar.app[HUB].stream_count == 0, what="the stream ended")
        finally:
            opening.cancel()
        up.contents[SEEN] = "version 2"  # while no stream listens; no poll comes
        again = ListenStream(http, sidecar.url, again_id, [SEEN])
        await again.open()  # rejoins SEEN's lingering watch: the ack waits for its look
        try:
            assert text_of(await read_resource(http, sidecar.url, SEEN)) == "version 2"
            # Recovered by that read; neither the lost signal nor the change while away is replayed: a whole quiet
            # interval (two comments) goes by with nothing on the new stream.
            comments = len(again.comment_times)
            await eventually(lambda: len(again.comment_times) >= comments + 2, what="two keep-alive comments")
            assert again.pending() == []
            # Its subscription is live: the next change is told once, stamped with its own id.
            up.contents[SEEN] = "version 3"
            status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "w"}})
            assert status == 200
            update = {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": SEEN, "_meta": {SUB_ID_KEY: again_id}}}
            assert await again.next() == update
        finally:
            await again.close()


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
