"""The scenarios. Each starts what it needs on its own AsyncExitStack and stops it before the next one runs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import itertools
import json
import os
import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    REPO_ROOT,
    children,
    cpu_seconds,
    histogram_quantile,
    percentile,
    rss_bytes,
    scrape,
    tools_call_trigger,
)
from bench.report import Results, fmt
from bench.services import (
    LOOP_ENV,
    LoadClient,
    Service,
    Sidecar,
    nginx_missing,
    peer_proxy_missing,
    redis_missing,
    start_fast_upstream,
    start_loadgen,
    start_naive_proxy,
    start_nginx,
    start_peer_proxy,
    start_redis,
    start_sdk_upstream,
    start_sidecar,
    start_supergateway,
    stdio_upstream_argv,
    supergateway_missing,
    uvloop_missing,
)
from bench.wrk import WrkStats, wrk_missing, wrk_reads

__all__ = ["SCENARIOS", "Context", "Profile"]

INTERVAL_S = 1.0
"""The poll interval of every subscription scenario: the SDK upstream's ttlMs (1000), or the sidecar's
default_interval_ms (1000) for the fast upstream, whose ttlMs is 0."""
CONCURRENCY = 32
_values = itertools.count(1)


@dataclass(frozen=True)
class Profile:
    forward_s: float
    warmup_s: float
    single_s: float
    peer_default: bool
    """Also measure FastMCP's proxy as it ships (a fresh backend session per request: slow to measure)."""
    coalesce_window_s: float
    oob_changes: int
    tool_changes: int
    fanout_streams: tuple[int, ...]
    """Listen streams on one URI, one fan-out measurement per size (issue 17: first-to-last at 2,000 and 10,000)."""
    fanout_changes: int
    storm_streams: int
    storm_changes: int
    idle_streams: int
    watch_uris: int
    cpu_window_s: float


FULL = Profile(
    forward_s=10, warmup_s=1, single_s=3, peer_default=True, coalesce_window_s=15, oob_changes=20, tool_changes=20,
    fanout_streams=(2_000, 10_000), fanout_changes=3, storm_streams=1000, storm_changes=5, idle_streams=2000,
    watch_uris=2000, cpu_window_s=20,
)  # fmt: skip
QUICK = Profile(
    forward_s=2, warmup_s=0.3, single_s=0.5, peer_default=False, coalesce_window_s=3, oob_changes=2,
    tool_changes=3, fanout_streams=(300, 1000), fanout_changes=1, storm_streams=300, storm_changes=1, idle_streams=300,
    watch_uris=2000, cpu_window_s=3,
)  # fmt: skip


@dataclass
class Context:
    workdir: Path
    quick: bool
    results: Results

    @property
    def profile(self) -> Profile:
        return QUICK if self.quick else FULL


def _ms(seconds: float | None) -> str:
    return fmt(None if seconds is None else seconds * 1000, "ms", 2 if seconds is not None and seconds < 0.01 else 1)


# -- forwarding -----------------------------------------------------------------------------------------


