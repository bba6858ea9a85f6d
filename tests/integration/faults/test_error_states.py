"""An error answer is an observation (invariant 24), through the sidecar in front of the SDK shop upstream, whose
`catalog://note` can be deleted behind the sidecar's back: its reads then fail with -32603, as a deleted note of
basic-memory does.

The note's reads are cached a minute (its `ttlMs`), and polled every 0.3 s: a watch that took the error for a fault
would back off and tell nobody; one that told a lone error would tell a note that never went away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.kit import ListenStream, eventually, read_resource, rpc, scrape, serve_sidecar, text_of
from tests.kit.polling import FAST
from tests.peers import Era, Upstream, start_upstream

NOTE = "catalog://note"
PRICE = "catalog://price"
MINUTE_MS = 60_000


@pytest.fixture(params=["modern", "legacy"])
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    era: Era = request.param
    async with await start_upstream(era, read_ttl_ms=MINUTE_MS) as up:
        yield up


async def _read_error(http: aiohttp.ClientSession, url: str) -> dict[str, object]:
    status, message = await rpc(http, url, "resources/read", {"uri": NOTE})
    assert status == 200 and "error" in message, message
    error: dict[str, object] = message["error"]
    return error


async def _reads_of_the_note(up: Upstream) -> int:
    return await up.count("resources/read", NOTE)


@pytest.mark.invariant(24)
@pytest.mark.invariant(17)
async def test_a_deleted_note_is_told_read_as_the_error_and_told_again_when_it_is_written_back(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        stream = await ListenStream.connect(http, sidecar.url, "notes", [NOTE])
        try:
            assert text_of(await read_resource(http, sidecar.url, NOTE)) == "note v1"  # cached for a minute
            await shop.set_note(None)
            await stream.wait_update(NOTE)
            error = await _read_error(http, sidecar.url)  # the re-read is the error, never the cached note
            assert error["code"] == -32603 and "note deleted" in str(error["message"])
            mark = stream.mark()
            await shop.set_note("note v2")
            await stream.wait_update(NOTE, since=mark)
            assert text_of(await read_resource(http, sidecar.url, NOTE)) == "note v2"
        finally:
            await stream.close()


@pytest.mark.invariant(24)
async def test_a_note_that_stays_deleted_is_polled_as_an_answer_and_tells_nobody_again(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=FAST) as sidecar:
        stream = await ListenStream.connect(http, sidecar.url, "notes", [NOTE, PRICE])
        try:
            await cached_shop.set_note(None)
            await stream.wait_update(NOTE)
            mark, reads = stream.mark(), await _reads_of_the_note(cached_shop)
            await eventually(
                lambda: _more(cached_shop, reads, 3), what="three more polls of the deleted note"
            )  # a stable error: each one the same state
            await cached_shop.set_price(150)  # a change after those polls, told after any they told
            await stream.wait_update(PRICE, since=mark)
            assert [u["params"]["uri"] for u in stream.updates(mark)] == [PRICE], "nothing more of the note"
            metrics = await scrape(http, sidecar.admin_url)
            assert metrics.total("mcp_sidecar_polls_total", kind="resource", outcome="error_state") >= 4
            assert metrics.total("mcp_sidecar_polls_total", kind="resource", outcome="error") == 0, "not a fault"
            async with http.get(f"{sidecar.base_url}/readyz") as ready:
                assert ready.status == 200, await ready.text()
        finally:
            await stream.close()


@pytest.mark.invariant(24)
async def test_a_lone_error_between_two_reads_of_the_same_note_tells_nobody(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=FAST) as sidecar:
        stream = await ListenStream.connect(http, sidecar.url, "notes", [NOTE, PRICE])
        try:
            mark, reads = stream.mark(), await _reads_of_the_note(cached_shop)
            await cached_shop.set_note("note v1", fail_reads=1)  # one read fails as if it were gone, then as before
            await eventually(lambda: _more(cached_shop, reads, 2), what="the failing read and the one after it")
            await cached_shop.set_price(150)
            await stream.wait_update(PRICE, since=mark)
            assert [u["params"]["uri"] for u in stream.updates(mark)] == [PRICE], "the note never went away"
            assert text_of(await read_resource(http, sidecar.url, NOTE)) == "note v1"
        finally:
            await stream.close()


async def _more(up: Upstream, reads: int, more: int) -> bool:
    return await _reads_of_the_note(up) >= reads + more
