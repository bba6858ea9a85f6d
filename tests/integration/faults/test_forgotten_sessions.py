"""A 2025-11-25 upstream that forgets the sidecar's sessions (a restart, an expiry), answering as real servers do,
with the socket-level upstream of `tests/peers/faulty.py`: no state the sidecar cannot leave by itself.

- A server that answers a forgotten session with 400 and words saying so (server-everything's "Bad Request: No
  valid session ID provided") gets a new session and the request again: the watch's next poll reads the new
  content and tells the stream, a read through the sidecar is answered, readiness never drops.
- A server that answers it with a 400 saying nothing of the session, right after it came back from an outage,
  is treated the same: every session from before the outage may be forgotten.
- An upstream that answers but cannot be used (its probe answer is not MCP) is asked again on the sidecar's own,
  at a backed-off pace, with nobody asking /readyz, and once usable every watch looks again.
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.kit import ListenStream, eventually, read_resource, readyz, scrape, serve_sidecar, text_of
from tests.peers.faulty import Fault, FaultyUpstream

POLLING = {"default_interval_ms": 300, "min_interval_ms": 100, "max_interval_ms": 300}
POLLING |= {"backoff_initial_ms": 100, "backoff_max_ms": 500}
URI = "ok://note"
EVERYTHING_LOST_SESSION = (400, "Bad Request: No valid session ID provided")


def _initializes(up: FaultyUpstream) -> int:
    return len(up.seen(lambda entry: entry.method == "initialize"))


async def _ready(http: aiohttp.ClientSession, base_url: str) -> bool:
    return (await readyz(http, base_url))[0] == 200


@pytest.mark.invariant(23)
async def test_a_session_the_upstream_says_it_forgot_is_opened_again_and_the_stream_is_told(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        FaultyUpstream(era="legacy", lost_session=EVERYTHING_LOST_SESSION) as up,
        serve_sidecar(up.url, polling=POLLING) as sidecar,
    ):
        up.contents[URI] = "v1"
        stream = await ListenStream.connect(http, sidecar.url, "l-1", [URI])
        opened = _initializes(up)

        up.forget_sessions()
        up.contents[URI] = "v2"
        await stream.wait_update(URI)
        assert text_of(await read_resource(http, sidecar.url, URI)) == "v2"
        assert await _ready(http, sidecar.base_url)
        assert _initializes(up) == opened + 1, "one new session, not one per request"
        lost = up.seen(lambda entry: entry.session is not None and entry.method == "resources/read")
        assert any(entry.done is not None for entry in lost)


@pytest.mark.invariant(23)
async def test_any_4xx_on_a_session_from_before_an_outage_opens_a_new_one(http: aiohttp.ClientSession) -> None:
    async with (
        FaultyUpstream(era="legacy", lost_session=(400, "Bad Request")) as up,
        serve_sidecar(up.url, polling=POLLING) as sidecar,
    ):
        up.contents[URI] = "v1"
        stream = await ListenStream.connect(http, sidecar.url, "l-1", [URI])

        await up.stop()  # the restart: down, and back knowing no session
        up.forget_sessions()

        async def not_ready() -> bool:
            return not await _ready(http, sidecar.base_url)

        await eventually(not_ready, what="/readyz says not ready")
        mark = stream.mark()
        up.contents[URI] = "v2"
        await up.start()

        await stream.wait_update(URI, since=mark)
        assert text_of(await read_resource(http, sidecar.url, URI)) == "v2"
        await eventually(lambda: _ready(http, sidecar.base_url), what="/readyz 200 again")


async def test_an_unusable_upstream_is_asked_again_by_itself_and_every_watch_looks_once_it_is_usable(
    http: aiohttp.ClientSession,
) -> None:
    # A failed poll waits a minute: within the test, only the upstream's recovery makes the watch look again.
    polling = {**POLLING, "backoff_initial_ms": 60_000, "backoff_max_ms": 60_000}
    async with FaultyUpstream() as up, serve_sidecar(up.url, polling=polling) as sidecar:
        up.contents[URI] = "v1"
        stream = await ListenStream.connect(http, sidecar.url, "l-1", [URI])

        async def gauge(name: str) -> float:
            return (await scrape(http, sidecar.admin_url)).total(name)

        async def down() -> bool:
            return await gauge("mcp_sidecar_upstream_up") == 0

        async def unusable() -> bool:
            return await gauge("mcp_sidecar_upstream_usable") == 0

        async def usable() -> bool:
            return await gauge("mcp_sidecar_upstream_usable") == 1

        # Back from an outage answering garbage: the sidecar's own probe finds it unusable. Nobody asks /readyz
        # from here on, so only the sidecar's own retries can find it usable again.
        await up.stop()
        await eventually(down, what="mcp_sidecar_upstream_up 0")
        garbage = up.fail(Fault.NOT_JSON, methods=frozenset({"server/discover", "resources/read"}))
        await up.start()
        await eventually(unusable, what="mcp_sidecar_upstream_usable 0")
        mark = stream.mark()
        up.contents[URI] = "v2"
        probes = len(up.seen(lambda entry: entry.method == "server/discover"))
        up.heal(garbage)

        await stream.wait_update(URI, since=mark)
        await eventually(usable, what="mcp_sidecar_upstream_usable 1")
        assert len(up.seen(lambda entry: entry.method == "server/discover")) > probes
