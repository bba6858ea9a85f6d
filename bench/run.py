"""`python -m bench`: run the scenarios in order, print the table; the full run also writes RESULTS.md and plots."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench.common import raise_fd_limit
from bench.report import Results, machine_info, write_plots, write_results
from bench.scenarios import SCENARIOS, Context
from bench.services import CONFIGS, kill_leftovers

__all__ = ["main"]

BENCH_DIR = Path(__file__).resolve().parent


MISSED_TARGETS = (
    "Why the targets this machine misses are missed, as measured (bench/PROFILE.md has the profiles and the "
    "interleaved runs): **added p50 at c=1**: of the sidecar's CPU per request at c=1, the two loopback `send()`s and "
    "the event loop's four wake-ups alone are about 0.3 ms on this machine, and the naive aiohttp proxy adds more than "
    "the sidecar in the same run; no Python hop reaches 0.4 ms here. **RSS per idle stream**: about 9.4 KB of each "
    "stream's heap is aiohttp's request machinery (the request, its protocol's state, the prepared response), the "
    "stream's own state about 2 KB (what invariant 11 allows); 12 KiB needs a listen path outside aiohttp, which has "
    "no way to hand a connection over, so it was not built. **tools/call to notification at 1,000 streams**: the write "
    "(3-4 ms), the 10 ms debounce, the poll (3 ms) and the fan-out pass (10-14 us a stream) leave the p50 near 30 ms "
    "only on a quiet machine; lowering the debounce buys it with extra upstream reads for writes close together. "
    "**Python peer ratio** and **--workers 2**: the load generator, the upstream and the proxy share two cores."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark mcp-sidecar against baselines measured in the same run (everything on 127.0.0.1).",
    )
    parser.add_argument("--quick", action="store_true", help="a ~1-minute smoke run; writes no files")
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated scenarios to run, in order (default: all: {','.join(SCENARIOS)})",
    )
    parser.add_argument("--out", type=Path, default=BENCH_DIR, help="where the full run writes RESULTS.md and PNGs")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory with every process's log")
    return parser


async def _run(names: Sequence[str], ctx: Context) -> list[str]:
    """Run the scenarios; returns the names of those that failed (each failure also becomes a note)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    failed: list[str] = []
    for name in names:
        started = time.monotonic()
        print(f"== {name} ...", file=sys.stderr, flush=True)
        try:
            await SCENARIOS[name](ctx)
        except Exception as exc:  # one broken scenario is reported; the others still run
            failed.append(name)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            ctx.results.note(f"scenario `{name}` FAILED: {first}")
            traceback.print_exc(file=sys.stderr)
        print(f"== {name} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    limit = raise_fd_limit()
    if limit < 12_000:
        print(f"warning: RLIMIT_NOFILE is {limit}; 10,000 streams need more", file=sys.stderr)
    info = machine_info()
    workdir = Path(tempfile.mkdtemp(prefix="mcp-sidecar-bench-"))
    results = Results()
    ctx = Context(workdir=workdir, quick=args.quick, results=results)
    started = time.monotonic()
    failed: list[str] = []
    interrupted = False
    try:
        failed = asyncio.run(_run(names, ctx))
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
    finally:
        kill_leftovers()
    duration = time.monotonic() - started

    results.configs = dict(CONFIGS)
    results.note(MISSED_TARGETS)
    results.note(
        f"Load average (1/5/15 min) at start {info['load average at start']}, at the end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + f" on {info['nproc']} cores: anything else running on the machine distorts every figure above."
    )
    mode = "quick" if args.quick else "full"
    print(
        f"\nmcp-sidecar bench ({mode} run, {duration:.0f} s; {info['nproc']} x {info['CPU']}, Python {info['Python']}, "
        f"aiohttp {info['aiohttp']}, load average at start {info['load average at start']})\n"
    )
    print(results.text_table())
    if results.notes:
        print("\nnotes:")
        for text in results.notes:
            print(f"- {text}")
    if not args.quick and not interrupted:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python -m bench" + ("" if len(names) == len(SCENARIOS) else f" --only {','.join(names)}")
        plots = write_plots(args.out, results)
        write_results(args.out / "RESULTS.md", results, info, duration, command, plots)
        print(f"\nwrote {args.out / 'RESULTS.md'}" + "".join(f", {p}" for p in plots))
    if args.keep_logs or failed or interrupted:
        print(f"\nlogs: {workdir}", file=sys.stderr)
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    if interrupted:
        return 130
    return 1 if failed else 0
