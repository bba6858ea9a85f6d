"""`python -m bench.newcomer`: a polite client's reads beside a greedy client's flood, by where the polite one
comes from.

    python -m bench.newcomer                        # this checkout
    python -m bench.newcomer --tree /src/before     # another checkout's `sidecar` package, same load

The fast upstream answers every read in 200 ms; the sidecar runs its defaults (100 requests upstream at once,
75 for one client). A polite client reads one URI at a time: alone first, then beside a greedy anonymous client
holding 1,024 connections from 127.0.0.1 (the bench's load generator, `--seconds` long), in two cases: from
another address, anonymous; and from the greedy client's address with a token the upstream has never seen
(its first read included). Printed for each: p99 and the slowest read, the first read, and failed reads. The
greedy client's requests are always waiting when the polite client starts (the queue holds 100 or more).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import REPO_ROOT, mcp_body, mcp_headers, percentile, scrape
from bench.services import Sidecar, start_fast_upstream, start_loadgen, start_sidecar

READ_DELAY_MS = 200.0
GREEDY_CONNECTIONS = 1024


@dataclass
class Polite:
    """One polite client's reads: latencies in seconds, and how many failed."""

    case: str
    latencies: list[float]
    failed: int

    def line(self) -> str:
        ms = [value * 1000 for value in self.latencies]
        return (
            f"{self.case:<42} reads {len(ms):>3}  p99 {percentile(ms, 0.99):>6.0f} ms  slowest {max(ms):>6.0f} ms  "
            f"first {ms[0]:>6.0f} ms  failed {self.failed}"
        )


async def _polite_reads(
    url: str, case: str, address: str, token: str | None, until: asyncio.Event, at_least: int = 3
) -> Polite:
    latencies: list[float] = []
    failed = 0
    extra = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        n = 0
        while not until.is_set() or len(latencies) < at_least:
            n += 1
            params = {"uri": f"polite://{case}/{n}"}
            began = time.perf_counter()
            sent = {**mcp_headers("resources/read", params), **extra}
            async with http.post(url, json=mcp_body("resources/read", params, n), headers=sent) as resp:
                body = await resp.json(content_type=None)
            latencies.append(time.perf_counter() - began)
            failed += resp.status != 200 or "result" not in body
    return Polite(case, latencies, failed)


async def _queued(sidecar: Sidecar, at_least: float = 100) -> None:
    deadline = time.monotonic() + 30
    while (await scrape(sidecar.admin_url)).value("mcp_sidecar_queue_depth", limit="upstream_requests") < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError("the greedy client's requests never queued")
        await asyncio.sleep(0.05)


async def run(tree: Path, seconds: float, workdir: Path) -> list[Polite]:
    results: list[Polite] = []
    async with contextlib.AsyncExitStack() as stack:
        upstream = await start_fast_upstream(stack, workdir, read_delay_ms=READ_DELAY_MS)
        sidecar = await start_sidecar(stack, workdir, "sidecar-newcomer", upstream.url, tree=tree)
        load = await start_loadgen(stack, workdir, "loadgen-newcomer")
        done = asyncio.Event()
        done.set()
        results.append(await _polite_reads(sidecar.url, "alone, own token", "127.0.0.1", "alone", done, 20))
        cases: list[tuple[str, str, str | None]] = [
            ("beside the flood, another address", "127.0.0.2", None),
            ("beside the flood, same address, new token", "127.0.0.1", "newcomer"),
        ]
        for case, address, token in cases:
            flood_over = asyncio.Event()
            greedy = asyncio.ensure_future(
                load.call(
                    "forward",
                    url=sidecar.url,
                    concurrency=GREEDY_CONNECTIONS,
                    duration_s=seconds,
                    warmup_s=0.5,
                    uri_prefix=f"greedy://{address}/",
                )
            )
            await _queued(sidecar)
            polite = asyncio.ensure_future(_polite_reads(sidecar.url, case, address, token, flood_over))
            flood = await greedy
            flood_over.set()
            results.append(await polite)
            print(f"  greedy client: {flood}", file=sys.stderr)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.newcomer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="the checkout whose sidecar runs")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long the greedy client floods, each case")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-newcomer-") as workdir:
        results = asyncio.run(run(args.tree.resolve(), args.seconds, Path(workdir)))
    for result in results:
        print(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
