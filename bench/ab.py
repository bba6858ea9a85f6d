"""`python -m bench.ab`: side-by-side comparisons, interleaved, for a machine that others share.

    python -m bench.ab                                  # this checkout, asyncio and uvloop, every part, 3 rounds
    python -m bench.ab --tree base=/src/a --tree new=/src/b --loops asyncio --parts forward --rounds 5
    python -m bench.ab --tree base=/src/a@asyncio+uvloop --tree new=/src/b@asyncio --parts forward

Each sidecar variant is a checkout (`--tree NAME=PATH`, whose `sidecar` package runs) on an event loop
(`--loops`). Every part runs its targets in rounds, A B A B, the order rotated each round, and reports the
median over rounds; a ratio is the median of the per-round ratios, so a slow moment hurts both sides of it.

Parts:
- `forward`: `resources/read`, every request its own URI (`bench://items/<n>`), so single-flight cannot
  merge any two; the fast upstream answers ttlMs 0, so nothing is cached. Concurrency 32 and 1, against the
  upstream directly, nginx as a plain hop, the naive aiohttp proxy (bench/naive_proxy.py), optionally
  FastMCP's proxy with a shared session (`--peer`), and each sidecar variant; also the sidecar's CPU per
  request (utime + stime over the window / answers), which other load disturbs less than throughput.
- `fanout`: N listen streams on one URI (`--fanout 2000,10000`), `--changes` changes through `tools/call`
  (the fast upstream's `bump`): tools/call sent to the last stream notified, and first to last.
- `memory`: RSS per idle listen stream with 10 URIs (2,000 streams after one warm stream on the same URIs).
- `polls`: 2,000 watched URIs at 1 s (20 streams of 100 URIs): sidecar CPU per poll, schedule lag p50/p99.
- `notify`: 1,000 listen streams on one URI of the SDK upstream (ttlMs 1 s, as `python -m bench`'s change
  latency), `--notify-changes` changes through `tools/call set_value`, each after a random pause of 0.2-1 s (a
  random phase of the poll schedule), at the defaults: tools/call sent to each stream's notification, p50 and
  p99 over every stream of every change, and the tools/call's own answer time and the first stream's, which
  split it into the write, the debounce and hinted poll, and the fan-out.

At the end, issue 17's eight figures for each variant. The load average is printed with every part: read the
ratios, not the absolute figures, when it is high.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    cpu_seconds,
    histogram_quantile,
    raise_fd_limit,
    rss_bytes,
    scrape,
    tools_call_trigger,
)
from bench.services import (
    LoadClient,
    Service,
    Sidecar,
    kill_leftovers,
    nginx_missing,
    peer_proxy_missing,
    start_fast_upstream,
    start_loadgen,
    start_naive_proxy,
    start_nginx,
    start_peer_proxy,
    start_sdk_upstream,
    start_sidecar,
    uvloop_missing,
)

__all__ = ["main"]

CONCURRENCY = 32
PARTS = ("forward", "fanout", "memory", "polls", "notify")
_FANOUT_URI = "bench://items/fanout"


@dataclass(frozen=True)
class Variant:
    """One sidecar to measure: a checkout on an event loop."""

    tree_name: str
    tree: Path
    loop: str

    @property
    def name(self) -> str:
        return self.tree_name if self.loop == "asyncio" else f"{self.tree_name}+{self.loop}"


@dataclass
class Options:
    variants: list[Variant]
    rounds: int
    parts: list[str]
    forward_s: float
    single_s: float
    warmup_s: float
    fanout: list[int]
    changes: int
    notify_changes: int
    idle_streams: int
    watch_uris: int
    cpu_window_s: float
    naive: bool
    nginx: bool
    peer: bool


@dataclass
class Samples:
    """Per target and measure, one value per round."""

    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, target: str, measure: str, value: float | None) -> None:
        if value is not None:
            self.values.setdefault(target, {}).setdefault(measure, []).append(value)

    def median(self, target: str, measure: str) -> float | None:
        found = self.values.get(target, {}).get(measure)
        return statistics.median(found) if found else None

    def spread(self, target: str, measure: str) -> str:
        found = self.values.get(target, {}).get(measure)
        if not found or len(found) < 2:
            return ""
        return f" [{min(found):,.3g}..{max(found):,.3g}]"


def _rotated(items: list[Any], by: int) -> list[Any]:
    if not items:
        return items
    by %= len(items)
    return items[by:] + items[:by]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- forward ----------------------------------------------------------------------------------------------


async def forward(opts: Options, workdir: Path, samples: Samples) -> None:
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, workdir)
        targets: list[tuple[str, Service]] = [("direct", upstream)]
        if opts.nginx and nginx_missing() is None:
            targets.append(("nginx", await start_nginx(stack, workdir, upstream.port)))
        if opts.naive:
            targets.append(("naive aiohttp proxy", await start_naive_proxy(stack, workdir, upstream.url)))
        if opts.peer and peer_proxy_missing() is None:
            targets.append(("fastmcp (shared session)", await start_peer_proxy(stack, workdir, upstream.url,
                                                                                reuse_session=True)))  # fmt: skip
        pids: dict[str, int] = {}
        for variant in opts.variants:
            sidecar = await start_sidecar(
                stack, workdir, f"ab-forward-{_slug(variant.name)}", upstream.url,
                event_loop=variant.loop, tree=variant.tree,
            )  # fmt: skip
            targets.append((variant.name, sidecar))
            pids[variant.name] = sidecar.pid
        load = await start_loadgen(stack, workdir, "ab-loadgen-forward")
        for _name, service in targets:  # warm every pool and code path once
            await load.call("forward", url=service.url, concurrency=CONCURRENCY, duration_s=0.5, warmup_s=0.2)
        for round_index in range(opts.rounds):
            _say(f"   forward round {round_index + 1}/{opts.rounds} (load {_load()})")
            for name, service in _rotated(targets, round_index):
                pid = pids.get(name)
                cpu_before = cpu_seconds(pid) if pid else 0.0
                many = await load.call(
                    "forward", url=service.url, concurrency=CONCURRENCY, duration_s=opts.forward_s,
                    warmup_s=opts.warmup_s,
                )  # fmt: skip
                if pid:
                    answered = many["rps"] * (opts.forward_s + opts.warmup_s)  # the window and its warm-up
                    samples.add(name, "cpu_us_per_request", (cpu_seconds(pid) - cpu_before) / answered * 1e6)
                one = await load.call(
                    "forward", url=service.url, concurrency=1, duration_s=opts.single_s, warmup_s=opts.warmup_s
                )
                samples.add(name, "rps", many["rps"])
                samples.add(name, "p50_ms", many["p50_ms"])
                samples.add(name, "p99_ms", many["p99_ms"])
                samples.add(name, "c1_p50_ms", one["p50_ms"])
                samples.add(name, "c1_p99_ms", one["p99_ms"])
                samples.add(name, "errors", many["errors"] + one["errors"])
                samples.values.setdefault(name, {}).setdefault("_round_rps", []).append(many["rps"])
                samples.values.setdefault(name, {}).setdefault("_round_c1_p50", []).append(one["p50_ms"])
    # Per-round ratios and differences (each round's targets ran back to back).
    names = [name for name, _ in targets]
    for name in names:
        rounds = samples.values[name]
        for base in ("nginx", "naive aiohttp proxy", "fastmcp (shared session)", "direct"):
            if base in samples.values and base != name:
                base_rps = samples.values[base]["_round_rps"]
                for mine, theirs in zip(rounds["_round_rps"], base_rps, strict=True):
                    samples.add(name, f"rps_vs_{base}", mine / theirs if theirs else None)
        direct = samples.values["direct"]["_round_c1_p50"]
        for mine, theirs in zip(rounds["_round_c1_p50"], direct, strict=True):
            samples.add(name, "c1_added_p50_ms", mine - theirs)
    if opts.variants:
        first = opts.variants[0].name
        for variant in opts.variants[1:]:
            for mine, theirs in zip(samples.values[variant.name]["_round_rps"], samples.values[first]["_round_rps"],
                                    strict=True):  # fmt: skip
                samples.add(variant.name, f"rps_vs_{first}", mine / theirs if theirs else None)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def forward_table(opts: Options, samples: Samples) -> str:
    lines = [
        "| target | req/s c=32 | vs nginx | vs naive | p50 / p99 c=32 (ms) | p50 c=1 (ms) | added p50 c=1 (ms) "
        "| CPU per request (us) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, measures in samples.values.items():
        if "rps" not in measures:
            continue

        def cell(measure: str, digits: int = 2, target: str = name) -> str:
            value = samples.median(target, measure)
            return "" if value is None else f"{value:,.{digits}f}"

        lines.append(
            f"| {name} | {cell('rps', 0)}{samples.spread(name, 'rps')} | {cell('rps_vs_nginx')} "
            f"| {cell('rps_vs_naive aiohttp proxy')} | {cell('p50_ms')} / {cell('p99_ms')} | {cell('c1_p50_ms')} "
            f"| {cell('c1_added_p50_ms')} | {cell('cpu_us_per_request', 0)} |"
        )
    if len(opts.variants) > 1:
        first = opts.variants[0].name
        for variant in opts.variants[1:]:
            ratio = samples.median(variant.name, f"rps_vs_{first}")
            if ratio is not None:
                lines.append(f"\n{variant.name} / {first} throughput (median of per-round ratios): {ratio:.3f}x")
    return "\n".join(lines)


# -- fan-out ------------------------------------------------------------------------------------------------


async def fanout(opts: Options, workdir: Path, samples: Samples) -> None:
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, workdir)
        load = await start_loadgen(stack, workdir, "ab-loadgen-fanout")
        for round_index in range(opts.rounds):
            for variant in _rotated(opts.variants, round_index):
                for n in opts.fanout:
                    _say(f"   fanout round {round_index + 1}/{opts.rounds}: {variant.name}, {n:,} streams "
                         f"(load {_load()})")  # fmt: skip
                    async with contextlib.AsyncExitStack() as inner:
                        sidecar = await start_sidecar(
                            inner, workdir, f"ab-fanout-{_slug(variant.name)}", upstream.url,
                            # Joining a watch costs a look at the upstream (a sync point), counted against the
                            # client's polling.max_baselines_per_s: 10,000 streams from one client need more.
                            {"streams": {"max_streams": 20_000}, "polling": {"max_baselines_per_s": 100_000}},
                            event_loop=variant.loop, tree=variant.tree,
                        )  # fmt: skip
                        last, spread, opened_per_s = await _fanout_once(load, sidecar, n, opts.changes)
                        samples.add(variant.name, f"fanout_{n}_last_ms", last)
                        samples.add(variant.name, f"fanout_{n}_spread_ms", spread)
                        samples.add(variant.name, f"fanout_{n}_opened_per_s", opened_per_s)


async def _fanout_once(load: LoadClient, sidecar: Sidecar, n: int, changes: int) -> tuple[float, float, float]:
    group = f"fanout-{n}"
    opened = await load.call("open", group=group, url=sidecar.url, uris=[_FANOUT_URI], count=n, concurrency=64)
    if opened["opened"] != n:
        raise RuntimeError(f"only {opened['opened']} of {n} listen streams opened: {opened['reasons']}")
    await asyncio.sleep(1.0)
    lasts: list[float] = []
    spreads: list[float] = []
    try:
        for _ in range(changes):
            await asyncio.sleep(0.6)  # past min_interval_ms since the previous poll of the key
            params = {"name": "bump", "arguments": {"uri": _FANOUT_URI}}
            trigger = tools_call_trigger(sidecar.url, params)
            answer = await load.call("change", group=group, trigger=trigger, timeout_s=30)
            if answer["missing"]:
                raise RuntimeError(f"{answer['missing']} of {n} streams were not notified")
            arrivals = answer["latencies"]
            lasts.append(arrivals[-1] * 1000)
            spreads.append((arrivals[-1] - arrivals[0]) * 1000)
    finally:
        await load.call("close", group=group)
    return max(lasts), statistics.median(spreads), n / opened["seconds"]


# -- tools/call to notification, 1,000 streams ------------------------------------------------------------


async def notify(opts: Options, workdir: Path, samples: Samples) -> None:
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_sdk_upstream(stack, workdir, read_ttl_ms=1000)
        load = await start_loadgen(stack, workdir, "ab-loadgen-notify")
        for round_index in range(opts.rounds):
            for variant in _rotated(opts.variants, round_index):
                _say(f"   notify round {round_index + 1}/{opts.rounds}: {variant.name} (load {_load()})")
                async with contextlib.AsyncExitStack() as inner:
                    sidecar = await start_sidecar(
                        inner, workdir, f"ab-notify-{_slug(variant.name)}", upstream.url,
                        {"streams": {"max_streams": 20_000}}, event_loop=variant.loop, tree=variant.tree,
                    )  # fmt: skip
                    await _notify_once(opts, load, sidecar, variant.name, samples, round_index)


async def _notify_once(
    opts: Options, load: LoadClient, sidecar: Sidecar, name: str, samples: Samples, round_index: int
) -> None:
    group, value = "notify", f"notify{round_index}"
    uri = f"bench://values/{value}"
    opened = await load.call("open", group=group, url=sidecar.url, uris=[uri], count=1000, concurrency=64)
    if opened["opened"] != 1000:
        raise RuntimeError(f"only {opened['opened']} of 1000 listen streams opened: {opened['reasons']}")
    await asyncio.sleep(1.5)
    latencies: list[float] = []
    answered: list[float] = []
    firsts: list[float] = []
    try:
        for index in range(opts.notify_changes):
            await asyncio.sleep(random.uniform(0.2, 1.0))  # a random phase of the poll schedule
            params = {"name": "set_value", "arguments": {"name": value, "value": round_index * 10_000 + index + 1}}
            trigger = tools_call_trigger(sidecar.url, params)
            answer = await load.call("change", group=group, trigger=trigger, timeout_s=10)
            if answer["missing"]:
                raise RuntimeError(f"{answer['missing']} of 1000 streams were not notified")
            latencies.extend(answer["latencies"])
            answered.append(answer["trigger_s"])
            firsts.append(answer["latencies"][0])
    finally:
        await load.call("close", group=group)
    latencies.sort()
    samples.add(name, "notify_p50_ms", latencies[len(latencies) // 2] * 1000)
    samples.add(name, "notify_p99_ms", latencies[int(len(latencies) * 0.99)] * 1000)
    samples.add(name, "notify_answer_ms", statistics.median(answered) * 1000)
    samples.add(name, "notify_first_ms", statistics.median(firsts) * 1000)


# -- memory and polls -------------------------------------------------------------------------------------


async def streams_and_polls(opts: Options, workdir: Path, samples: Samples) -> None:
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, workdir)
        load = await start_loadgen(stack, workdir, "ab-loadgen-watches")
        for round_index in range(opts.rounds):
            for variant in _rotated(opts.variants, round_index):
                _say(f"   memory/polls round {round_index + 1}/{opts.rounds}: {variant.name} (load {_load()})")
                async with contextlib.AsyncExitStack() as inner:
                    sidecar = await start_sidecar(
                        inner, workdir, f"ab-watches-{_slug(variant.name)}", upstream.url,
                        {
                            # Baselines faster than the default 200/s per client: 20 streams of 100 URIs at once.
                            "polling": {"default_interval_ms": 1000, "max_baselines_per_s": 5000},
                            "streams": {"max_streams": 20_000, "max_uris_per_stream": 1000},
                        },
                        event_loop=variant.loop, tree=variant.tree,
                    )  # fmt: skip
                    if "memory" in opts.parts:
                        samples.add(variant.name, "rss_per_stream_kib", await _rss_per_stream(opts, load, sidecar))
                    if "polls" in opts.parts:
                        cpu, lag50, lag99, rate = await _polls(opts, load, sidecar)
                        samples.add(variant.name, "cpu_us_per_poll", cpu)
                        samples.add(variant.name, "lag_p50_ms", lag50)
                        samples.add(variant.name, "lag_p99_ms", lag99)
                        samples.add(variant.name, "polls_per_s", rate)


async def _rss_per_stream(opts: Options, load: LoadClient, sidecar: Sidecar) -> float:
    ten = [f"bench://items/mem{i}" for i in range(10)]
    await load.call("open", group="warm", url=sidecar.url, uris=ten, count=1)
    await asyncio.sleep(1.5)
    before = rss_bytes(sidecar.pid)
    n = opts.idle_streams
    opened = await load.call("open", group="idle", url=sidecar.url, uris=ten, count=n, concurrency=32)
    if opened["opened"] != n:
        raise RuntimeError(f"only {opened['opened']} of {n} streams opened: {opened['reasons']}")
    await asyncio.sleep(2.0)
    per_stream = (rss_bytes(sidecar.pid) - before) / n / 1024
    await load.call("close", group="idle")
    await load.call("close", group="warm")
    return per_stream


async def _polls(
    opts: Options, load: LoadClient, sidecar: Sidecar
) -> tuple[float | None, float | None, float | None, float]:
    uris = [f"bench://items/w{i}" for i in range(opts.watch_uris)]
    per = 100
    for index in range(len(uris) // per):
        answer = await load.call(
            "open", group="watch", url=sidecar.url, uris=uris[index * per : (index + 1) * per], count=1
        )
        if answer["opened"] != 1:
            raise RuntimeError(f"a 100-URI listen stream did not open: {answer['reasons']}")
    await asyncio.sleep(2.5)
    before = await scrape(sidecar.admin_url)
    cpu_before = cpu_seconds(sidecar.pid)
    started = time.monotonic()
    await asyncio.sleep(opts.cpu_window_s)
    cpu_after = cpu_seconds(sidecar.pid)
    elapsed = time.monotonic() - started
    after = await scrape(sidecar.admin_url)
    await load.call("close", group="watch")
    polls = after.value("mcp_sidecar_polls_total", kind="resource") - before.value(
        "mcp_sidecar_polls_total", kind="resource"
    )
    lag = "mcp_sidecar_poll_schedule_lag_seconds"
    lag50 = histogram_quantile(0.50, before.buckets(lag), after.buckets(lag))
    lag99 = histogram_quantile(0.99, before.buckets(lag), after.buckets(lag))
    cpu = (cpu_after - cpu_before) / polls * 1e6 if polls else None
    return (
        cpu,
        None if lag50 is None else lag50 * 1000,
        None if lag99 is None else lag99 * 1000,
        polls / elapsed,
    )


# -- the summary ------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def issue_table(opts: Options, samples: Samples) -> str:
    """Issue 17's eight figures, one column per sidecar variant."""
    names = [v.name for v in opts.variants]
    biggest = max(opts.fanout) if opts.fanout else 10_000
    rows: list[tuple[str, Callable[[str], str]]] = [
        ("forward throughput vs nginx hop, c=32", lambda n: _fmt(samples.median(n, "rps_vs_nginx"), unit="x")),
        (
            "forward throughput vs FastMCP proxy",
            lambda n: _fmt(samples.median(n, "rps_vs_fastmcp (shared session)"), 1, "x"),
        ),
        ("added p50 latency over direct, c=1", lambda n: _fmt(samples.median(n, "c1_added_p50_ms"), unit=" ms")),
        ("sidecar p99 at c=32", lambda n: _fmt(samples.median(n, "p99_ms"), 1, " ms")),
        ("RSS per idle listen stream (10 URIs)", lambda n: _fmt(samples.median(n, "rss_per_stream_kib"), 1, " KiB")),
        (
            f"fan-out: tools/call to last of {biggest:,} streams",
            lambda n: _fmt(samples.median(n, f"fanout_{biggest}_last_ms"), 0, " ms"),
        ),
        ("CPU per poll at 2,000 watches/s", lambda n: _fmt(samples.median(n, "cpu_us_per_poll"), 0, " us")),
        ("poll schedule lag p99 at 2,000 watches/s", lambda n: _fmt(samples.median(n, "lag_p99_ms"), 1, " ms")),
        ("tools/call to notification p50, 1,000 streams", lambda n: _fmt(samples.median(n, "notify_p50_ms"), 1, " ms")),
    ]
    lines = ["| figure | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [f"| {label} | " + " | ".join(get(n) for n in names) + " |" for label, get in rows]

    def median_of(measure: str, digits: int) -> Callable[[str], str]:
        return lambda name: _fmt(samples.median(name, measure), digits, " ms")

    extra: list[tuple[str, Callable[[str], str]]] = []
    for n in opts.fanout:
        extra.append(
            (f"fan-out first to last, {n:,} streams (median of changes)", median_of(f"fanout_{n}_spread_ms", 0))
        )
        extra.append(
            (f"fan-out tools/call to last, {n:,} streams (worst of changes)", median_of(f"fanout_{n}_last_ms", 0))
        )
    extra += [
        ("... p99, 1,000 streams", lambda n: _fmt(samples.median(n, "notify_p99_ms"), 1, " ms")),
        ("... the tools/call's answer (median)", lambda n: _fmt(samples.median(n, "notify_answer_ms"), 1, " ms")),
        (
            "... the first stream's notification (median)",
            lambda n: _fmt(samples.median(n, "notify_first_ms"), 1, " ms"),
        ),
        ("forward req/s c=32", lambda n: _fmt(samples.median(n, "rps"), 0)),
        ("forward vs naive aiohttp proxy", lambda n: _fmt(samples.median(n, "rps_vs_naive aiohttp proxy"), unit="x")),
        ("CPU per forwarded request (c=32)", lambda n: _fmt(samples.median(n, "cpu_us_per_request"), 0, " us")),
        ("poll schedule lag p50", lambda n: _fmt(samples.median(n, "lag_p50_ms"), 2, " ms")),
        ("polls per second", lambda n: _fmt(samples.median(n, "polls_per_s"), 0)),
    ]
    lines += [f"| {label} | " + " | ".join(get(n) for n in names) + " |" for label, get in extra]
    return "\n".join(lines)


# -- entry point --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout to run the sidecar from, on --loops or the loops after @ (repeatable; default: this "
        "one, as `sidecar`)",
    )
    parser.add_argument("--loops", default="asyncio,uvloop", help="event loops for each tree (asyncio, uvloop)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forward-s", type=float, default=5.0, help="seconds per target at c=32 per round")
    parser.add_argument("--single-s", type=float, default=2.0, help="seconds per target at c=1 per round")
    parser.add_argument("--fanout", default="2000,10000", help="stream counts for the fan-out part")
    parser.add_argument("--changes", type=int, default=3, help="changes per fan-out measurement")
    parser.add_argument("--notify-changes", type=int, default=10, help="changes per round of the notify part")
    parser.add_argument("--idle-streams", type=int, default=2000)
    parser.add_argument("--watch-uris", type=int, default=2000)
    parser.add_argument("--cpu-window-s", type=float, default=15.0)
    parser.add_argument("--no-naive", action="store_true", help="leave out the naive aiohttp proxy")
    parser.add_argument("--no-nginx", action="store_true", help="leave out nginx")
    parser.add_argument("--peer", action="store_true", help="also FastMCP's proxy with a shared session (slow)")
    return parser  # fmt: skip


