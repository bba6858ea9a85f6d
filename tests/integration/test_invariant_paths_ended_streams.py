"""Listen streams that end with signals pending (invariants 5, 11 and 13).

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

import aiohttp
import pytest

from sidecar.app import HUB, METRICS
from sidecar.observability.metrics import Metrics
from tests.kit import SUB_ID_KEY, UPDATED, ListenStream, eventually, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import QUICK_COMMENTS, SLOW
from tests.peers.faulty import Fault, FaultyUpstream

SEEN = "x://seen"
"""Its watch starts at once; it changes while the stream waits for its ack."""
HUNG = "x://hung"
"""Its first read never comes back (until the upstream stops)."""
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
async def test_a_stream_that_ended_with_a_signal_pending_is_recovered_by_listening_again_and_nothing_is_replayed(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        FaultyUpstream(ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar,
    ):
        metrics = sidecar.app[METRICS]
        up.fail(Fault.HANG, uri=HUNG)
        first = ListenStream(http, sidecar.url, "first", [SEEN, HUNG])
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
        again = ListenStream(http, sidecar.url, "again", [SEEN])
        await again.open()  # rejoins SEEN's lingering watch: the ack waits for its look
        try:
            assert text_of(await read_resource(http, sidecar.url, SEEN)) == "version 2"
            # Recovered by that read; neither the lost signal nor the change while away is replayed: a whole quiet
            # interval (two comments) goes by with nothing on the new stream.
            comments = len(again.comment_times)
            await eventually(lambda: len(again.comment_times) >= comments + 2, what="two keep-alive comments")
            assert again.pending() == []
        finally:
            await again.close()
