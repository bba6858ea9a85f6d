"""Shutdown and restart of `mcp-sidecar run` as a real process.

SIGTERM with a thousand open streams, polls in flight and client requests in flight: every stream gets
its final result frame, every request gets an answer (the ones the upstream answers in time with their
result, the ones it never answers with a JSON-RPC error before the exit), and the process exits within
`listen.shutdown_grace_s`. After kill -9 and a restart, clients that listen again get a fresh ack and,
reading, the data as it is now: nothing depended on state that died with the process.

The upstream is the fault-injecting one (tests/peers/faulty.py), served from the test's own event loop.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster import Replica, free_port, sidecar_config
from tests.kit import SUB_ID_KEY, ListenStream, eventually, rpc
from tests.peers.faulty import Fault, FaultyUpstream

GRACE_S = 4.0
STREAMS = 1000
STREAMS_WAIT_S = 20.0
"""Above the kit's WAIT_S: what STREAMS streams do together (open, get a final frame, end) on a small machine."""


@pytest.fixture
async def up() -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream(ttl_ms=300) as upstream:
        yield upstream


def _replica(tmp_path: Path, up: FaultyUpstream) -> Replica:
    config = sidecar_config(up.url, free_port(), listen={"shutdown_grace_s": GRACE_S})
    return Replica("sidecar", tmp_path / "sidecar", config)


def _complete(frame: dict[str, Any], request_id: Any) -> bool:
    return frame == {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"resultType": "complete", "_meta": {SUB_ID_KEY: request_id}},
    }


async def _read(http: aiohttp.ClientSession, url: str, uri: str, request_id: str) -> tuple[int, dict[str, Any]]:
    return await rpc(http, url, "resources/read", {"uri": uri}, request_id=request_id)


@pytest.mark.invariant(13)
async def test_sigterm_ends_every_stream_answers_every_request_and_exits_within_the_grace(
    tmp_path: Path, up: FaultyUpstream, wide_http: aiohttp.ClientSession
) -> None:
    replica = _replica(tmp_path, up)
    await replica.start()
    streams: list[ListenStream] = []
    try:
        async with asyncio.timeout(120):
            streams = list(
                await asyncio.gather(
                    *(ListenStream.connect(wide_http, replica.url, n, [f"slow://{n % 50}"]) for n in range(STREAMS))
                )
            )
        # From now on every poll takes a second: at the signal, polls are in flight.
        up.read_delay_s = 1.0
        await eventually(lambda: up.inflight_total >= 20, within_s=STREAMS_WAIT_S)

        # Client requests in flight at the signal: ten the upstream answers after 1.5 s, three it never answers.
        for n in range(10):
            up.delays[f"data://{n}"] = 1.5
        up.fail(Fault.HANG, uri="hang://x")
        slow = [asyncio.create_task(_read(wide_http, replica.url, f"data://{n}", f"slow-{n}")) for n in range(10)]
        hung = [asyncio.create_task(_read(wide_http, replica.url, "hang://x", f"hung-{n}")) for n in range(3)]
        await eventually(
            lambda: len(up.reads("hang://x")) >= 1 and sum(up.inflight[f"data://{n}"] for n in range(10)) == 10,
            within_s=STREAMS_WAIT_S,
        )

        assert any(uri.startswith("slow://") for uri in up.inflight), "polls in flight at the signal"
        signalled = time.monotonic()
        await replica.service.signal(signal.SIGTERM)
        code = await replica.service.wait(within_s=3 * GRACE_S)
        exited_after = time.monotonic() - signalled
        print(f"\nexit {code} {exited_after:.2f} s after SIGTERM with {STREAMS} streams (grace {GRACE_S} s)")

        assert code == 0, replica.service.log_tail()
        # That it kept to the grace shows in the answers, not in a clock reading: the hung requests below are
        # answered "shutting down", which only the drain at the end of the grace says (the upstream timeout is
        # far longer), and the process was waited for with a bound of a few graces only.
        for n, task in enumerate(slow):
            status, message = await task  # an answer, not a cut connection
            assert status == 200, message
            assert message["result"]["contents"][0]["text"] == f"content of data://{n}"
        for n, task in enumerate(hung):
            status, message = await task
            assert status == 503, message
            assert message["id"] == f"hung-{n}" and message["error"]["code"] == -32603
            assert "shutting down" in message["error"]["message"]
        for n, stream in enumerate(streams):
            final = await stream.wait_for(lambda frame: "result" in frame, STREAMS_WAIT_S)
            assert _complete(final, n), final
            assert final is stream.frames[-1]  # the last frame of the stream...
        await eventually(lambda: all(stream.ended for stream in streams), within_s=STREAMS_WAIT_S)  # ...which then ends
        log = replica.service.log_text()
        assert "Traceback" not in log
        assert '"level": "error"' not in log
    finally:
        for stream in streams:
            await stream.aclose()
        await replica.service.stop()


async def test_after_kill_9_and_a_restart_clients_listen_again_and_read_current_data(
    tmp_path: Path, up: FaultyUpstream, http: aiohttp.ClientSession
) -> None:
    replica = _replica(tmp_path, up)
    await replica.start()
    uris = [f"data://{n}" for n in range(5)]
    try:
        before = [await ListenStream.connect(http, replica.url, f"before-{n}", [uri]) for n, uri in enumerate(uris)]
        up.contents["data://0"] = "v2"
        await before[0].wait_update("data://0", STREAMS_WAIT_S)

        await replica.service.kill()  # kill -9: no final frame, no cleanup
        await eventually(lambda: all(stream.ended for stream in before), within_s=STREAMS_WAIT_S)
        for stream in before:
            assert not any("result" in frame for frame in stream.frames)  # killed: no final frame
            await stream.aclose()
        for uri in uris:
            up.contents[uri] = "changed while the sidecar was down"

        await replica.start()  # same port, a new process
        after = [await ListenStream.connect(http, replica.url, f"after-{n}", [uri]) for n, uri in enumerate(uris)]
        try:
            for n, uri in enumerate(uris):
                assert after[n].frames[0]["params"]["notifications"] == {"resourceSubscriptions": [uri]}
                status, message = await _read(http, replica.url, uri, f"reread-{n}")
                assert status == 200, message
                assert message["result"]["contents"][0]["text"] == "changed while the sidecar was down"
            # And the new process's watches work: a later change is notified.
            up.contents["data://3"] = "v3"
            await after[3].wait_update("data://3", STREAMS_WAIT_S)
        finally:
            for stream in after:
                await stream.aclose()
    finally:
        await replica.service.stop()