async def _gather_started(starts: dict[str, Awaitable[Service]], results: Results) -> dict[str, Service]:
    """Start services concurrently; one that fails to start is left out with a note (its stop is registered)."""
    names = list(starts)
    outcomes = await asyncio.gather(*starts.values(), return_exceptions=True)
    started: dict[str, Service] = {}
    for name, outcome in zip(names, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if isinstance(outcome, asyncio.CancelledError | KeyboardInterrupt):
                raise outcome
            results.note(f"{name} could not be started, so it is left out: {str(outcome).splitlines()[0]}")
        else:
            started[name] = outcome
    return started


NAIVE = "naive aiohttp proxy"
"""bench/naive_proxy.py: read, parse, post upstream on one shared session, return; the floor of a Python hop."""
SIDECAR_ASYNCIO = "mcp-sidecar (asyncio loop)"
"""The same sidecar with `listen.event_loop: asyncio`; the plain `mcp-sidecar` runs on its default, uvloop."""
PEER_DEFAULT = "Python peer (fastmcp, default)"
PEER_SHARED = "Python peer (fastmcp, shared session)"


def _sec(stats: dict[str, Any], key: str) -> float | None:
    value = stats.get(key)
    return None if value is None else float(value) / 1000


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


async def forward(ctx: Context) -> None:
    """resources/read at concurrency 32 and 1: direct, via nginx, via the Python peer proxy, via mcp-sidecar."""
    p, r = ctx.profile, ctx.results
    scenario = f"forward c={CONCURRENCY}"
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, ctx.workdir)
        starts: dict[str, Awaitable[Service]] = {
            "mcp-sidecar": start_sidecar(stack, ctx.workdir, "sidecar-forward", upstream.url),
            NAIVE: start_naive_proxy(stack, ctx.workdir, upstream.url),
        }
        if os.environ.get(LOOP_ENV) is None and uvloop_missing() is None:
            starts[SIDECAR_ASYNCIO] = start_sidecar(
                stack, ctx.workdir, "sidecar-forward-asyncio", upstream.url, event_loop="asyncio"
            )
        if (missing := nginx_missing()) is None:
            starts["nginx"] = start_nginx(stack, ctx.workdir, upstream.port)
        else:
            r.note(f"nginx baseline left out: {missing}")
        if (missing := peer_proxy_missing()) is None:
            if p.peer_default:
                starts[PEER_DEFAULT] = start_peer_proxy(stack, ctx.workdir, upstream.url, reuse_session=False)
            starts[PEER_SHARED] = start_peer_proxy(stack, ctx.workdir, upstream.url, reuse_session=True)
        else:
            r.note(f"Python peer proxy baseline left out: {missing}")
        started = await _gather_started(starts, r)
        if "mcp-sidecar" not in started:
            raise RuntimeError("the sidecar did not start; see the note")
        load = await start_loadgen(stack, ctx.workdir, "loadgen-forward")
        order = ("nginx", NAIVE, PEER_DEFAULT, PEER_SHARED, "mcp-sidecar", SIDECAR_ASYNCIO)
        targets = [("direct", upstream.url)] + [(name, started[name].url) for name in order if name in started]
        many: dict[str, dict[str, Any]] = {}
        one: dict[str, dict[str, Any]] = {}
        for name, url in targets:
            many[name] = await load.call(
                "forward", url=url, concurrency=CONCURRENCY, duration_s=p.forward_s, warmup_s=p.warmup_s
            )
            one[name] = await load.call("forward", url=url, concurrency=1, duration_s=p.single_s, warmup_s=p.warmup_s)
            for label, stats in ((f"c={CONCURRENCY}", many[name]), ("c=1", one[name])):
                if stats["errors"]:
                    r.note(f"forward via {name} ({label}): {stats['errors']} failed requests (not in the latencies)")

    direct, direct_one = many["direct"], one["direct"]
    for name, _ in targets:
        stats = many[name]
        value = fmt(stats["rps"], "req/s", 0)
        if name != "direct" and direct["rps"]:
            value += f" ({stats['rps'] / direct['rps']:.2f}x direct)"
        r.add(scenario, f"{name}: throughput", value)
    for name, _ in targets:
        stats, single = many[name], one[name]
        latency = f"p50 {_ms(_sec(stats, 'p50_ms'))}, p99 {_ms(_sec(stats, 'p99_ms'))}"
        if name != "direct":
            latency += (
                f" (added p50 {_ms(_diff(_sec(stats, 'p50_ms'), _sec(direct, 'p50_ms')))},"
                f" p99 {_ms(_diff(_sec(stats, 'p99_ms'), _sec(direct, 'p99_ms')))})"
            )
        r.add(scenario, f"{name}: latency c={CONCURRENCY}", latency)
        latency = f"p50 {_ms(_sec(single, 'p50_ms'))}, p99 {_ms(_sec(single, 'p99_ms'))}"
        if name != "direct":
            latency += f" (added p50 {_ms(_diff(_sec(single, 'p50_ms'), _sec(direct_one, 'p50_ms')))})"
        r.add("forward c=1", f"{name}: latency", latency)

    sidecar = many["mcp-sidecar"]["rps"]
    peers = [(name, many[name]["rps"]) for name in (PEER_DEFAULT, PEER_SHARED) if name in many]
    if peers:
        best_name, best = max(peers, key=lambda item: item[1])
        ratio = sidecar / best if best else float("inf")
        label = "mcp-sidecar / fastest Python peer throughput"
        r.add(scenario, label, f"{ratio:.1f}x (vs {best_name.split('(')[1].rstrip(')')})", ">= 15x", ratio >= 15)
    else:
        r.add(scenario, "mcp-sidecar / Python peer throughput", "n/a (no peer)", ">= 15x")
    nginx = many.get("nginx")
    if nginx is not None and nginx["rps"] > 0:
        share = sidecar / nginx["rps"]
        r.add(scenario, "mcp-sidecar / nginx hop throughput", f"{share:.0%}", ">= 50%", share >= 0.5)
        ours, theirs = _sec(many["mcp-sidecar"], "p99_ms"), _sec(nginx, "p99_ms")
        if ours is not None and theirs:
            tail = ours / theirs
            r.add(scenario, "mcp-sidecar p99 / nginx's p99", f"{tail:.2f}x", "<= 2x", tail <= 2)
    else:
        r.add(scenario, "mcp-sidecar / nginx hop throughput", "n/a (no nginx)", ">= 50%")
    naive = many.get(NAIVE)
    if naive is not None and naive["rps"] > 0:
        r.add(scenario, "mcp-sidecar / naive aiohttp proxy throughput", f"{sidecar / naive['rps']:.2f}x")
    on_asyncio = many.get(SIDECAR_ASYNCIO)
    if on_asyncio is not None and on_asyncio["rps"] > 0:
        r.add(
            scenario, "mcp-sidecar on uvloop (default) / on asyncio throughput", f"{sidecar / on_asyncio['rps']:.2f}x"
        )
    added = _diff(_sec(one["mcp-sidecar"], "p50_ms"), _sec(direct_one, "p50_ms"))
    r.add(
        "forward c=1", "mcp-sidecar added p50 latency", _ms(added), "<= 0.4 ms", added is not None and added <= 0.0004
    )
    r.note(
        f"Forwarding: each request reads a different URI (`bench://items/<n>`), so no two identical requests are in "
        f"flight and the sidecar's single-flight cannot merge them; the fast upstream answers ttlMs 0, so nothing "
        f"is cached. {p.forward_s:g} s per target at concurrency {CONCURRENCY} after {p.warmup_s:g} s of warm-up, "
        f"then {p.single_s:g} s at concurrency 1; throughput counts the answers completed inside the window. The "
        f"naive aiohttp proxy (bench/naive_proxy.py) reads the body, parses it, posts it upstream on one shared "
        f"aiohttp session and returns the answer: what a Python hop costs without the sidecar's own work. "
        f"`mcp-sidecar` runs on its default loop, uvloop; `mcp-sidecar (asyncio loop)` is the same sidecar with "
        f"`listen.event_loop: asyncio` (${LOOP_ENV}=asyncio or =uvloop runs every sidecar of the bench on one). nginx "
        f"runs one worker with keep-alive to the upstream. The load generator, the upstream and the proxy share the "
        f"machine's cores, so every throughput is bounded by the slowest of them."
    )
    if peers:
        modes = (
            "as it ships (a fresh backend client per request, its context-safe default) and given"
            if p.peer_default
            else "given"
        )
        skipped = "" if p.peer_default else " The quick run skips the shipped default mode, which is slower still."
        r.note(
            f"Python peer: FastMCP {_version('fastmcp')} `create_proxy` in front of the same upstream, {modes} one "
            "connected `Client` that every request shares (its fastest mode; FastMCP warns it may mix request "
            "contexts); the ratio uses the faster mode." + skipped + " fastmcp 4.2 requires mcp>=2.3,<3, so it "
            "installs beside mcp==2.3.*; mcp-proxy was not used: it requires mcp<2 and would downgrade the SDK."
        )


