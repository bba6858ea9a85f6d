"""`python -m bench.profile`: where the sidecar's CPU and memory go, under the bench's own load.

    pip install py-spy                                  # the sampling profiler (attaches to the sidecar's pid)
    python -m bench.profile forward                     # py-spy while forwarding at c=32, then c=1
    python -m bench.profile polls                       # py-spy with 2,000 watched URIs at 1 s
    python -m bench.profile streams                     # tracemalloc of idle listen streams (10 URIs each)
    python -m bench.profile floor                       # the same, served by a bare aiohttp handler instead
    python -m bench.profile summary FILE                # summarise a py-spy raw file again

py-spy samples the sidecar from outside (`record --nonblocking --format raw`), so the process runs at full
speed; each sample's innermost frame is its self time, and each sample is also charged to one category: the
innermost frame that belongs to a known owner (the aiohttp server, the aiohttp client, the sidecar's
envelope checks, read-through, metrics, ..., or the kernel: a sample inside asyncio's `sock.send` is the
kernel's TCP work, which on loopback includes delivering the bytes to the peer). `streams` runs the sidecar
in this process with tracemalloc on and charges each allocation still alive to its innermost sidecar frame
(or aiohttp's, or aiohttp-sse's). `floor` measures the same streams served by a bare aiohttp handler that
reads the listen, writes an ack and holds the response open: aiohttp's own price for an open request, the
floor a listen stream's memory is compared with. Raw files and summaries go to --out (default: a temporary
directory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
from aiohttp import web

from bench.common import REPO_ROOT, cpu_seconds, histogram_quantile, scrape
from bench.services import kill_leftovers, start_fast_upstream, start_loadgen, start_sidecar

__all__ = ["main", "summarise"]

_AMBIGUOUS = (
    "aiohttp/http_writer.py", "aiohttp/streams.py", "aiohttp/helpers.py", "aiohttp/base_protocol.py",
    "aiohttp/payload.py", "aiohttp/tcp_helpers.py", "asyncio/events.py", "asyncio/timeouts.py", "asyncio/locks.py",
    "asyncio/tasks.py", "asyncio/futures.py", "contextlib.py", "typing.py", "dataclasses.py", "enum.py", "abc.py",
    "<string>",
)  # fmt: skip
"""Shared by several owners (both HTTP directions write through http_writer): the sample goes to a caller."""

_CATEGORIES: list[tuple[str, Callable[[str], bool]]] = [
    ("kernel: socket send/recv", lambda f: "asyncio/selector_events.py" in f),
    ("event loop: epoll, timers, callbacks", lambda f: "selectors.py" in f or "asyncio/base_events.py" in f),
    ("metrics (prometheus_client)", lambda f: "prometheus_client" in f or "observability/metrics.py" in f),
    ("read-through (key, cache, single-flight)", lambda f: "readthrough.py" in f or "cachetools" in f),
    ("identity", lambda f: "sidecar/identity.py" in f),
    (
        "envelope: parse, validate, guards",
        lambda f: any(s in f for s in ("protocol/envelope.py", "downstream/guards.py", "urllib/parse.py", "ipaddress")),
    ),
    ("watch engine (poller, registry, observe)", lambda f: "sidecar/watch/" in f),
    (
        "SSE and listen streams",
        lambda f: any(
            s in f for s in ("aiohttp_sse", "upstream/sse.py", "upstream/http/relay.py", "downstream/listen.py")
        ),
    ),
    ("aiohttp client", lambda f: re.search(r"aiohttp/(client|connector|tracing|resolver)", f) is not None),
    ("sidecar upstream glue (http/client.py, http/endpoint.py)", lambda f: "sidecar/upstream/" in f),
    ("aiohttp server: response", lambda f: "aiohttp/web_response.py" in f),
    ("sidecar handler glue (handler.py)", lambda f: "sidecar/downstream/handler.py" in f),
    ("aiohttp server: parse, request, dispatch", lambda f: re.search(r"aiohttp/(web_|http_parser|abc)", f) is not None),
    ("logging", lambda f: "logging/" in f),
]


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(count)


def _function(frame: str) -> str:
    return re.sub(r":\d+\)$", ")", frame)


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        if any(shared in frame for shared in _AMBIGUOUS):
            continue
        for name, owns in _CATEGORIES:
            if owns(frame):
                return name
        if "sidecar/" in frame:
            return f"other sidecar: {_function(frame)}"
    return "other"


def summarise(path: Path, us_per_unit: float | None = None, top: int = 25) -> str:
    """Top self time by function and by line, and the categories, as shares of the samples outside epoll_wait;
    with `us_per_unit` (CPU per request or poll), each share is also given in microseconds."""
    total = 0
    waiting = 0
    by_function: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    for frames, count in _stacks(path):
        if frames[-1].startswith("EpollSelector.select ("):
            # py-spy cannot always tell a thread blocked in epoll_wait from a running one; a loop that is not
            # saturated spends most of its wall time there, none of it CPU. Counted apart, out of the shares.
            waiting += count
            continue
        total += count
        by_function[_function(frames[-1])] += count
        by_line[frames[-1]] += count
        categories[_category(frames)] += count

    def row(count: int, label: str) -> str:
        us = f" {count / total * us_per_unit:6.1f} us" if us_per_unit else ""
        return f"{count / total:6.1%}{us}  {label}"

    lines = [
        f"{path.name}: {total} samples (and {waiting} in epoll_wait, left out of the shares)",
        "",
        "categories (innermost owner):",
    ]
    lines += [row(n, label) for label, n in categories.most_common()]
    lines += ["", "self time by function:"] + [row(n, label) for label, n in by_function.most_common(top)]
    lines += ["", "self time by line:"] + [row(n, label) for label, n in by_line.most_common(top)]
    return "\n".join(lines)


async def _record(pid: int, out: Path, seconds: float) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "py-spy", "record", "--pid", str(pid), "--rate", "250", "--nonblocking", "--format", "raw",
        "-o", str(out), "--duration", str(int(seconds)),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def profile_forward(out: Path, seconds: float, event_loop: str, tree: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="profile-forward-"))
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, work)
        sidecar = await start_sidecar(stack, work, "sidecar-forward", upstream.url, event_loop=event_loop, tree=tree)
        load = await start_loadgen(stack, work, "loadgen-profile")
        await load.call("forward", url=sidecar.url, concurrency=32, duration_s=1, warmup_s=0.5)
        for concurrency in (32, 1):
            raw = out / f"forward-c{concurrency}.txt"
            spy = await _record(sidecar.pid, raw, seconds)
            await asyncio.sleep(0.5)
            cpu = cpu_seconds(sidecar.pid)
            stats = await load.call(
                "forward", url=sidecar.url, concurrency=concurrency, duration_s=seconds - 2, warmup_s=0.2
            )
            used = cpu_seconds(sidecar.pid) - cpu
            await spy.wait()
            answered = stats["rps"] * (seconds - 2 + 0.2)
            per_request = used / answered * 1e6
            head = (
                f"forward c={concurrency}: {stats['rps']:,.0f} req/s, p50 {stats['p50_ms']:.2f} ms, "
                f"p99 {stats['p99_ms']:.2f} ms, sidecar CPU {per_request:.0f} us per request "
                f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
            )
            _write(out / f"forward-c{concurrency}.summary.txt", head + "\n\n" + summarise(raw, per_request))


async def profile_polls(out: Path, seconds: float, event_loop: str, tree: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="profile-polls-"))
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, work)
        sections = {
            "polling": {"default_interval_ms": 1000, "max_baselines_per_s": 5000},
            "streams": {"max_streams": 20_000, "max_uris_per_stream": 1000},
        }
        sidecar = await start_sidecar(
            stack, work, "sidecar-watches", upstream.url, sections, event_loop=event_loop, tree=tree
        )
        load = await start_loadgen(stack, work, "loadgen-profile")
        uris = [f"bench://items/w{i}" for i in range(2000)]
        for index in range(20):
            await load.call("open", group="watch", url=sidecar.url, uris=uris[index * 100 : (index + 1) * 100], count=1)
        await asyncio.sleep(3)
        raw = out / "polls.txt"
        spy = await _record(sidecar.pid, raw, seconds)
        before, cpu, started = await scrape(sidecar.admin_url), cpu_seconds(sidecar.pid), time.monotonic()
        await spy.wait()
        used, elapsed, after = (
            cpu_seconds(sidecar.pid) - cpu,
            time.monotonic() - started,
            await scrape(sidecar.admin_url),
        )
        polls = after.value("mcp_sidecar_polls_total") - before.value("mcp_sidecar_polls_total")
        lag = "mcp_sidecar_poll_schedule_lag_seconds"
        p99 = histogram_quantile(0.99, before.buckets(lag), after.buckets(lag)) or 0.0
        per_poll = used / polls * 1e6 if polls else 0.0
        head = (
            f"polls: {polls / elapsed:,.0f} polls/s, sidecar CPU {per_poll:.0f} us per poll, schedule lag p99 "
            f"{p99 * 1000:.1f} ms (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
        )
        _write(out / "polls.summary.txt", head + "\n\n" + summarise(raw, per_poll))


async def profile_streams(out: Path, count: int, *, floor: bool = False) -> None:
    """The sidecar in this process (its own `serve`), or with `floor` a bare aiohttp handler, streams opened by
    the load generator, tracemalloc between."""
    from sidecar.commands.serve import serve
    from sidecar.config import load_config
    from tests.procs import free_port

    work = Path(tempfile.mkdtemp(prefix="profile-streams-"))
    async with contextlib.AsyncExitStack() as stack:
        port = free_port()
        if floor:
            runner = await _bare_listen_server(port)
            stack.push_async_callback(runner.cleanup)
        else:
            upstream = await start_fast_upstream(stack, work)
            config = load_config(
                None,
                overrides={
                    "upstream": {"url": upstream.url},
                    "listen": {"host": "127.0.0.1", "port": port},
                    "admin": {"host": "127.0.0.1", "port": free_port()},
                    "streams": {"max_streams": 20_000},
                    "logging": {"level": "warning"},
                },
            )
            ready = asyncio.Event()
            server = asyncio.get_running_loop().create_task(serve(config, ready))
            stack.push_async_callback(_cancel, server)
            await ready.wait()
        url = f"http://127.0.0.1:{port}/mcp"
        load = await start_loadgen(stack, work, "loadgen-profile")
        ten = [f"bench://items/mem{i}" for i in range(10)]
        await load.call("open", group="warm", url=url, uris=ten, count=50)
        await asyncio.sleep(1.0)
        gc.collect()
        tracemalloc.start(40)
        before = tracemalloc.take_snapshot()
        opened = await load.call("open", group="idle", url=url, uris=ten, count=count, concurrency=32)
        if opened["opened"] != count:
            raise RuntimeError(f"only {opened['opened']} of {count} streams opened: {opened['reasons']}")
        await asyncio.sleep(2.0)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        owners: Counter[str] = Counter()
        total = 0
        for stat in after.compare_to(before, "traceback"):
            frames = list(stat.traceback)  # oldest first
            total += stat.size_diff
            owner = next((f for f in reversed(frames) if "sidecar/" in f.filename), None) or next(
                (f for f in reversed(frames) if "aiohttp" in f.filename), frames[-1]
            )
            owners[f"{_short(owner.filename)}:{owner.lineno}"] += stat.size_diff
        served = "a bare aiohttp handler" if floor else "the sidecar"
        lines = [f"idle listen streams (10 URIs), {served}: {count:,}; Python heap per stream {total / count:,.0f} B"]
        lines += ["", *(f"{size / count:8,.0f} B  {where}" for where, size in owners.most_common(30))]
        _write(out / f"{'floor' if floor else 'streams'}.summary.txt", "\n".join(lines))
        await load.call("close", group="idle")
        await load.call("close", group="warm")


async def _cancel(task: asyncio.Task[int]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _bare_listen_server(port: int) -> web.AppRunner:
    """The floor: read the listen, write its ack (every URI honoured) as one SSE event, hold the response open."""

    async def listen(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        uris = message["params"]["notifications"]["resourceSubscriptions"]
        meta = {"io.modelcontextprotocol/subscriptionId": message["id"]}
        ack = {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": {"resourceSubscriptions": uris}, "_meta": meta},
        }
        del message, uris
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(ack) + b"\r\n\r\n")
        await asyncio.Event().wait()  # held until the client goes (aiohttp cancels the handler)
        return response

    app = web.Application()
    app.router.add_post("/mcp", listen)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def _short(filename: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "sidecar/"):
        if marker in filename:
            return (marker if marker == "sidecar/" else "") + filename.split(marker, 1)[1]
    return filename


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n", encoding="utf-8")
    print(f"\n== {path}\n{text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("forward", "polls", "streams", "floor", "summary"))
    parser.add_argument("file", nargs="?", type=Path, help="summary: a py-spy raw file")
    parser.add_argument("--out", type=Path, default=None, help="where raw files and summaries go")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of sampling per measurement")
    parser.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop"), help="the sidecar's event loop")
    parser.add_argument("--streams", type=int, default=2000, help="streams: idle streams to open")
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="forward, polls: the checkout whose sidecar runs")
    args = parser.parse_args(argv)
    if args.part == "summary":
        if args.file is None:
            parser.error("summary needs a py-spy raw file")
        print(summarise(args.file))
        return 0
    if args.part not in ("streams", "floor") and shutil.which("py-spy") is None:
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="mcp-sidecar-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        if args.part == "forward":
            asyncio.run(profile_forward(out, args.seconds, args.loop, args.tree))
        elif args.part == "polls":
            asyncio.run(profile_polls(out, args.seconds, args.loop, args.tree))
        else:
            asyncio.run(profile_streams(out, args.streams, floor=args.part == "floor"))
    finally:
        kill_leftovers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
