"""Recovery on the 2025-11-25 path: a session that stopped listening to a URI and subscribes again (invariant 5),
and a session's watch across an upstream outage (invariant 14). Their twins on listen streams are in test_listen.py.

A 2025-11-25 client's own reads are relayed to the upstream as they are, never cached; the read that shows whether
a subscribe was a sync point is the sidecar's cached one (a 2026-07-28 read), as in test_invariant_paths_sessions.
Raw HTTP as a 2025-11-25 client sends it (the kit's session client), the SDK shop upstream.
"""

from __future__ import annotations

import aiohttp
import pytest

from sidecar.app import METRICS, REGISTRY
from tests.kit import UPDATED, eventually, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import FAST, QUICK_COMMENTS, SLOW
from tests.kit.session import Session, sessions
from tests.peers import Upstream

PRICE = "catalog://price"


async def _quiet_interval(session: Session) -> None:
    """Until a whole keep-alive interval went by with nothing to write (two comments from now: the second's
    interval began after the first)."""
    seen = len(session.comment_times)
    await session.wait_until(lambda: len(session.comment_times) >= seen + 2)


@pytest.mark.invariant(5)
async def test_a_session_subscribing_again_reads_what_changed_while_away_and_is_told_nothing_of_it(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        serve_sidecar(cached_shop.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar,
        sessions(http, sidecar.url, None) as (session,),
    ):
        await session.subscribe(PRICE)
        assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
        status, answer = await session.call("resources/unsubscribe", {"uri": PRICE})
        assert status == 200 and answer["result"] == {}, answer
        resources = [watch for watch in sidecar.app[REGISTRY].watches() if watch.key.kind == "resource"]
        assert len(resources) == 1  # lingering (beside the session's list watches): the subscribe below rejoins it
        await cached_shop.set_price(140)  # while the session is away
        await session.subscribe(PRICE)  # answered once its own look is applied
        assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
        # The change made while away is recovered by that read, never replayed: a whole quiet interval of the GET
        # stream goes by with no update (a session still counted on the watch would have been told by that look).
        await _quiet_interval(session)
        assert session.updates() == []
        # The subscription itself is live: the next change is told.
        status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "set_price", "arguments": {"value": 150}})
        assert status == 200  # a write through the sidecar: the watch looks soon
        (told,) = await session.wait_updates(1)
        assert told == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}


@pytest.mark.invariant(14)
async def test_the_upstream_back_makes_a_sessions_backed_off_watch_look_at_once_and_its_get_stream_is_told(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    # A minute of backoff after the first failed poll: the change made during the outage can reach the session
    # within the test only through the recovery (the upstream's first answer makes every failing watch look again).
    backing_off = {**FAST, "backoff_initial_ms": 60_000, "backoff_max_ms": 60_000}
    async with (
        serve_sidecar(fast_upstream.url, polling=backing_off) as sidecar,
        sessions(http, sidecar.url, None) as (session,),
    ):
        await session.subscribe(PRICE)
        await fast_upstream.set_price(120)
        await session.wait_updates(1)
        failed = sidecar.app[METRICS].polls.labels("resource", "error")
        await fast_upstream.kill()
        await eventually(lambda: failed._value.get() >= 1)
        await fast_upstream.restart()  # price=100 again: a change from 120, made while the upstream was down
        status, _ = await session.call("tools/list", {})
        assert status == 404  # the upstream answers again (the restart lost the session it rode on)
        told = await session.wait_updates(2)  # on the GET stream that stayed open through the outage
        assert told[1] == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}


@pytest.mark.invariant(16)
async def test_a_session_subscribing_again_to_a_uri_it_holds_is_a_sync_point_and_still_holds_it_once(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        serve_sidecar(cached_shop.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar,
        sessions(http, sidecar.url, None) as (session,),
    ):
        await session.subscribe(PRICE)
        assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
        await cached_shop.set_price(140)  # behind the sidecar's back: no write through it hints the watch
        await session.subscribe(PRICE)  # the same subscribe again: answered once the watch's look is applied
        assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
        (watch,) = [watch for watch in sidecar.app[REGISTRY].watches() if watch.key.kind == "resource"]
        assert watch.refs == 1  # the second subscribe's hold was let go: one session, one hold
        status, answer = await session.call("resources/unsubscribe", {"uri": PRICE})
        assert status == 200 and answer["result"] == {}, answer
        await eventually(
            lambda: [seen.refs for seen in sidecar.app[REGISTRY].watches() if seen.key == watch.key] == [0],
            what="the one unsubscribe let go of the watch",
        )