CLIENT_LEVELS = (32, 128, 512)
"""Concurrent anonymous clients of the many-clients scenario (issue: fair share without refusal)."""


async def clients(ctx: Context) -> None:
    """Many anonymous clients from one address: c = 32, 128, 512 through mcp-sidecar and nginx, every request a
    distinct read (wrk: the Python load generator would slow nginx down at 512 as much as the sidecar);
    throughput, the share of failed requests, p50/p99."""
    p, r = ctx.profile, ctx.results
    scenario = "many clients"
    if (missing := wrk_missing()) is not None:
        r.note(f"many-clients scenario left out: {missing}")
        return
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, ctx.workdir)
        starts: dict[str, Awaitable[Service]] = {
            "mcp-sidecar": start_sidecar(stack, ctx.workdir, "sidecar-clients", upstream.url)
        }
        if (missing := nginx_missing()) is None:
            starts["nginx"] = start_nginx(stack, ctx.workdir, upstream.port)
        else:
            r.note(f"nginx baseline of the many-clients scenario left out: {missing}")
        started = await _gather_started(starts, r)
        if "mcp-sidecar" not in started:
            raise RuntimeError("the sidecar did not start; see the note")
        runs: dict[tuple[str, int], WrkStats] = {}
        for level in CLIENT_LEVELS:
            for name in ("nginx", "mcp-sidecar"):
                if name in started:
                    runs[(name, level)] = await wrk_reads(
                        started[name].url, connections=level, duration_s=p.forward_s, prefix=f"bench://c{level}/"
                    )
    for level in CLIENT_LEVELS:
        for name in ("nginx", "mcp-sidecar"):
            stats = runs.get((name, level))
            if stats is None:
                continue
            value = (
                f"{fmt(stats.rps, 'req/s', 0)}, {stats.failed_share:.1%} failed, "
                f"p50 {_ms(stats.p50_ms / 1000)}, p99 {_ms(stats.p99_ms / 1000)}"
            )
            if name == "mcp-sidecar":
                r.add(scenario, f"{name} c={level}", value, "0% failed", stats.failed == 0)
            else:
                r.add(scenario, f"{name} c={level}", value)
    low, high = runs[("mcp-sidecar", CLIENT_LEVELS[0])], runs[("mcp-sidecar", CLIENT_LEVELS[-1])]
    kept = high.rps / low.rps if low.rps else 0.0
    label = f"mcp-sidecar throughput c={CLIENT_LEVELS[-1]} / c={CLIENT_LEVELS[0]}"
    r.add(scenario, label, f"{kept:.2f}x", ">= 0.8x", kept >= 0.8)
    nginx_low, nginx_high = runs.get(("nginx", CLIENT_LEVELS[0])), runs.get(("nginx", CLIENT_LEVELS[-1]))
    if nginx_low is not None and nginx_high is not None and nginx_low.rps:
        r.add(
            scenario,
            f"nginx throughput c={CLIENT_LEVELS[-1]} / c={CLIENT_LEVELS[0]}",
            f"{nginx_high.rps / nginx_low.rps:.2f}x",
        )
    r.note(
        f"Many clients: wrk (one thread) holds c keep-alive connections from 127.0.0.1, each an anonymous client "
        f"(no Authorization) reading a distinct URI every request, {p.forward_s:g} s per level; the sidecar runs "
        f"its defaults, so its fair share lets 75 requests at a time upstream and the rest wait their turn "
        f"instead of being refused. A failed request is a non-2xx answer or a connect, read, write or timeout "
        f"error."
    )