def _options(args: argparse.Namespace) -> Options:
    loops = [loop.strip() for loop in args.loops.split(",") if loop.strip()]
    if "uvloop" in loops and (missing := uvloop_missing()) is not None:
        _say(f"uvloop left out: {missing}")
        loops.remove("uvloop")
    variants: list[Variant] = []
    for spec in args.tree or [f"sidecar={REPO_ROOT}"]:
        name, sep, rest = spec.partition("=")
        path, _, own_loops = rest.partition("@")
        if not sep or not (Path(path) / "sidecar" / "cli.py").exists():
            raise SystemExit(f"--tree {spec}: want NAME=PATH[@LOOP+LOOP], PATH a checkout with sidecar/cli.py")
        for loop in own_loops.split("+") if own_loops else loops:
            variants.append(Variant(name, Path(path).resolve(), loop))
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if unknown := [part for part in parts if part not in PARTS]:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    return Options(
        variants=variants,
        rounds=args.rounds,
        parts=parts,
        forward_s=args.forward_s,
        single_s=args.single_s,
        warmup_s=0.5,
        fanout=[int(n) for n in args.fanout.split(",") if n.strip()],
        changes=args.changes,
        notify_changes=args.notify_changes,
        idle_streams=args.idle_streams,
        watch_uris=args.watch_uris,
        cpu_window_s=args.cpu_window_s,
        naive=not args.no_naive,
        nginx=not args.no_nginx,
        peer=args.peer,
    )


