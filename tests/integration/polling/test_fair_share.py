"""Many clients behind one identity, as an unauthenticated legacy server has them: fair share, not refusal.

Real processes throughout: the sidecar (`mcp-sidecar run`), the bench's fast 2026-07-28 upstream (optionally
answering every read in 200 ms), and a load generator (wrk, or the bench's aiohttp one where a test needs its
counts) whose clients send no identifying header, so every one of them falls into the one anonymous
authorization context. Invariant 20:
a request over a limit waits its turn; a refusal falls only on the client over its own bound.

Throughput and latency are compared within one run (c=512 against c=32; loaded against unloaded), never
against a fixed figure: `bench/` reports the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.services import LoadClient, Service, start_fast_upstream, start_loadgen
from bench.wrk import WrkStats, wrk_reads
from sidecar.app import FAIR_SHARE
from tests.cluster import Replica, nginx_proxy, sidecar_replica
from tests.kit import ListenStream, Scrape, eventually, headers, request, serve_sidecar
from tests.peers.faulty import Fault, FaultyUpstream
from tests.prereqs import require_binary

CHURN_S = float(os.environ.get("FAIR_SHARE_CHURN_S", "30"))
"""How long the churn test keeps churning (the issue's figure; shorten it locally with the variable)."""
UPSTREAM_READ_S = 0.2
"""The slow upstream's service time for a read."""

pytestmark = pytest.mark.invariant(20)


def _waited(metrics: Scrape) -> float:
    """Client requests that found no free slot and waited their turn (the histogram's count above 0 s)."""
    count = metrics.total("mcp_sidecar_queue_wait_seconds_count", limit="upstream_requests")
    at_once = metrics.total("mcp_sidecar_queue_wait_seconds_bucket", limit="upstream_requests", le="0.001")
    return count - at_once


async def _forward(load: LoadClient, url: str, concurrency: int, duration_s: float, prefix: str) -> dict[str, Any]:
    return await load.call(
        "forward", url=url, concurrency=concurrency, duration_s=duration_s, warmup_s=0.5, uri_prefix=prefix
    )


async def test_512_anonymous_clients_from_one_address_are_all_served_and_throughput_holds(tmp_path: Path) -> None:
    require_binary("wrk", needed_by="the many-clients test (a load generator lighter than the proxy it loads)")
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, tmp_path)
        sidecar = await stack.enter_async_context(sidecar_replica(tmp_path, upstream.url))
        # Interleaved, best of two at each level: one run of a few seconds on a shared machine can be off by half.
        tries: dict[int, list[WrkStats]] = {32: [], 512: []}
        for attempt in range(2):
            for level in (32, 512):
                prefix = f"bench://c{level}/{attempt}/"
                tries[level].append(await wrk_reads(sidecar.url, connections=level, duration_s=3, prefix=prefix))
        runs = {level: max(stats, key=lambda s: s.rps) for level, stats in tries.items()}
        failed = sum(s.failed for stats in tries.values() for s in stats)
        metrics = await sidecar.metrics()
    print(f"\n32 clients: {runs[32]}\n512 clients: {runs[512]}")
    assert failed == 0, tries
    assert metrics.nonzero("mcp_sidecar_limit_rejections_total", "limit") == {}
    # The load went past the fair share (else nothing here was tested): requests did wait their turn.
    assert _waited(metrics) > 0
    # Throughput holds as clients are added. The bound is loose on purpose: a collapse (refusing limits made it
    # 0.14x) fails it, machine noise does not; the 0.8x target is the bench's (`python -m bench --only clients`).
    assert runs[512].rps >= 0.5 * runs[32].rps, runs


