"""More stream invariants on the 2025-11-25 path: what a session's subscribe cannot honour is refused and never told
(invariant 2, whose listen-stream form is the ack), a quiet GET stream gets keep-alive comments (12), and bad input
on a session gets its error without harming another session (15).

Raw HTTP as a 2025-11-25 client sends it (`tests/kit/session.py`), the SDK shop upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.kit import serve_sidecar
from tests.kit.polling import FAST
from tests.kit.session import sessions
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
ITEM = "catalog://items/1"
"""Its text names the price: it changes whenever the price does."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=300, list_ttl_ms=300) as up:
        yield up


@pytest.mark.invariant(2)
async def test_a_session_subscribe_it_cannot_honour_is_refused_and_never_told(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    streams = {"max_uris_per_stream": 1}
    async with (
        serve_sidecar(shop.url, polling=FAST, streams=streams) as sidecar,
        sessions(http, sidecar.url, None, None) as (limited, other),
    ):
        status, missing = await limited.call("resources/subscribe", {"uri": "catalog://nope"})
        assert status == 200 and missing["error"]["code"] == -32002, missing  # the 2025-11-25 code
        await limited.subscribe(PRICE)
        status, over = await limited.call("resources/subscribe", {"uri": ITEM})
        assert status == 200 and over["error"]["code"] == -32602, over  # over its one URI
        await other.subscribe(ITEM)  # honoured there: it shows when the item changes

        await shop.set_price(140)  # the price and the item change
        await other.wait_updates(1)
        await limited.wait_updates(1)
        await shop.set_price(150)  # had the item reached `limited`, it would sit before this price
        updates = await limited.wait_updates(2)
        assert [frame["params"]["uri"] for frame in updates] == [PRICE, PRICE]


@pytest.mark.invariant(12)
async def test_a_quiet_session_get_stream_gets_a_keepalive_comment_every_quiet_interval(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        serve_sidecar(shop.url, polling=FAST, streams={"keepalive_s": 0.2}) as sidecar,
        sessions(http, sidecar.url, None) as (session,),
    ):
        await session.subscribe(PRICE)  # watched, and nothing changes
        await session.wait_until(lambda: len(session.comment_times) >= 3)
        assert session.frames == []
        await shop.set_price(140)  # the stream is alive: a change still arrives, and the comments go on after it
        await session.wait_updates(1)
        after = len(session.comment_times)
        await session.wait_until(lambda: len(session.comment_times) >= after + 2)


@pytest.mark.invariant(15)
async def test_bad_input_on_a_session_gets_its_error_and_status_and_another_session_is_still_told(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        serve_sidecar(shop.url, polling=FAST) as sidecar,
        sessions(http, sidecar.url, None, None) as (bad, good),
    ):
        await good.subscribe(PRICE)
        async with http.post(sidecar.url, data=b"{not json", headers=bad.headers) as resp:
            assert resp.status == 400
            assert (await resp.json(content_type=None))["error"]["code"] == -32700
        status, answer = await bad.call("resources/subscribe", {"uri": 42})
        assert status == 200 and answer["error"]["code"] == -32602, answer
        unknown = {**bad.headers, "Mcp-Session-Id": "no-such-session"}
        body = {"jsonrpc": "2.0", "id": 9, "method": "resources/subscribe", "params": {"uri": PRICE}}
        async with http.post(sidecar.url, json=body, headers=unknown) as resp:
            assert resp.status == 404
            assert "error" in await resp.json(content_type=None)
        await shop.set_price(140)
        assert [frame["params"]["uri"] for frame in await good.wait_updates(1)] == [PRICE]
        await bad.subscribe(PRICE)  # the session that sent it is served as before
