"""wrk (the C load generator, Debian's `wrk`) sending distinct `resources/read`s, no two identical in flight and
without any identifying header: many anonymous clients from one address, at a cost to the machine far below the
Python load generator's (which, at 512 connections, slows nginx down as much as the proxy it measures).

    stats = await wrk_reads("http://127.0.0.1:8080/mcp", connections=512, duration_s=3)
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WrkStats", "wrk_missing", "wrk_reads"]

_SCRIPT = Path(__file__).with_name("wrk_reads.lua")
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


@dataclass(frozen=True)
class WrkStats:
    requests: int
    rps: float
    failed: int
    """Answers other than 2xx, and connect, read, write and timeout errors."""
    p50_ms: float
    p99_ms: float

    @property
    def failed_share(self) -> float:
        return self.failed / max(1, self.requests)


def wrk_missing() -> str | None:
    return None if shutil.which("wrk") else "wrk is not installed (apt-get install wrk)"


async def wrk_reads(
    url: str, *, connections: int, duration_s: float, prefix: str = "bench://wrk/", timeout_s: float = 30.0
) -> WrkStats:
    """`connections` keep-alive connections reading as fast as they are answered, for `duration_s`."""
    binary = shutil.which("wrk")
    if binary is None:
        raise RuntimeError(wrk_missing())
    argv = [binary, "-t1", f"-c{connections}", f"-d{duration_s:g}s", f"--timeout={timeout_s:g}s", "--latency"]
    proc = await asyncio.create_subprocess_exec(
        *argv, "-s", str(_SCRIPT), url,
        env={**os.environ, "WRK_URI_PREFIX": prefix},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}:\n{text}")
    return _parse(text)


def _parse(text: str) -> WrkStats:
    requests = re.search(r"^\s*(\d+) requests in", text, re.M)
    rps = re.search(r"^Requests/sec:\s*([\d.]+)", text, re.M)
    if requests is None or rps is None:
        raise RuntimeError(f"wrk printed no summary:\n{text}")
    failed = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if non_2xx is not None:
        failed += int(non_2xx.group(1))
    return WrkStats(int(requests.group(1)), float(rps.group(1)), failed, _percentile(text, 50), _percentile(text, 99))


def _percentile(text: str, q: int) -> float:
    found = re.search(rf"^\s*{q}%\s+([\d.]+)(us|ms|s)\b", text, re.M)
    return float("nan") if found is None else float(found.group(1)) * _UNITS[found.group(2)]
