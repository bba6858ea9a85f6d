"""Thousands of listen streams opened and dropped abruptly leave nothing behind.

Each stream is a raw socket: some are dropped before their request is complete, some right after it
(while the sidecar reads the baseline), some as the response headers arrive, some during a slow
baseline, some after the ack; half with a reset (RST), half with a plain close. Afterwards the stream
and watch gauges are back to zero, the sidecar holds no connection and no task it did not hold before,
and the upstream is no longer polled. On a 2-core machine 10,000 streams take about 15 s (printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.app import HUB, METRICS, REGISTRY
from sidecar.observability.metrics import Metrics
from tests.kit import META, PV, ListenStream, Sidecar, eventually, serve_sidecar
from tests.peers.faulty import FaultyUpstream

STREAMS = int(os.environ.get("CHURN_STREAMS", "10000"))
CONCURRENCY = 200
POLLING = {
    "min_interval_ms": 100,
    "default_interval_ms": 300,
    "max_interval_ms": 300,
    "linger_ms": 200,
    # Every churning stream comes from one client, far past its max_baselines_per_s: the reads over it wait
    # their turn in its fair share (streams dropped meanwhile give their place up), none is refused.
}
SLOW_S = 0.3
"""How long a baseline read of a `slow://` URI takes: streams dropped meanwhile are dropped during the ack."""
CHURN_WAIT_S = 20.0
"""Above the kit's WAIT_S: CONCURRENCY churning streams settling (no stream, watch, connection or task left)."""
_TIME_WAIT = "06"
_LISTEN = "0A"


def _request(port: int, request_id: int, uris: list[str]) -> bytes:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "subscriptions/listen",
            "params": {"notifications": {"resourceSubscriptions": uris, "toolsListChanged": True}, "_meta": META},
        }
    ).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PV}\r\n"
        f"Mcp-Method: subscriptions/listen\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _churn_one(port: int, n: int, up: FaultyUpstream) -> str:
    """Open stream `n` and drop it at the point its number picks; returns where it was dropped."""
    mode = n % 5
    uris = [f"slow://{n % 20}"] if mode == 3 else [f"ok://{n % 100}", f"ok://{(n + 1) % 100}"]
    raw = _request(port, n, uris)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if mode == 0:
            writer.write(raw[: len(raw) - 10])  # the body is not complete when the client goes
            await writer.drain()
            return "mid-request"
        writer.write(raw)
        await writer.drain()
        if mode == 1:
            return "after-request"
        if mode == 3:
            # Gone while the sidecar reads the URI upstream (this stream's baseline, or one it shares), the ack
            # not sent yet: each read takes SLOW_S.
            await eventually(lambda: up.inflight[uris[0]] > 0, within_s=CHURN_WAIT_S)
            return "during-baseline"
        await reader.readuntil(b"\r\n\r\n")
        if mode == 2:
            return "at-headers"
        await reader.readuntil(b"acknowledged")
        return "after-ack"
    finally:
        if n % 2:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not close
            writer.transport.abort()
        else:
            writer.close()


def _server_connections(port: int) -> int:
    """TCP sockets on the sidecar's side of its port (accepted, not yet closed by it; TIME_WAIT is the kernel's)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] not in (_TIME_WAIT, _LISTEN):
                    count += 1
    return count


def _value(metric: object) -> float:
    value: float = metric._value.get()  # type: ignore[attr-defined]
    return value


def _watches(metrics: Metrics) -> float:
    return sum(_value(metrics.watches.labels(kind)) for kind in ("resource", "tools_list"))


@pytest.fixture
async def up() -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream(ttl_ms=300) as upstream:
        for k in range(20):
            upstream.delays[f"slow://{k}"] = SLOW_S
        yield upstream


async def test_streams_opened_and_dropped_abruptly_leave_no_watch_task_or_socket_behind(
    up: FaultyUpstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_sidecar(up.url, polling=POLLING, streams={"keepalive_s": 1}) as sidecar:
        port = int(sidecar.base_url.rsplit(":", 1)[1])
        metrics, hub, registry = sidecar.app[METRICS], sidecar.app[HUB], sidecar.app[REGISTRY]
        await _warm_up(http, sidecar)
        # The fake upstream runs in this loop too: its connection tasks (the sidecar's pooled upstream
        # connections, bounded by upstream.max_connections) are not the sidecar's.
        tasks_before = len(asyncio.all_tasks()) - up.connections

        gate = asyncio.Semaphore(CONCURRENCY)
        outcomes: dict[str, int] = {}

        async def bounded(n: int) -> None:
            async with gate:
                where = await _churn_one(port, n, up)
                outcomes[where] = outcomes.get(where, 0) + 1

        started = time.monotonic()
        async with asyncio.timeout(300):
            await asyncio.gather(*(bounded(n) for n in range(STREAMS)))
        elapsed = time.monotonic() - started
        print(f"\n{STREAMS} streams opened and dropped in {elapsed:.1f} s: {outcomes}")

        # A client going away is an ordinary end, never an unexpected failure.
        assert [r.getMessage() for r in caplog.records if r.name.startswith("sidecar") and r.exc_info] == []

        # Every stream is gone, and so is every watch once its linger is over.
        await eventually(lambda: hub.stream_count == 0, within_s=CHURN_WAIT_S)
        assert _value(metrics.listen_streams) == 0
        assert _value(metrics.subscriptions) == 0
        # Every stream whose response began was a listen the sidecar served, and has ended (counted once each).
        ended = sum(_value(metrics.streams_ended.labels(reason)) for reason in ("client", "stalled"))
        assert ended >= outcomes["at-headers"] + outcomes["after-ack"], (ended, outcomes)
        await eventually(lambda: _watches(metrics) == 0, within_s=CHURN_WAIT_S)
        assert list(registry.watches()) == []
        assert _value(metrics.watched_contexts) == 0
        assert _value(metrics.streams_ended.labels("client")) >= outcomes["after-ack"]

        # Nothing left running or open on the sidecar's side.
        await eventually(lambda: _server_connections(port) == 0, within_s=CHURN_WAIT_S)
        await eventually(lambda: len(asyncio.all_tasks()) - up.connections <= tasks_before, within_s=CHURN_WAIT_S)

        # And the upstream is not polled for anyone any more (negative check over several intervals).
        polled = len(up.requests)
        await asyncio.sleep(3 * POLLING["max_interval_ms"] / 1000)
        assert len(up.requests) == polled, [entry.uri for entry in up.requests[polled:]]

        # The sidecar still serves a stream from start to update.
        stream = ListenStream(http, sidecar.url, "after", ["ok://1"])
        ack = await stream.open()
        try:
            assert ack["params"]["notifications"]["resourceSubscriptions"] == ["ok://1"]
            up.contents["ok://1"] = "changed"
            assert (await stream.next())["params"]["uri"] == "ok://1"
        finally:
            await stream.close()


async def _warm_up(http: aiohttp.ClientSession, sidecar: Sidecar) -> None:
    """One stream opened and closed, so the upstream probe and the client pool exist before tasks are counted."""
    stream = ListenStream(http, sidecar.url, "warm", ["ok://warm"])
    await stream.open()
    await stream.close()
    await eventually(lambda: sidecar.app[HUB].stream_count == 0, within_s=CHURN_WAIT_S)
    await eventually(lambda: list(sidecar.app[REGISTRY].watches()) == [], within_s=CHURN_WAIT_S)