async def workers(ctx: Context) -> None:
    """`run --workers 2` on the Redis bus against `--workers 1` on the Redis bus: forwarding throughput."""
    p, r = ctx.profile, ctx.results
    scenario = "--workers 2 (Redis)"
    missing = redis_missing()
    if missing is not None:
        r.add(scenario, "throughput vs 1 worker", f"n/a ({missing})", ">= 1.6x")
        r.note(f"--workers scenario left out: {missing}")
        return
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, ctx.workdir)
        redis_url = await start_redis(stack, ctx.workdir)
        load = await start_loadgen(stack, ctx.workdir, "loadgen-workers")
        sections = {"bus": {"backend": "redis", "redis_url": redis_url}}
        rps: dict[int, float] = {}
        split: dict[int, str] = {}
        for count in (1, 2):
            async with contextlib.AsyncExitStack() as inner:
                sidecar = await start_sidecar(
                    inner, ctx.workdir, f"sidecar-workers{count}", upstream.url, sections, count
                )
                await asyncio.sleep(1.0)  # every worker listening before the load starts
                pids = children(sidecar.pid) if count > 1 else [sidecar.pid]
                cpu_before = [cpu_seconds(pid) for pid in pids]
                stats = await load.call(
                    "forward", url=sidecar.url, concurrency=CONCURRENCY, duration_s=p.forward_s, warmup_s=p.warmup_s
                )
                used = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
                rps[count] = stats["rps"]
                split[count] = " + ".join(f"{u / (p.forward_s + p.warmup_s):.0%}" for u in used)
                if stats["errors"]:
                    r.note(f"--workers {count}: {stats['errors']} failed requests")
    for count in (1, 2):
        r.add(
            scenario, f"--workers {count}: throughput", f"{fmt(rps[count], 'req/s', 0)} (CPU {split[count]} of a core)"
        )
    ratio = rps[2] / rps[1] if rps[1] else float("nan")
    r.add(scenario, "--workers 2 / --workers 1", f"{ratio:.2f}x", ">= 1.6x", ratio >= 1.6)
    r.note(
        f"--workers: both runs use bus.backend redis (a local redis-server), concurrency {CONCURRENCY}, "
        f"{p.forward_s:g} s. The kernel spreads connections over the workers (SO_REUSEPORT). With "
        f"{_nproc()} cores shared by the load generator, the upstream and the workers, a second worker can only "
        "use what the others leave idle."
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _nproc() -> int:
    return os.cpu_count() or 1


# -- subscriptions --------------------------------------------------------------------------------------


def _oob_trigger(upstream: Service, name: str) -> dict[str, Any]:
    """An out-of-band change: the upstream's admin route, no MCP request through the sidecar."""
    return {
        "url": f"{upstream.base_url}/admin/set",
        "body": {"name": name, "value": next(_values)},
        "headers": {"Content-Type": "application/json"},
    }


def _tool_trigger(sidecar: Sidecar, name: str) -> dict[str, Any]:
    """A change through the sidecar: `tools/call set_value`, which makes its watches poll at once."""
    params = {"name": "set_value", "arguments": {"name": name, "value": next(_values)}}
    return tools_call_trigger(sidecar.url, params)


async def _read_times(upstream: Service, uri: str) -> list[float]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"{upstream.base_url}/admin/stats", params={"uri": uri}) as resp,
    ):
        body = await resp.json()
        return [float(t) for t in body["times"]]