async def _polite_reads(url: str, local_address: str, extra: dict[str, str], until: asyncio.Event) -> list[float]:
    """One read at a time from `local_address` until `until` is set (at least three): the latency of each;
    any answer but a result fails the test."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(local_addr=(local_address, 0))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        n = 0
        while not until.is_set() or len(latencies) < 3:
            n += 1
            params = {"uri": f"polite://{local_address}/{n}"}
            began = time.perf_counter()
            async with http.post(
                url,
                json=request("resources/read", params, n),
                headers={**headers("resources/read", params["uri"]), **extra},
            ) as resp:
                body = await resp.json(content_type=None)
            latencies.append(time.perf_counter() - began)
            assert resp.status == 200 and "result" in body, (resp.status, body)
    return latencies


@pytest.mark.parametrize(
    ("address", "token"),
    [("127.0.0.2", None), ("127.0.0.1", "polite")],
    ids=["own-address", "own-token"],
)
async def test_a_polite_client_beside_a_greedy_one_waits_about_one_upstream_turn(
    address: str, token: str | None, tmp_path: Path
) -> None:
    # With a token, the one it reads with beside the flood is new to the upstream: its first read is included.
    extra = {"Authorization": f"Bearer {token}"} if token else {}
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, tmp_path, read_delay_ms=UPSTREAM_READ_S * 1000)
        sidecar = await stack.enter_async_context(sidecar_replica(tmp_path, upstream.url))
        load = await start_loadgen(stack, tmp_path)
        alone = asyncio.Event()
        alone.set()
        unloaded = await _polite_reads(
            sidecar.url, address, {"Authorization": f"Bearer {token}-alone"} if token else {}, alone
        )
        unloaded_p99 = max(unloaded)

        flood_over = asyncio.Event()
        greedy = asyncio.ensure_future(_forward(load, sidecar.url, 1024, 6.0, "greedy://"))
        # The polite client starts once the greedy one has queued requests, and reads until it is done.
        await _wait_for_queue(sidecar)
        polite = asyncio.ensure_future(_polite_reads(sidecar.url, address, extra, flood_over))
        flood = await greedy
        flood_over.set()
        loaded = await polite
        metrics = await sidecar.metrics()
    print(f"\npolite alone: max {unloaded_p99 * 1000:.0f} ms; beside the flood: {sorted(loaded)[-3:]} s; {flood}")
    assert flood["errors"] == 0, flood  # the greedy client waited, never refused: its queue stayed under its bound
    assert metrics.nonzero("mcp_sidecar_limit_rejections_total", "limit") == {}
    assert max(loaded) <= 3 * unloaded_p99 + UPSTREAM_READ_S, (loaded, unloaded)


async def test_a_new_token_from_the_greedy_clients_address_waits_one_turn_of_that_address_not_its_queue() -> None:
    # One slot per client: the greedy anonymous client holds its slot with a hung read, eight more of its reads
    # wait; then a token the upstream has never seen arrives from the same address. When the slot frees, the
    # address's turns go to its lanes in round robin: one greedy read at most before the newcomer's, not eight.
    upstream = {"max_requests_per_client": 1, "timeout_s": 60}
    newcomer = {"Authorization": "Bearer newcomer"}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        up.fail(Fault.HANG, uri="hang://x")
        hung = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", "hang://x"))
        queued: list[asyncio.Future[int]] = []
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].in_flight == 1)
            queued = [
                asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", f"ok://greedy/{n}")) for n in range(8)
            ]
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 8)
            polite = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", "ok://newcomer", newcomer))
            queued.append(polite)
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 9)
            assert sidecar.app[FAIR_SHARE].active_clients == 1  # still one client: the address
            hung.cancel()  # the greedy client gives its hung read up: its slot frees
            assert await polite == 200
            served = [seen.uri for seen in up.reads() if seen.uri != "hang://x"]
            assert served.index("ok://newcomer") <= 1, served
            assert await asyncio.gather(*queued) == [200] * 9
        finally:
            await up.stop()
            await asyncio.gather(hung, *queued, return_exceptions=True)


async def test_invented_tokens_from_one_address_get_no_more_turns_than_another_addresss_anonymous_client() -> None:
    # Two slots, each held by a hung read of a third and a fourth address; six reads, each with a token of its
    # own that the upstream has never seen, from one address, and six anonymous reads from another, all wait.
    # One slot frees: it goes to the two addresses in turn, so the six tokens gain nothing by being six.
    upstream = {"max_connections": 2, "max_requests_per_client": 1, "timeout_s": 60}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        holders = []
        for n, address in enumerate(("127.0.0.3", "127.0.0.4")):
            up.fail(Fault.HANG, uri=f"hang://{n}")
            holders.append(asyncio.ensure_future(_status_from(sidecar.url, address, f"hang://{n}")))
        waiting: list[asyncio.Future[int]] = []
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].in_flight == 2)
            for n in range(6):
                invented = {"Authorization": f"Bearer made-up-{n}"}
                waiting.append(
                    asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", f"ok://tokens/{n}", invented))
                )
                waiting.append(asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.2", f"ok://other/{n}")))
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 12)
            holders[0].cancel()
            assert await asyncio.gather(*waiting) == [200] * 12
            served = [seen.uri or "" for seen in up.reads() if not (seen.uri or "").startswith("hang://")]
            first = [uri.split("/")[2] for uri in served[:6]]
            assert first.count("tokens") == first.count("other") == 3, served
        finally:
            await up.stop()
            await asyncio.gather(*holders, *waiting, return_exceptions=True)


async def _wait_for_queue(sidecar: Replica) -> None:
    async def queued() -> bool:
        return (await sidecar.metrics()).total("mcp_sidecar_queue_depth", limit="upstream_requests") >= 100

    await eventually(queued, within_s=30, step=0.05)


def _established(port: int, *, local: bool) -> int:
    """Established TCP connections on this machine whose local (or remote) port is `port`."""
    count = 0
    with open("/proc/net/tcp") as lines:
        next(lines)
        for line in lines:
            fields = line.split()
            address = fields[1] if local else fields[2]
            if int(address.rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def _process_figures(pid: int, sidecar: Replica, upstream: Service) -> tuple[int, int]:
    """(resident bytes, open file descriptors) of the sidecar process `pid`, not counting the kept-alive
    connections of its upstream pool and of the test's own client: both come and go with use, within their
    bounds (upstream.max_connections, the test's session), and leak nothing."""
    with open(f"/proc/{pid}/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    pooled = _established(upstream.port, local=False) + _established(sidecar.port, local=True)
    return resident_pages * os.sysconf("SC_PAGE_SIZE"), len(os.listdir(f"/proc/{pid}/fd")) - pooled


async def test_an_hour_of_churn_in_half_a_minute_refuses_nothing_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Rounds of 100 listen streams on 3 distinct new URIs each (300 first reads a round, past the client's
    200 a second), 100 reads, a change every stream hears of, every stream closed; from one anonymous client."""
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, tmp_path)
        sidecar = await stack.enter_async_context(sidecar_replica(tmp_path, upstream.url, polling={"linger_ms": 200}))
        pid = sidecar.service.pid
        http = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60))
        )
        control = await stack.enter_async_context(aiohttp.ClientSession())
        rounds = 0
        baseline: tuple[int, int] | None = None
        started = time.monotonic()
        while time.monotonic() - started < CHURN_S or rounds < 3:
            uris = [[f"churn://{rounds}/{n}/{k}" for k in range(3)] for n in range(100)]
            streams = await asyncio.gather(
                *(ListenStream.connect(http, sidecar.url, f"r{rounds}-{n}", uris[n], within_s=30) for n in range(100))
            )  # every ack lists all three URIs: `open` asserts it
            try:
                answers = await asyncio.gather(*(_read(http, sidecar.url, uris[n][0]) for n in range(100)))
                assert answers == [200] * 100, answers
                changed = uris[rounds % 100][1]
                marks = [stream.mark() for stream in streams]
                async with control.post(f"{upstream.base_url}/admin/bump", json={"uri": changed}) as resp:
                    assert resp.status == 200
                await streams[rounds % 100].wait_update(changed, within_s=30, since=marks[rounds % 100])
            finally:
                await asyncio.gather(*(stream.aclose() for stream in streams))
            rounds += 1
            if rounds == 2:
                baseline = await _settled(sidecar, pid, upstream)
        after = await _settled(sidecar, pid, upstream)
        metrics = await sidecar.metrics()
    assert baseline is not None
    print(f"\n{rounds} rounds in {time.monotonic() - started:.0f} s; (RSS, fds) after 2: {baseline}, end: {after}")
    assert metrics.nonzero("mcp_sidecar_limit_rejections_total", "limit") == {}
    # The first reads past the client's rate went through its fair share (beside its 100 reads a round).
    slots = metrics.total("mcp_sidecar_queue_wait_seconds_count", limit="upstream_requests")
    assert slots > 100 * rounds, slots
    assert after[1] <= baseline[1], "file descriptors left open"
    assert after[0] <= baseline[0] * 1.25 + 16 * 2**20, "memory grew with the rounds"


async def _read(http: aiohttp.ClientSession, url: str, uri: str) -> int:
    async with http.post(
        url, json=request("resources/read", {"uri": uri}), headers=headers("resources/read", uri)
    ) as resp:
        await resp.read()
        return resp.status


async def _settled(sidecar: Replica, pid: int, upstream: Service) -> tuple[int, int]:
    """(RSS, fds) once every stream and watch of the last round is gone."""

    async def gone() -> bool:
        metrics = await sidecar.metrics()
        names = ("mcp_sidecar_listen_streams", "mcp_sidecar_watches", "mcp_sidecar_clients_active")
        return all(metrics.total(name) == 0 for name in names)

    await eventually(gone, within_s=30, step=0.05)
    return _process_figures(pid, sidecar, upstream)


async def _status_from(url: str, local_address: str, uri: str, extra: dict[str, str] | None = None) -> int:
    """The HTTP status of one read sent from `local_address`."""
    connector = aiohttp.TCPConnector(local_addr=(local_address, 0))
    sent = {**headers("resources/read", uri), **(extra or {})}
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(url, json=request("resources/read", {"uri": uri}), headers=sent) as resp,
    ):
        await resp.read()
        return resp.status


@pytest.mark.parametrize("trusted", [True, False], ids=["nginx-trusted", "nothing-trusted"])
async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_share_and_a_spoofed_header_counts_nothing(
    trusted: bool, tmp_path: Path
) -> None:
    # One slot per client and no queue: a second request from a client whose slot is taken is refused at once.
    upstream = {"max_requests_per_client": 1, "max_queued_per_client": 0, "timeout_s": 30}
    listen = {"trusted_proxies": ["127.0.0.1/32"] if trusted else []}
    async with (
        FaultyUpstream() as up,
        serve_sidecar(up.url, upstream=upstream, listen=listen) as sidecar,
        nginx_proxy(tmp_path, [int(sidecar.base_url.rsplit(":", 1)[1])]) as lb,
    ):
        up.fail(Fault.HANG, uri="hang://x")
        hung = asyncio.ensure_future(_status_from(lb.url, "127.0.0.2", "hang://x"))
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].in_flight == 1)
            # The same client again (through nginx): over its own bound.
            assert await _status_from(lb.url, "127.0.0.2", "ok://again") == 429
            # Another client through the same nginx: refused too only when the sidecar cannot tell them apart.
            assert await _status_from(lb.url, "127.0.0.3", "ok://other") == (200 if trusted else 429)
            # The first client again, naming another address in the header nginx passes on: not believed either.
            assert await _status_from(lb.url, "127.0.0.2", "ok://forged", {"Forwarded": "for=192.0.2.9"}) == 429
            # A client straight to the sidecar claiming to be the first one: its header is not believed.
            spoofed = {"X-Forwarded-For": "127.0.0.2"}
            assert await _status_from(sidecar.url, "127.0.0.4", "ok://spoof", spoofed) == 200
        finally:
            await up.stop()
            await asyncio.gather(hung, return_exceptions=True)


async def test_a_first_read_waiting_in_another_clients_queue_is_never_joined(tmp_path: Path) -> None:
    # Both clients anonymous (one context), from two addresses (two clients): the greedy one's read of the URI
    # waits in its own full queue; the polite one's listen on the same URI must not wait behind it.
    polling = {"max_baselines_per_s": 1, "baseline_wait_s": 30}
    upstream = {"max_requests_per_client": 1, "timeout_s": 60}
    greedy = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.1", 0)))
    polite = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
    async with (
        FaultyUpstream() as up,
        serve_sidecar(up.url, polling=polling, upstream=upstream) as sidecar,
        greedy,
        polite,
    ):
        up.fail(Fault.HANG, uri="hang://x")
        hung = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", "hang://x"))
        waiting: asyncio.Future[Any] | None = None
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].in_flight == 1)
            warm = await ListenStream.connect(greedy, sidecar.url, "warm", ["ok://warm"])  # spends its one token
            await warm.aclose()
            waiting = asyncio.ensure_future(
                ListenStream.connect(greedy, sidecar.url, "g", ["ok://shared"], within_s=60)
            )
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 1)  # its first read waits its turn
            stream = await ListenStream.connect(polite, sidecar.url, "p", ["ok://shared"], within_s=10)
            await stream.aclose()
            assert not waiting.done()
        finally:
            await up.stop()
            await asyncio.gather(hung, *([waiting] if waiting else []), return_exceptions=True)


async def test_identical_reads_share_one_upstream_request_once_it_is_upstream_and_never_before(tmp_path: Path) -> None:
    upstream = {"max_requests_per_client": 1, "timeout_s": 60}
    async with FaultyUpstream() as up, serve_sidecar(up.url, upstream=upstream) as sidecar:
        up.delays["slow://shared"] = 0.5
        up.fail(Fault.HANG, uri="hang://x")
        # In flight upstream: two clients (two addresses, one anonymous context) asking the same share it.
        first = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.2", "slow://shared"))
        await eventually(lambda: len(up.reads()) == 1)
        assert await _status_from(sidecar.url, "127.0.0.3", "slow://shared") == 200
        assert await first == 200
        assert len(up.reads()) == 1
        # Still waiting in its client's queue: another client asking the same goes on its own.
        hung = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", "hang://x"))
        queued = asyncio.ensure_future(_status_from(sidecar.url, "127.0.0.1", "ok://popular"))
        try:
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 1)
            assert await _status_from(sidecar.url, "127.0.0.4", "ok://popular") == 200
            assert not queued.done()
        finally:
            await up.stop()
            await asyncio.gather(hung, queued, return_exceptions=True)