async def _run(opts: Options, workdir: Path) -> Samples:
    samples = Samples()
    steps: list[tuple[str, Callable[[Options, Path, Samples], Awaitable[None]]]] = []
    if "forward" in opts.parts:
        steps.append(("forward", forward))
    if "fanout" in opts.parts:
        steps.append(("fanout", fanout))
    if "memory" in opts.parts or "polls" in opts.parts:
        steps.append(("memory/polls", streams_and_polls))
    if "notify" in opts.parts:
        steps.append(("notify", notify))
    for name, step in steps:
        started = time.monotonic()
        _say(f"== {name} (load {_load()})")
        await step(opts, workdir, samples)
        _say(f"== {name} done in {time.monotonic() - started:.0f} s (load {_load()})")
    return samples


def main(argv: list[str] | None = None) -> int:
    opts = _options(_parser().parse_args(argv))
    raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="mcp-sidecar-ab-"))
    load_start = _load()
    started = time.monotonic()
    try:
        samples = asyncio.run(_run(opts, workdir))
    finally:
        kill_leftovers()
    print(f"\nbench.ab: {opts.rounds} round(s), {time.monotonic() - started:.0f} s, {os.cpu_count()} cores, "
          f"load average at start {load_start}, at the end {_load()}; logs in {workdir}\n")  # fmt: skip
    for variant in opts.variants:
        print(f"- {variant.name}: {variant.tree} on {variant.loop}")
    if "forward" in opts.parts:
        print("\n" + forward_table(opts, samples))
    print("\n" + issue_table(opts, samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