async def _changes(
    load: LoadClient,
    group: str,
    count: int,
    trigger: Callable[[], dict[str, Any]],
    *,
    pause: tuple[float, float],
    timeout_s: float = 15.0,
    reread: bool = False,
    after: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> tuple[list[float], list[dict[str, Any]]]:
    """`count` changes, each after a random pause (so it lands at a random phase of the poll schedule)."""
    latencies: list[float] = []
    answers: list[dict[str, Any]] = []
    for _ in range(count):
        await asyncio.sleep(random.uniform(*pause))
        answer = await load.call("change", group=group, trigger=trigger(), timeout_s=timeout_s, reread=reread)
        if answer["trigger_status"] != 200:
            raise RuntimeError(f"change trigger answered {answer['trigger_status']}")
        latencies.extend(answer["latencies"])
        answers.append(answer)
        if after is not None:
            await after(answer)
    return latencies, answers


async def subscriptions(ctx: Context) -> None:
    """Coalescing, out-of-band and tools/call change latency, fan-out, and the re-read storm (SDK upstream)."""
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_sdk_upstream(stack, ctx.workdir, read_ttl_ms=int(INTERVAL_S * 1000))
        streams = {"max_streams": 20_000}
        main, tuned = await asyncio.gather(
            start_sidecar(stack, ctx.workdir, "sidecar-subs", upstream.url, {"streams": streams}),
            start_sidecar(
                stack,
                ctx.workdir,
                "sidecar-subs-nocache",
                upstream.url,
                {
                    "streams": streams,
                    "cache": {"max_entries": 0},
                    "polling": {"revalidate_debounce_ms": 5, "min_interval_ms": 100},
                },
            ),
        )
        load = await start_loadgen(stack, ctx.workdir, "loadgen-subs")
        await _coalescing(ctx, load, upstream, main)
        await _change_latency(ctx, load, upstream, main, tuned)
        await _fanout(ctx, load, main)
        await _storm(ctx, load, upstream, main, tuned)


async def _coalescing(ctx: Context, load: LoadClient, upstream: Service, sidecar: Sidecar) -> None:
    p, r = ctx.profile, ctx.results
    sizes = (1, 100, 1000)
    for n in sizes:
        opened = await load.call(
            "open", group=f"coalesce-{n}", url=sidecar.url, uris=[f"bench://values/coalesce{n}"], count=n
        )
        if opened["opened"] != n:
            raise RuntimeError(f"only {opened['opened']} of {n} listen streams opened: {opened['reasons']}")
    await asyncio.sleep(1.5 * INTERVAL_S)  # past the first poll after each baseline
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.sleep(p.coalesce_window_s)
    end = loop.time()
    for n in sizes:
        times = [t for t in await _read_times(upstream, f"bench://values/coalesce{n}") if start <= t <= end]
        if len(times) >= 2:
            rate = (len(times) - 1) / (times[-1] - times[0])
        else:
            rate = len(times) / (end - start)
        ratio = rate * INTERVAL_S
        ctx.results.coalescing.append((n, rate, INTERVAL_S))
        r.add(
            "coalescing",
            f"{n:,} stream{'s' if n > 1 else ''} on one URI: upstream reads/s x interval",
            f"{ratio:.2f} ({len(times)} reads in {end - start:.1f} s)",
            "<= 1.1",
            ratio <= 1.1,
        )
    # The 1,000-stream group stays open for the latency scenarios.
    for n in sizes[:-1]:
        await load.call("close", group=f"coalesce-{n}")
    r.note(
        f"Coalescing: 1, 100 and 1,000 listen streams, each group on its own URI, all open at once; reads counted "
        f"by the SDK upstream over {p.coalesce_window_s:g} s; reads/s is (reads - 1) / (last - first). Interval "
        f"{INTERVAL_S:g} s = the upstream's ttlMs, with the sidecar's default +/-10% jitter."
    )


async def _change_latency(ctx: Context, load: LoadClient, upstream: Service, main: Sidecar, tuned: Sidecar) -> None:
    p, r = ctx.profile, ctx.results
    group, name = "coalesce-1000", "coalesce1000"
    oob, answers = await _changes(
        load, group, p.oob_changes, lambda: _oob_trigger(upstream, name), pause=(0.2, 1.2 * INTERVAL_S)
    )
    missing = sum(a["missing"] for a in answers)
    ctx.results.cdf["out-of-band change, 1,000 streams"] = oob
    p50, p99 = percentile(oob, 0.5), percentile(oob, 0.99)
    r.add(
        "out-of-band change, 1,000 streams",
        "change to notification p50",
        _ms(p50),
        f"<= {(INTERVAL_S / 2 + 0.025) * 1000:.0f} ms",
        p50 <= INTERVAL_S / 2 + 0.025,
    )
    r.add(
        "out-of-band change, 1,000 streams",
        "change to notification p99",
        _ms(p99) + (f" ({missing} missed)" if missing else ""),
        f"<= {(INTERVAL_S + 0.1) * 1000:.0f} ms",
        p99 <= INTERVAL_S + 0.1 and not missing,
    )

    tool, answers = await _changes(load, group, p.tool_changes, lambda: _tool_trigger(main, name), pause=(0.2, 1.0))
    missing = sum(a["missing"] for a in answers)
    ctx.results.cdf["tools/call through the sidecar, 1,000 streams"] = tool
    p50 = percentile(tool, 0.5)
    r.add(
        "tools/call change, 1,000 streams",
        "tools/call sent to notification p50 (defaults)",
        _ms(p50) + (f" ({missing} missed)" if missing else ""),
        "<= 30 ms",
        p50 <= 0.030 and not missing,
    )
    r.add("tools/call change, 1,000 streams", "... p99 (defaults)", _ms(percentile(tool, 0.99)))
    await load.call("close", group=group)

    # The same on the second sidecar: revalidate_debounce_ms 5 and min_interval_ms 100 instead of 10 and 250.
    opened = await load.call("open", group="tuned", url=tuned.url, uris=["bench://values/tuned"], count=1000)
    if opened["opened"] != 1000:
        raise RuntimeError(f"only {opened['opened']} of 1000 listen streams opened: {opened['reasons']}")
    tool_tuned, answers = await _changes(
        load, "tuned", p.tool_changes, lambda: _tool_trigger(tuned, "tuned"), pause=(0.2, 1.0)
    )
    missing = sum(a["missing"] for a in answers)
    ctx.results.cdf["tools/call, debounce 5 ms / min interval 100 ms"] = tool_tuned
    p50 = percentile(tool_tuned, 0.5)
    r.add(
        "tools/call change, 1,000 streams",
        "p50 with revalidate_debounce_ms 5, min_interval_ms 100",
        _ms(p50) + (f" ({missing} missed)" if missing else ""),
        "<= 30 ms",
        p50 <= 0.030 and not missing,
    )
    r.add("tools/call change, 1,000 streams", "... p99 (tuned)", _ms(percentile(tool_tuned, 0.99)))
    await load.call("close", group="tuned")
    r.note(
        f"Change latency: time 0 is just before the load generator sends the change (an admin POST to the "
        f"upstream for out-of-band changes; `tools/call set_value` through the sidecar otherwise); each of the "
        f"1,000 streams contributes one sample per change ({p.oob_changes} out-of-band changes, {p.tool_changes} "
        f"tools/call changes, each after a random pause so it lands at a random phase of the poll schedule). "
        f"A tools/call makes the sidecar's watches poll after `polling.revalidate_debounce_ms` (default 10 ms), "
        f"and never sooner than `polling.min_interval_ms` (default 250 ms) after the previous poll of the key "
        f"(that wait jittered; a lone key's hint past it polls at once, only the hints after it within "
        f"jitter x min_interval_ms are spread); the tuned row shows the same path with 5 ms and 100 ms. "
        f"`python -m bench.ab --parts notify` measures the defaults' row interleaved between checkouts."
    )


async def _fanout(ctx: Context, load: LoadClient, sidecar: Sidecar) -> None:
    p, r = ctx.profile, ctx.results
    for n in p.fanout_streams:
        group = f"fanout-{n}"
        opened = await load.call(
            "open", group=group, url=sidecar.url, uris=["bench://values/fanout"], count=n, concurrency=64
        )
        if opened["opened"] != n:
            raise RuntimeError(f"only {opened['opened']} of {n} listen streams opened: {opened['reasons']}")
        await asyncio.sleep(1.0)
        _, answers = await _changes(
            load, group, p.fanout_changes, lambda: _tool_trigger(sidecar, "fanout"), pause=(0.5, 1.0), timeout_s=30
        )
        await load.call("close", group=group)
        ctx.results.cdf[f"fan-out, {n:,} streams (tools/call, defaults)"] = [t for a in answers for t in a["latencies"]]
        last = [a["latencies"][-1] for a in answers if a["latencies"]]
        spread = [a["latencies"][-1] - a["latencies"][0] for a in answers if a["latencies"]]
        missing = sum(a["missing"] for a in answers)
        scenario = f"fan-out, {n:,} streams on one URI"
        worst = max(last) if last else None
        big = n == max(p.fanout_streams)
        r.add(
            scenario,
            "tools/call sent to last stream notified (worst of changes)",
            _ms(worst) + (f" ({missing} missed)" if missing else ""),
            "<= 1 s" if big else "",
            (worst is not None and worst <= 1.0 and not missing) if big else None,
        )
        r.add(
            scenario,
            "first to last stream notified (median of changes)",
            _ms(statistics.median(spread) if spread else None),
        )
        r.add(scenario, "streams opened per second", fmt(n / opened["seconds"], "/s", 0))
    sizes = " and ".join(f"{n:,}" for n in p.fanout_streams)
    r.note(
        f"Fan-out: {sizes} listen streams on one URI held by one load-generator process (one size at a time); "
        f"{p.fanout_changes} change(s) through `tools/call` (defaults: 10 ms debounce) and the time until every "
        f"stream has read its notification. The client's own reading of that many sockets is part of the figure."
    )


async def _storm(ctx: Context, load: LoadClient, upstream: Service, main: Sidecar, nocache: Sidecar) -> None:
    """1,000 streams re-read right after each notification: how many reads reach the upstream."""
    p, r = ctx.profile, ctx.results
    variants = [
        ("mcp-sidecar (single-flight + ttlMs cache)", main, main.url, "storm-cache"),
        ("mcp-sidecar, cache.max_entries 0 (single-flight only)", nocache, nocache.url, "storm-sf"),
        ("direct to the upstream (no single-flight)", main, upstream.url, "storm-direct"),
    ]
    per_change: dict[str, list[int]] = {}
    for label, sidecar, reread_url, name in variants:
        uri = f"bench://values/{name}"
        opened = await load.call(
            "open", group=name, url=sidecar.url, uris=[uri], count=p.storm_streams, reread_url=reread_url
        )
        if opened["opened"] != p.storm_streams:
            raise RuntimeError(f"only {opened['opened']} of {p.storm_streams} streams opened: {opened['reasons']}")
        counts: list[int] = []

        async def count_reads(answer: dict[str, Any], uri: str = uri, counts: list[int] = counts) -> None:
            if answer["first_at"] is None or answer["reread_done_at"] is None:
                return
            if answer["reread_failed"]:
                ctx.results.note(f"re-read storm: {answer['reread_failed']} re-reads failed")
            times = await _read_times(upstream, uri)
            counts.append(sum(1 for t in times if answer["first_at"] <= t <= answer["reread_done_at"]))

        await asyncio.sleep(1.0)
        await _changes(
            load,
            name,
            p.storm_changes,
            functools.partial(_oob_trigger, upstream, name),
            pause=(0.3, 1.0),
            timeout_s=30,
            reread=True,
            after=count_reads,
        )
        await load.call("close", group=name)
        per_change[label] = counts
    for label, counts in per_change.items():
        value = (
            f"{statistics.mean(counts):,.1f} (min {min(counts)}, max {max(counts)})"
            if counts
            else "n/a (no change seen)"
        )
        r.add(f"re-read storm, {p.storm_streams:,} streams", f"{label}: upstream reads per change", value)
    r.note(
        "Re-read storm: after each out-of-band change every stream re-reads the resource as soon as its "
        "notification arrives, over a warm pool of 100 keep-alive connections per group (below the sidecar's "
        "accept backlog, so no SYN retransmits). Counted: the upstream's reads of that URI from the first "
        "notification to the last re-read's answer (the poll that found the change came before, so it is not "
        "counted). The sidecar has no switch that turns single-flight off (`cache.max_entries: 0` turns off only "
        "the ttlMs cache; see sidecar/downstream/readthrough.py), so the no-single-flight baseline is the same "
        "clients re-reading directly from the upstream."
    )


# -- watches and memory ---------------------------------------------------------------------------------


async def watches(ctx: Context) -> None:
    """RSS per idle stream and per watch; CPU per poll and schedule lag with 2,000 watched URIs at 1 s."""
    p, r = ctx.profile, ctx.results
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, ctx.workdir)
        sidecar = await start_sidecar(
            stack,
            ctx.workdir,
            "sidecar-watches",
            upstream.url,
            {
                # One load generator is one client: its 2,000 first reads in a burst need more than the
                # per-client polling.max_baselines_per_s a production default allows.
                "polling": {"default_interval_ms": int(INTERVAL_S * 1000), "max_baselines_per_s": 100_000},
                "streams": {"max_streams": 20_000, "max_uris_per_stream": 1000},
            },
        )
        load = await start_loadgen(stack, ctx.workdir, "loadgen-watches")
        ten = [f"bench://items/mem{i}" for i in range(10)]
        await load.call("open", group="warm", url=sidecar.url, uris=ten, count=1)
        await asyncio.sleep(1.5)
        rss_a = rss_bytes(sidecar.pid)
        n = p.idle_streams
        opened = await load.call("open", group="idle", url=sidecar.url, uris=ten, count=n, concurrency=32)
        if opened["opened"] != n:
            raise RuntimeError(f"only {opened['opened']} of {n} streams opened: {opened['reasons']}")
        await asyncio.sleep(2.0)
        rss_b = rss_bytes(sidecar.pid)
        per_stream = (rss_b - rss_a) / n
        r.add("memory", "RSS per idle stream (10 URIs each)", fmt(per_stream / 1024, "KiB"), "<= 12 KiB",
              per_stream <= 12 * 1024)  # fmt: skip

        uris = [f"bench://items/w{i}" for i in range(p.watch_uris)]
        per = 100
        holders = len(uris) // per
        for index in range(holders):
            answer = await load.call(
                "open", group="watch", url=sidecar.url, uris=uris[index * per : (index + 1) * per], count=1
            )
            if answer["opened"] != 1:
                raise RuntimeError(f"a 100-URI listen stream did not open: {answer['reasons']}")
        await asyncio.sleep(2.0)
        rss_c = rss_bytes(sidecar.pid)
        per_watch = (rss_c - rss_b - holders * per_stream) / len(uris)
        r.add("memory", f"RSS per watch ({len(uris):,} URIs, one subscription each)", fmt(per_watch / 1024, "KiB"),
              "<= 4 KB", per_watch <= 4 * 1024)  # fmt: skip

        await load.call("close", group="idle")
        await asyncio.sleep(1.5)
        before = await scrape(sidecar.admin_url)
        cpu_before = cpu_seconds(sidecar.pid)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(p.cpu_window_s)
        cpu_after = cpu_seconds(sidecar.pid)
        elapsed = loop.time() - started
        after = await scrape(sidecar.admin_url)
        polls = after.value("mcp_sidecar_polls_total", kind="resource") - before.value(
            "mcp_sidecar_polls_total", kind="resource"
        )
        errors = after.value("mcp_sidecar_polls_total", kind="resource", outcome="error") - before.value(
            "mcp_sidecar_polls_total", kind="resource", outcome="error"
        )
        lag = "mcp_sidecar_poll_schedule_lag_seconds"
        lag_p99 = histogram_quantile(0.99, before.buckets(lag), after.buckets(lag))
        lag_p50 = histogram_quantile(0.50, before.buckets(lag), after.buckets(lag))
        cpu_per_poll = (cpu_after - cpu_before) / polls if polls else None
        scenario = f"{len(uris):,} watched URIs at {INTERVAL_S:g} s"
        r.add(
            scenario, "polls per second", fmt(polls / elapsed, "/s", 0) + (f" ({errors:.0f} failed)" if errors else "")
        )
        r.add(scenario, "sidecar CPU per poll", fmt(None if cpu_per_poll is None else cpu_per_poll * 1e6, "us", 0),
              "<= 250 us", cpu_per_poll is not None and cpu_per_poll <= 250e-6)  # fmt: skip
        r.add(scenario, "sidecar CPU use", f"{(cpu_after - cpu_before) / elapsed:.0%} of one core")
        r.add(scenario, "poll schedule lag p50", _ms(lag_p50))
        r.add(scenario, "poll schedule lag p99", _ms(lag_p99), "<= 100 ms", lag_p99 is not None and lag_p99 <= 0.1)
    r.note(
        f"Memory: VmRSS of the sidecar process (/proc/<pid>/status) after warm-up with the 10 watches in place, "
        f"after {n:,} more idle streams on those 10 URIs, then after {len(uris):,} more watched URIs held by "
        f"{holders} streams of 100 URIs (their stream overhead subtracted). CPU per poll: utime+stime "
        f"(/proc/<pid>/stat) over {p.cpu_window_s:g} s divided by `mcp_sidecar_polls_total` over the same window "
        f"(everything the process did counts, scrapes included); lag quantiles interpolate within "
        f"`mcp_sidecar_poll_schedule_lag_seconds` buckets, as Prometheus' histogram_quantile does. Upstream: the "
        f"fast aiohttp one (ttlMs 0, so the sidecar's default_interval_ms of {INTERVAL_S * 1000:.0f} ms applies): "
        f"the SDK server could not answer {len(uris):,} reads/s on this machine, and its queueing would show up "
        f"as schedule lag that is not the sidecar's."
    )


