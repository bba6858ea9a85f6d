"""Sharing on the 2025-11-25 path: many sessions subscribing to one public URI share one watch and its reads
(invariant 8), and a session's relayed requests take their turn in the fair queue beside another client's
(invariant 20). Their twins on listen streams and plain requests are in test_listen_contexts_and_lists.py and
test_fair_share.py.

Raw HTTP as a 2025-11-25 client sends it (the kit's session client); the SDK shop upstream, whose log counts the
reads by its own clock, and the fault-injecting upstream (in the test's loop), whose hung read holds a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.app import FAIR_SHARE, METRICS
from sidecar.config.sections import DEFAULT_JITTER
from sidecar.identity import PUBLIC
from tests.integration.listen_watches import POLLING, PRICE, TTL_MS, answered, most_in_flight, polled, reads_of, watches
from tests.kit import UPDATED, WAIT_S, eventually, serve_sidecar
from tests.kit.session import Session, sessions
from tests.peers import Upstream
from tests.peers.faulty import Fault, FaultyUpstream

SESSIONS = 40


async def _answered_reads(up: Upstream, count: int) -> list[dict[str, Any]]:
    """The first `count` reads of PRICE, once each has been answered."""
    reads: list[dict[str, Any]] = []

    async def ready() -> bool:
        reads[:] = reads_of(await up.log(), PRICE)[:count]
        return answered(reads)

    await eventually(ready, within_s=WAIT_S)
    return reads


@pytest.mark.invariant(8)
async def test_forty_sessions_subscribing_to_one_public_uri_share_its_first_read_and_one_read_per_poll(
    fast_upstream: Upstream,
) -> None:
    up = fast_upstream
    connector = aiohttp.TCPConnector(limit=0)  # a connection per GET stream and per subscribe in flight
    async with (
        serve_sidecar(up.url, polling=POLLING) as sidecar,
        aiohttp.ClientSession(connector=connector) as http,
        sessions(http, sidecar.url, *[None] * SESSIONS) as opened,
    ):
        await asyncio.gather(*(session.subscribe(PRICE) for session in opened))  # all at once, as joiners race
        assert [watch.key.context for watch in watches(sidecar) if watch.key.kind == "resource"] == [PUBLIC]

        # Joining cost by the upstream's own times: the first read, shared, and each joiner's sync point (16), one
        # look shared by every subscribe arriving while it is in flight; never more of them in its hands at once.
        joining = await _answered_reads(up, len(reads_of(await up.log(), PRICE)))
        assert most_in_flight(joining) <= 2

        # Steady cost: one read per poll interval that passed, not one per session: a window of the upstream's
        # reads spanning T holds at most T / (the shortest interval) + 1 of them.
        await polled(sidecar, "resource", 3)
        steady = reads_of(await up.log(), PRICE)[len(joining) :]
        shortest_s = TTL_MS / 1000 * (1 - DEFAULT_JITTER)
        assert len(steady) >= 3
        assert len(steady) <= (steady[-1]["at"] - steady[0]["at"]) / shortest_s + 1

        # And the poll that sees a change tells every session.
        await up.set_price(150)
        told = await asyncio.gather(*(session.wait_updates(1) for session in opened))
        assert all(updates == [{"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}] for updates in told)


@contextlib.asynccontextmanager
async def _client_at(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client whose connections come from `address` (a client of its own to the fair share)."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        yield http


@pytest.mark.invariant(20)
async def test_a_polite_session_beside_a_greedy_one_is_served_within_one_turn_and_nothing_is_refused() -> None:
    # One slot to the upstream. The greedy session holds it with a hung read and queues eight more; then a session
    # from another address asks once. When the slot frees, turns go round the clients: the polite session's read
    # is the first or second served, never behind the greedy session's eight, and no one is refused.
    upstream = {"max_connections": 1, "max_requests_per_client": 1, "timeout_s": 60}
    async with (
        FaultyUpstream(era="legacy") as up,
        serve_sidecar(up.url, upstream=upstream) as sidecar,
        _client_at("127.0.0.1") as greedy_http,
        _client_at("127.0.0.2") as polite_http,
    ):
        greedy, polite = Session(greedy_http, sidecar.url), Session(polite_http, sidecar.url)
        await greedy.open(get_stream=False)
        await polite.open(get_stream=False)
        fair_share = sidecar.app[FAIR_SHARE]
        up.fail(Fault.HANG, uri="hang://x")
        hung = asyncio.ensure_future(greedy.call("resources/read", {"uri": "hang://x"}))
        queued: list[asyncio.Future[tuple[int, dict[str, Any]]]] = []
        try:
            await eventually(lambda: fair_share.in_flight == 1)
            for n in range(8):
                queued.append(asyncio.ensure_future(greedy.call("resources/read", {"uri": f"ok://greedy/{n}"})))
            await eventually(lambda: fair_share.queued == 8)
            queued.append(asyncio.ensure_future(polite.call("resources/read", {"uri": "ok://polite"})))
            await eventually(lambda: fair_share.queued == 9)
            hung.cancel()  # the greedy client gives its hung read up: the slot frees
            answers = await asyncio.gather(*queued)
            assert all(status == 200 and "result" in answer for status, answer in answers), answers
            served = [seen.uri for seen in up.reads() if seen.uri != "hang://x"]
            assert served.index("ok://polite") <= 1, served
            rejections = sidecar.app[METRICS].limit_rejections.collect()
            assert [sample for family in rejections for sample in family.samples if sample.value] == []
        finally:
            await up.stop()
            await asyncio.gather(hung, *queued, return_exceptions=True)
            await greedy.close()
            await polite.close()
