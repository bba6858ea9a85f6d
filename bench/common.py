"""Shared pieces of the bench: /proc readings, /metrics parsing, statistics, MCP framing.

Starting and stopping the processes it measures is `tests.procs`, shared with the tests.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sidecar.serving import stop_signals

__all__ = [
    "MODERN",
    "REPO_ROOT",
    "Samples",
    "children",
    "cpu_seconds",
    "histogram_quantile",
    "mcp_body",
    "mcp_headers",
    "percentile",
    "python_argv",
    "raise_fd_limit",
    "rss_bytes",
    "scrape",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
MODERN = "2026-07-28"
META: dict[str, Any] = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}
_NAMED = {"resources/read": "uri", "tools/call": "name", "prompts/get": "name"}
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE to the hard limit (children inherit it); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def mcp_headers(method: str, params: dict[str, Any] | None = None) -> dict[str, str]:
    """The headers of a 2026-07-28 request (Mcp-Name mirrors the named parameter)."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    named = _NAMED.get(method)
    if named is not None:
        headers["Mcp-Name"] = str((params or {}).get(named, ""))
    return headers


def mcp_body(method: str, params: dict[str, Any] | None = None, request_id: int | str = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": META}}


def tools_call_trigger(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """What the load generator's `change` sends through the sidecar at `url`: one `tools/call` with `params`."""
    return {"url": url, "body": mcp_body("tools/call", params), "headers": mcp_headers("tools/call", params)}


# -- processes --------------------------------------------------------------------------------------------


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# -- /proc ------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds (/proc/<pid>/stat fields 14 and 15)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def children(pid: int) -> list[int]:
    """The direct child processes of `pid` (from each process's parent id in /proc/<pid>/stat)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# -- /metrics -----------------------------------------------------------------------------------------------


class Samples:
    """One /metrics scrape: (name, labels, value) triples."""

    def __init__(self, text: str) -> None:
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text) for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels`."""
        return sum(v for n, have, v in self.samples if n == name and all(have.get(k) == x for k, x in labels.items()))

    def buckets(self, name: str) -> dict[float, float]:
        """Cumulative histogram buckets `{le: count}` of `name` (without the `_bucket` suffix)."""
        out: dict[float, float] = {}
        for n, labels, v in self.samples:
            if n == f"{name}_bucket":
                le = float(labels["le"])
                out[le] = out.get(le, 0.0) + v
        return out


async def scrape(base_url: str, path: str = "/metrics") -> Samples:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(base_url + path) as resp,
    ):
        resp.raise_for_status()
        return Samples(await resp.text())


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """Prometheus-style quantile (linear within a bucket) of the observations between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # above the last finite bucket: report its bound, as Prometheus does
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


# -- statistics -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


async def serve_until_signalled(app: web.Application, port: int) -> None:
    """Serve `app` on 127.0.0.1:`port` (a deep accept backlog: the load generator connects in bursts) until
    SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    try:
        with stop_signals() as stop:
            await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