STDIO_DIRECT = "direct (stdio, no proxy)"
STDIO_SIDECAR = "mcp-sidecar (stdio upstream)"
STDIO_BRIDGED = "mcp-sidecar -> supergateway"


async def stdio(ctx: Context) -> None:
    """resources/read of a stdio server through mcp-sidecar's own stdio upstream, and through mcp-sidecar in front
    of supergateway (the stdio-to-HTTP bridge people run today), beside the server driven straight on its stdin."""
    p, r = ctx.profile, ctx.results
    scenario = f"stdio c={CONCURRENCY}"
    server = stdio_upstream_argv()
    async with contextlib.AsyncExitStack() as stack:
        starts: dict[str, Awaitable[Service]] = {
            STDIO_SIDECAR: start_sidecar(stack, ctx.workdir, "sidecar-stdio", "", {"upstream": {"command": server}}),
        }
        if (missing := supergateway_missing()) is None:
            gateway = await start_supergateway(stack, ctx.workdir, server)
            # At 2025-11-25 the sidecar keeps one session with supergateway: its session-less 2026-07-28 requests
            # would each make supergateway start a child (about 100 ms a request), no fair baseline.
            bridged = {"upstream": {"protocol": "2025-11-25"}}
            starts[STDIO_BRIDGED] = start_sidecar(stack, ctx.workdir, "sidecar-supergateway", gateway.url, bridged)
        else:
            r.note(f"supergateway baseline left out: {missing}")
        started = await _gather_started(starts, r)
        if STDIO_SIDECAR not in started:
            raise RuntimeError("the sidecar with a stdio upstream did not start; see the note")
        load = await start_loadgen(stack, ctx.workdir, "loadgen-stdio")
        many: dict[str, dict[str, Any]] = {}
        one: dict[str, dict[str, Any]] = {}
        for concurrency, into, seconds in ((CONCURRENCY, many, p.forward_s), (1, one, p.single_s)):
            into[STDIO_DIRECT] = await load.call(
                "forward_stdio", argv=server, cwd=str(REPO_ROOT), concurrency=concurrency, duration_s=seconds,
                warmup_s=p.warmup_s,
            )  # fmt: skip
            for name, service in started.items():
                into[name] = await load.call(
                    "forward", url=service.url, concurrency=concurrency, duration_s=seconds, warmup_s=p.warmup_s
                )
        for stats_by_name, label in ((many, f"c={CONCURRENCY}"), (one, "c=1")):
            for name, stats in stats_by_name.items():
                if stats["errors"]:
                    r.note(f"stdio via {name} ({label}): {stats['errors']} failed requests (not in the latencies)")

    direct, direct_one = many[STDIO_DIRECT], one[STDIO_DIRECT]
    names = [STDIO_DIRECT, *(name for name in (STDIO_SIDECAR, STDIO_BRIDGED) if name in many)]
    for name in names:
        value = fmt(many[name]["rps"], "req/s", 0)
        if name != STDIO_DIRECT and direct["rps"]:
            value += f" ({many[name]['rps'] / direct['rps']:.2f}x direct)"
        r.add(scenario, f"{name}: throughput", value)
    for name in names:
        stats, single = many[name], one[name]
        latency = f"p50 {_ms(_sec(stats, 'p50_ms'))}, p99 {_ms(_sec(stats, 'p99_ms'))}"
        r.add(scenario, f"{name}: latency c={CONCURRENCY}", latency)
        latency = f"p50 {_ms(_sec(single, 'p50_ms'))}, p99 {_ms(_sec(single, 'p99_ms'))}"
        if name != STDIO_DIRECT:
            latency += f" (added p50 {_ms(_diff(_sec(single, 'p50_ms'), _sec(direct_one, 'p50_ms')))})"
        r.add("stdio c=1", f"{name}: latency", latency)
    if STDIO_BRIDGED in many and many[STDIO_BRIDGED]["rps"]:
        ratio = many[STDIO_SIDECAR]["rps"] / many[STDIO_BRIDGED]["rps"]
        r.add(scenario, "stdio upstream / via supergateway throughput", f"{ratio:.1f}x", ">= 1x", ratio >= 1)
        added = {
            name: _diff(_sec(one[name], "p50_ms"), _sec(direct_one, "p50_ms"))
            for name in (STDIO_SIDECAR, STDIO_BRIDGED)
        }
        r.add(
            "stdio c=1",
            "added p50: stdio upstream vs via supergateway",
            f"{_ms(added[STDIO_SIDECAR])} vs {_ms(added[STDIO_BRIDGED])}",
        )
    r.note(
        "stdio: the server is bench/fast_stdio_upstream.py (one line in, one line out, ttlMs 0), the same command for "
        "every target. `direct` writes requests straight to its stdin from the load generator (no HTTP, no proxy): "
        "the floor. `mcp-sidecar (stdio upstream)` starts it as upstream.command; `mcp-sidecar -> supergateway` is "
        f"what a user without stdio support would run: supergateway {_supergateway_version()} (npm, --stateful "
        "Streamable HTTP; its stateless mode starts a child per request) in front of the server, the sidecar in "
        "front of it with upstream.protocol 2025-11-25, so that all requests share one supergateway session (a "
        "2026-07-28 request carries no session, and supergateway then starts a child for it). Each request reads "
        "a different URI, as in the forwarding scenario."
    )


def _supergateway_version() -> str:
    package = REPO_ROOT / ".tools" / "supergateway" / "node_modules" / "supergateway" / "package.json"
    try:
        return str(json.loads(package.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError):
        return "(not installed)"


SCENARIOS: dict[str, Callable[[Context], Awaitable[None]]] = {
    "forward": forward,
    "clients": clients,
    "workers": workers,
    "subscriptions": subscriptions,
    "watches": watches,
    "stdio": stdio,
}
