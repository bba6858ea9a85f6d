"""Recovery for list kinds: a list changed while no stream listened is recovered by listening again and listing
(invariant 5), and a list changed during an upstream outage is told when the upstream comes back (invariant 14).
Their twins on resources are in test_listen.py.

Raw listen streams (the kit's client) asking for the tools list only, the SDK shop upstream whose tools are added
through its admin routes.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS, REGISTRY
from tests.kit import SUB_ID_KEY, TOOLS_CHANGED, ListenStream, eventually, read_resource, rpc, serve_sidecar
from tests.kit.polling import FAST, QUICK_COMMENTS, SLOW
from tests.peers import Upstream


def _tools_changed(listen_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": TOOLS_CHANGED, "params": {"_meta": {SUB_ID_KEY: listen_id}}}


async def _tool_names(http: aiohttp.ClientSession, url: str) -> set[str]:
    status, listed = await rpc(http, url, "tools/list")
    assert status == 200, listed
    return {tool["name"] for tool in listed["result"]["tools"]}


async def _quiet_interval(stream: ListenStream) -> None:
    """Until a whole keep-alive interval went by with nothing written (two comments from now)."""
    seen = len(stream.comment_times)
    await eventually(lambda: len(stream.comment_times) >= seen + 2, what="two keep-alive comments")


@pytest.mark.invariant(5)
async def test_a_tools_change_while_no_stream_listened_is_recovered_by_listening_again_and_listing(
    cached_shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(cached_shop.url, polling=SLOW, streams=QUICK_COMMENTS) as sidecar:
        first = ListenStream(http, sidecar.url, "first", toolsListChanged=True)
        await first.open()
        before = await _tool_names(http, sidecar.url)  # cached a minute
        await first.close()
        kinds = [watch.key.kind for watch in sidecar.app[REGISTRY].watches()]
        assert kinds == ["tools_list"]  # lingering: the listen below rejoins it
        await cached_shop.add("tool", "fresh")  # while no stream listens
        again = ListenStream(http, sidecar.url, "again", toolsListChanged=True)
        await again.open()  # its ack waits for its own look
        try:
            assert await _tool_names(http, sidecar.url) == before | {"fresh"}
            # Recovered by that listing, never replayed: a whole quiet interval goes by with nothing on the stream.
            await _quiet_interval(again)
            assert again.pending() == []
            # The stream itself is live: the next change is told.
            status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "add_tool", "arguments": {"name": "later"}})
            assert status == 200  # a write through the sidecar: the list watch looks soon
            assert await again.next() == _tools_changed("again")
        finally:
            await again.close()


@pytest.mark.invariant(14)
async def test_a_tools_list_changed_during_an_outage_is_told_when_the_upstream_answers_again(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    # A minute of backoff after the first failed poll: the list changed during the outage can reach the stream
    # within the test only through the recovery (the upstream's first answer makes every failing watch look again).
    backing_off = {**FAST, "backoff_initial_ms": 60_000, "backoff_max_ms": 60_000}
    async with serve_sidecar(fast_upstream.url, polling=backing_off) as sidecar:
        stream = ListenStream(http, sidecar.url, "tools", toolsListChanged=True)
        await stream.open()
        try:
            await fast_upstream.add("tool", "fresh")
            assert await stream.next() == _tools_changed("tools")
            failed = sidecar.app[METRICS].polls.labels("tools_list", "error")
            await fast_upstream.kill()
            await eventually(lambda: failed._value.get() >= 1)
            await fast_upstream.restart()  # without the added tool again: a change, made while it was down
            # A read nothing has cached: it reaches the upstream, which answers again.
            await read_resource(http, sidecar.url, "catalog://items/after-the-outage")
            assert await stream.next() == _tools_changed("tools")  # on the stream that stayed open
        finally:
            await stream.close()
