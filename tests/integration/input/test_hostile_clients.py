"""Hostile clients and slow peers: no lock-out, no starvation, no amplification, nothing private on show.

Clients here are raw sockets where the point is bytes a real client would not send (half a request
head, a body that never comes); everything else is real: the SDK shop server upstream, the sidecar
served as in production (`GuardedRunner`, an admin listener), and the socket-level faulty upstream for
an upstream that drips its answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.app import FAIR_SHARE, METRICS
from tests.kit import (
    LEGACY_HEADERS,
    LEGACY_INITIALIZE,
    ListenStream,
    eventually,
    headers,
    request,
    rpc,
    serve_sidecar,
    told,
    waits,
)
from tests.peers import Upstream, start_upstream
from tests.peers.faulty import Fault, FaultyUpstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=60_000) as up:
        yield up


def _limit(sidecar: Any, name: str) -> float:
    value: float = sidecar.app[METRICS].limit_rejections.labels(name)._value.get()
    return value


async def _accepted(http: aiohttp.ClientSession, url: str, *tokens: str) -> None:
    """One read each, so the upstream has accepted these tokens: from then on each is a client of its own (an
    unaccepted one counts against its address)."""
    for token in tokens:
        status, message = await rpc(http, url, "tools/list", extra_headers={"Authorization": f"Bearer {token}"})
        assert status == 200, message


async def _get(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as resp:
        return resp.status


# -- the admin listener ------------------------------------------------------------------------------------


async def test_metrics_and_status_are_served_on_the_admin_listener_only_and_hide_private_uris(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        stream = ListenStream(http, sidecar.url, "l", [PROFILE, PRICE], authorization="Bearer alice")
        await stream.open()
        try:
            for path in ("/metrics", "/status"):
                assert await _get(http, f"{sidecar.base_url}{path}") == 404, path
                assert await _get(http, f"{sidecar.admin_url}{path}") == 200, path
            for path in ("/healthz", "/readyz"):
                assert await _get(http, f"{sidecar.base_url}{path}") == 200, path
                assert await _get(http, f"{sidecar.admin_url}{path}") == 200, path
            for accept in ("application/json", "text/html"):
                async with http.get(f"{sidecar.admin_url}/status", headers={"Accept": accept}) as resp:
                    text = await resp.text()
                assert PROFILE not in text, "a private URI shown unhashed"
                assert PRICE in text  # a public one names no one
        finally:
            await stream.close()


# -- slow and numerous connections ---------------------------------------------------------------------------


async def _half_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")  # and never the rest
    await writer.drain()
    return reader, writer


async def test_connections_that_never_finish_their_request_head_are_closed(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, listen={"header_timeout_s": 0.5}) as sidecar:
        port = int(sidecar.base_url.rsplit(":", 1)[1])
        loris = [await _half_request(port) for _ in range(50)]
        try:
            for reader, _ in loris:
                async with asyncio.timeout(15):
                    assert await reader.read() == b""  # closed by the sidecar, not answered
            status, _ = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200
        finally:
            for _, writer in loris:
                writer.close()


async def test_past_the_connection_cap_new_connections_are_closed_while_streams_and_health_go_on(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=200) as shop,
        serve_sidecar(shop.url, listen={"max_connections": 5}, polling={"min_interval_ms": 50}) as sidecar,
    ):
        stream = ListenStream(http, sidecar.url, "l", [PRICE])
        await stream.open()
        port = int(sidecar.base_url.rsplit(":", 1)[1])
        flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(20):
                flood.append(await _half_request(port))
            await eventually(lambda: _limit(sidecar, "max_connections") >= 15)
            assert await _get(http, f"{sidecar.admin_url}/healthz") == 200
            await shop.set_price(170)
            update = await stream.next()  # the stream opened before the flood is still served
            assert update["params"]["uri"] == PRICE
        finally:
            for _, writer in flood:
                writer.close()
            await stream.close()


async def test_a_body_that_never_arrives_gets_408(shop: Upstream) -> None:
    async with serve_sidecar(shop.url, listen={"body_timeout_s": 0.5}) as sidecar:
        port = int(sidecar.base_url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 200\r\n\r\n" + b'{"jsonrpc": "2.0", '
            )
            await writer.drain()
            async with asyncio.timeout(15):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), head
        finally:
            writer.close()


# -- a slow upstream, a greedy client ------------------------------------------------------------------------


async def test_an_upstream_dripping_its_answer_is_cut_at_the_whole_request_timeout(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream={"timeout_s": 0.5}) as sidecar:
        up.fail(Fault.DRIP, uri="drip://x")
        status, message = await rpc(http, sidecar.url, "resources/read", {"uri": "drip://x"})
        assert status == 504, message
        assert message["error"]["message"] == "the upstream did not answer in time"
        assert "no complete answer within 0.5 s" in told(message["error"], caplog.records)["reason"]


@pytest.mark.invariant(20)
async def test_one_clients_hung_requests_leave_slots_to_others_and_its_next_one_waits_its_turn(
    http: aiohttp.ClientSession,
) -> None:
    # Four slots upstream, three for any one client: alice's three hung reads cannot take bob's.
    upstream = {"timeout_s": 30, "max_connections": 4, "max_requests_per_client": 3}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        for n in range(3):
            up.fail(Fault.HANG, uri=f"hang://{n}")
        alice = {"Authorization": "Bearer alice"}
        await _accepted(http, sidecar.url, "alice", "bob")
        hung = [  # three different reads: identical ones would share one upstream request
            asyncio.ensure_future(rpc(http, sidecar.url, "resources/read", {"uri": f"hang://{n}"}, extra_headers=alice))
            for n in range(3)
        ]
        try:
            await eventually(lambda: len(up.reads()) == 3)
            fourth = asyncio.ensure_future(
                rpc(http, sidecar.url, "resources/read", {"uri": "ok://alice"}, extra_headers=alice)
            )
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 1)  # waiting its turn, not refused
            bob = {"Authorization": "Bearer bob"}
            status, message = await rpc(http, sidecar.url, "resources/read", {"uri": "ok://bob"}, extra_headers=bob)
            assert status == 200, message
            assert not fourth.done()
            hung[0].cancel()  # alice gives one up: her next request takes its slot
            status, message = await fourth
            assert status == 200, message
            assert _limit(sidecar, "queued_per_client") == _limit(sidecar, "queue_wait") == 0
        finally:
            await up.stop()  # ends the hung reads
            await asyncio.gather(*hung, return_exceptions=True)


@pytest.mark.invariant(20)
async def test_a_client_over_its_own_queue_bound_gets_429_with_retry_after_and_no_one_else_does(
    http: aiohttp.ClientSession,
) -> None:
    upstream = {"timeout_s": 30, "max_requests_per_client": 1, "max_queued_per_client": 1}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        up.fail(Fault.HANG, uri="hang://x")
        alice = {"Authorization": "Bearer alice"}
        await _accepted(http, sidecar.url, "alice", "bob")
        held = [
            asyncio.ensure_future(rpc(http, sidecar.url, "resources/read", {"uri": uri}, extra_headers=alice))
            for uri in ("hang://x", "ok://queued")
        ]
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 1)
            body = request("resources/read", {"uri": "ok://third"})
            async with http.post(
                sidecar.url, json=body, headers={**headers("resources/read", "ok://third"), **alice}
            ) as resp:
                assert resp.status == 429
                assert resp.headers["Retry-After"] == "1"
                message = await resp.json()
            assert message["error"]["code"] == -32603 and "waiting" in message["error"]["message"], message
            assert _limit(sidecar, "queued_per_client") == 1
            for name in ("bob", None):  # another token, and an anonymous client, are served as usual
                extra = {"Authorization": f"Bearer {name}"} if name else {}
                status, message = await rpc(http, sidecar.url, "resources/read", {"uri": "ok://y"}, extra_headers=extra)
                assert status == 200, message
        finally:
            await up.stop()
            await asyncio.gather(*held, return_exceptions=True)


@pytest.mark.invariant(20)
async def test_made_up_tokens_share_their_addresss_fair_share_until_the_upstream_accepts_one(
    http: aiohttp.ClientSession,
) -> None:
    upstream = {"timeout_s": 30, "max_requests_per_client": 1, "max_queued_per_client": 0}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        up.fail(Fault.HANG, uri="hang://x")
        await _accepted(http, sidecar.url, "bob")
        first = {"Authorization": "Bearer made-up-1"}
        hung = asyncio.ensure_future(rpc(http, sidecar.url, "resources/read", {"uri": "hang://x"}, extra_headers=first))
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].in_flight == 1)
            # Another invented token from the same address: the same client, over its bound.
            second = {"Authorization": "Bearer made-up-2"}
            status, _ = await rpc(http, sidecar.url, "resources/read", {"uri": "ok://x"}, extra_headers=second)
            assert status == 429
            # A token the upstream accepted before is a client of its own.
            bob = {"Authorization": "Bearer bob"}
            status, _ = await rpc(http, sidecar.url, "resources/read", {"uri": "ok://x"}, extra_headers=bob)
            assert status == 200
        finally:
            await up.stop()
            await asyncio.gather(hung, return_exceptions=True)


# -- 2025-11-25 sessions -------------------------------------------------------------------------------------


async def _initialize(http: aiohttp.ClientSession, url: str, extra: dict[str, str] | None = None) -> tuple[int, str]:
    async with http.post(url, json=LEGACY_INITIALIZE, headers={**LEGACY_HEADERS, **(extra or {})}) as resp:
        await resp.read()
        return resp.status, resp.headers.get("Mcp-Session-Id", "")


async def test_concurrent_initializes_never_exceed_the_session_cap(shop: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(shop.url, streams={"max_sessions": 10}) as sidecar:
        users = [{"Authorization": f"Bearer u{n}"} for n in range(60)]
        answers = await asyncio.gather(*(_initialize(http, sidecar.url, user) for user in users))
        statuses = [status for status, _ in answers]
        assert statuses.count(200) == 10 and statuses.count(503) == 50, statuses


async def test_one_client_cannot_hold_every_session(shop: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(shop.url, streams={"max_sessions_per_client": 3}) as sidecar:
        statuses = [(await _initialize(http, sidecar.url))[0] for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        assert (await _initialize(http, sidecar.url, {"Authorization": "Bearer alice"}))[0] == 200


async def test_a_session_never_used_after_initialize_ends_and_a_used_one_stays(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, streams={"session_unused_s": 0.3}) as sidecar:
        _, unused = await _initialize(http, sidecar.url)
        _, used = await _initialize(http, sidecar.url)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        session_headers = {**LEGACY_HEADERS, "MCP-Protocol-Version": "2025-11-25"}

        async def ping_status(session: str) -> int:
            async with http.post(sidecar.url, json=ping, headers={**session_headers, "Mcp-Session-Id": session}) as r:
                return r.status

        assert await ping_status(used) == 200
        # Watched from the metric: a request to the unused session would use it.
        await eventually(lambda: sidecar.app[METRICS].legacy_sessions._value.get() == 1)
        assert await ping_status(unused) == 404
        assert await ping_status(used) == 200


# -- amplification -------------------------------------------------------------------------------------------


async def test_a_listen_naming_missing_resources_twice_costs_one_read_each(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    missing = [f"catalog://missing/{n}" for n in range(100)]
    async with serve_sidecar(shop.url) as sidecar:
        for request_id in ("first", "second"):
            stream = ListenStream(http, sidecar.url, request_id, missing)
            ack = await stream.open()
            await stream.close()
            assert "resourceSubscriptions" not in ack["params"]["notifications"]
        assert await shop.count("resources/read") == 100


@pytest.mark.invariant(20)
async def test_a_client_subscribing_faster_than_its_rate_waits_for_its_reads_and_gets_every_uri_acked(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    items = [f"catalog://items/sku{n}" for n in range(200)]
    rate = 50
    async with serve_sidecar(shop.url, polling={"max_baselines_per_s": rate}) as sidecar:
        stream = ListenStream(http, sidecar.url, "many", items)
        asked_at = time.monotonic()  # one clock for this process and the upstream's (CLOCK_MONOTONIC)
        ack = await stream.open()
        await stream.close()
        assert ack["params"]["notifications"].get("resourceSubscriptions") == items
        reads = [entry for entry in await shop.log() if entry["method"] == "resources/read"]
        assert len(reads) == 200
        # Past the rate, the reads went through the client's fair share (and waited there when it was full). The
        # bucket holds `rate` tokens and refills at `rate` a second while the reads go on, so what went at once is
        # bounded by its refill over the time that passed by the upstream's clock, however slow the machine.
        elapsed_s = max(entry["at"] for entry in reads) - asked_at
        at_once = 200 - waits(sidecar, "upstream_requests")
        assert at_once <= rate + rate * elapsed_s, (at_once, elapsed_s)


@pytest.mark.invariant(20)
async def test_a_first_read_that_cannot_start_in_time_is_left_out_of_that_clients_ack_only(
    http: aiohttp.ClientSession,
) -> None:
    polling = {"max_baselines_per_s": 1, "baseline_wait_s": 0.3}
    upstream = {"max_requests_per_client": 1, "timeout_s": 30}
    async with FaultyUpstream() as up, serve_sidecar(up.url, polling=polling, upstream=upstream) as sidecar:
        up.fail(Fault.HANG, uri="hang://x")
        alice = {"Authorization": "Bearer alice"}
        await _accepted(http, sidecar.url, "alice", "bob")
        hung = asyncio.ensure_future(rpc(http, sidecar.url, "resources/read", {"uri": "hang://x"}, extra_headers=alice))
        try:
            await eventually(lambda: len(up.reads()) == 1)  # alice's one slot is taken by her own hung read
            # Her first read of a listen is within her rate and goes at once; the second must wait for her slot.
            stream = ListenStream(http, sidecar.url, "a", ["ok://1", "ok://2"], authorization="Bearer alice")
            ack = await stream.open()
            await stream.close()
            assert ack["params"]["notifications"]["resourceSubscriptions"] == ["ok://1"]
            assert _limit(sidecar, "baseline_wait") == 1
            stream = ListenStream(http, sidecar.url, "b", ["ok://1", "ok://2"], authorization="Bearer bob")
            ack = await stream.open()
            await stream.close()
            assert ack["params"]["notifications"]["resourceSubscriptions"] == ["ok://1", "ok://2"]
        finally:
            await up.stop()
            await asyncio.gather(hung, return_exceptions=True)
