"""A third-party upstream restarted under an open listen stream, as production restarts one: stopped and started
again on the same port, it has forgotten every session the sidecar held.

server-everything answers a request on a session it no longer knows with 400 "Bad Request: No valid session ID
provided", FastMCP on the 1.x SDK with 404; either way the sidecar opens a new session and asks again, so within
15 s of the restart it is ready again, a read through it is answered, a new listen is acked, and the stream that
stayed open is told of a change; server-everything, which can push, has the sidecar's subscription on a GET
stream of the new session again. Each is recorded as a latency from the moment the restarted server
answers (`tests/compat/conftest.py` prints them); only the acceptance bound is asserted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import aiohttp
import pytest

from tests.compat.upstreams import OUT_OF_BAND_POLLING, open_upstream, record_latency
from tests.kit import ListenStream, eventually, read_resource, rpc, scrape, serve_sidecar, text_of

pytestmark = pytest.mark.timeout(120)

RESTARTED = ["server-everything", "fastmcp1"]
"""One upstream that answers a forgotten session with 400 and one that answers it with 404."""
PUSHES = {"server-everything"}
"""Those that declare `resources.subscribe`: the sidecar subscribes on its session and holds its GET stream."""
RECOVERED_WITHIN_S = 15.0
"""The acceptance bound, from the moment the restarted server answers."""
POLLING = {**OUT_OF_BAND_POLLING, "backoff_max_ms": 2000}


@pytest.mark.invariant(23)
@pytest.mark.parametrize("name", RESTARTED)
async def test_a_restarted_upstream_that_forgot_its_sessions_is_served_again_within_15_s(
    name: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with open_upstream(name, tmp_path) as up, serve_sidecar(up.url, polling=POLLING) as sidecar:
        assert up.restart is not None
        uri = up.watched_uri
        before = await ListenStream.connect(http, sidecar.url, "before", [uri])
        await read_resource(http, sidecar.url, uri)

        async def subscribed_upstream() -> bool:
            return (await scrape(http, sidecar.admin_url)).total("mcp_sidecar_native_watches") == 1

        if name in PUSHES:
            await eventually(subscribed_upstream, what=f"{name}: subscribed on the upstream's GET stream")

        await up.restart()
        loop = asyncio.get_running_loop()
        back = loop.time()
        mark = before.mark()
        expected = await up.change_out_of_band(7)  # None: the resource changes by itself (a clock)
        seen: dict[str, float] = {}

        def left_s() -> float:
            return max(0.1, back + RECOVERED_WITHIN_S - loop.time())

        async def ready() -> bool:
            async with http.get(f"{sidecar.base_url}/readyz") as resp:
                return resp.status == 200

        async def read_answered() -> bool:
            status, message = await rpc(http, sidecar.url, "resources/read", {"uri": uri})
            return status == 200 and "result" in message and (expected is None or text_of(message) == expected)

        async def timed(what: str, awaitable: Awaitable[object]) -> None:
            await awaitable
            seen[what] = loop.time()

        waits = [
            timed("ready again", eventually(ready, left_s(), step=0.1, what=f"{name}: /readyz 200")),
            timed("read answered", eventually(read_answered, left_s(), step=0.1, what=f"{name}: a read")),
            timed("open stream told", before.wait_update(uri, left_s(), since=mark)),
        ]
        if name in PUSHES:  # the GET stream on a new session, and the subscription on it
            what = f"{name}: subscribed again"
            waits.append(timed("subscribed again", eventually(subscribed_upstream, left_s(), step=0.1, what=what)))
        await asyncio.gather(*waits)
        after = await ListenStream.connect(http, sidecar.url, "after", [uri], within_s=left_s())
        seen["new listen acked"] = loop.time()
        await asyncio.gather(before.close(), after.close())

    for what, at in seen.items():
        record_latency(f"{name} restarted: {what}", at - back)
    assert max(seen.values()) - back <= RECOVERED_WITHIN_S, seen
