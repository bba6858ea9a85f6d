"""An upstream that dies, as an operator meets it: `mcp-sidecar run` as a real process in front of a real
upstream process that is killed with SIGKILL, `/readyz` and `mcp_sidecar_upstream_up` sampled over and over,
the JSON log read. Once readiness has said "not ready", it says so (and the metric says 0) until the upstream
answers again, whatever `upstream.protocol` says; the log says "unreachable" once and then at a backed-off pace,
never "reachable again" while the upstream is down; started again on the same port, it is ready again.

The start-up line: one line says where the upstream stands when the sidecar starts (reachable, its era, whether
it can push, the polling interval; or unreachable, why, and that it is retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster import Replica, sidecar_config
from tests.kit import eventually, rpc
from tests.peers import Era, Upstream, start_upstream
from tests.procs import REPO_ROOT, free_port, http_answers

MIN_SAMPLES = 20
"""Samples taken after the first "not ready", at the least."""
MAX_SAMPLES = 80
"""Samples at the most: the sidecar logs its second backed-off "still unreachable" line well before (a lying
readiness shows in the first few)."""
SAMPLE_PACE_S = 0.1
"""Pause between two samples, so that they spread over the sidecar's retries; no assertion depends on it."""
OUTAGE_WAIT_S = 30.0
"""Above the kit's WAIT_S: it outlasts REMINDERS of the sidecar's backed-off retries, and the recovery after."""
REMINDERS = 2
"""Backed-off "still unreachable" lines the sampling outlasts (each comes at a retry of the sidecar's own)."""
POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "backoff_initial_ms": 100, "backoff_max_ms": 500}
RESTARTS = {"restart_backoff_initial_ms": 100, "restart_backoff_max_ms": 1000}
PRICE = "catalog://price"
NOTE = "toy://note"


def _messages(replica: Replica) -> list[str]:
    return [str(entry.get("msg")) for entry in replica.log_lines()]


@contextlib.asynccontextmanager
async def _running(replica: Replica) -> AsyncIterator[Replica]:
    try:
        await replica.start()
        yield replica
    finally:
        await replica.service.stop()


async def _sample(replica: Replica) -> tuple[bool, float]:
    """(/readyz said ready, mcp_sidecar_upstream_up), one after the other."""
    status, _ = await replica.readyz()
    up = (await replica.metrics()).total("mcp_sidecar_upstream_up")
    return status == 200, up


async def _sample_while_down(replica: Replica, still_down: str) -> tuple[int, int, list[tuple[bool, float]]]:
    """Sample until the first "not ready", then on until the log holds REMINDERS lines `still_down` (at least
    MIN_SAMPLES samples, at most MAX_SAMPLES): (samples ready after the first not-ready, samples whose metric
    was not 0 then, the samples)."""
    samples: list[tuple[bool, float]] = []
    async with asyncio.timeout(OUTAGE_WAIT_S):
        while True:
            ready, up = await _sample(replica)
            if not ready:
                samples.append((ready, up))
                break
            await asyncio.sleep(SAMPLE_PACE_S)  # the upstream is gone: the next check finds out
        while len(samples) <= MAX_SAMPLES:
            await asyncio.sleep(SAMPLE_PACE_S)
            samples.append(await _sample(replica))
            if len(samples) > MIN_SAMPLES and _messages(replica).count(still_down) >= REMINDERS:
                break
    after_first = samples[1:]
    return sum(ready for ready, _ in after_first), sum(up != 0 for _, up in after_first), samples


def _assert_down_throughout(replica: Replica, ready: int, up: int, samples: list[tuple[bool, float]]) -> None:
    taken = len(samples) - 1
    assert (ready, up) == (0, 0), f"{ready} of {taken} samples ready, metric 1 in {up}: {samples}"
    assert taken >= MIN_SAMPLES
    assert not samples[0][0] and samples[0][1] == 0, samples[0]


async def _recovers(replica: Replica) -> None:
    async def ready_and_up() -> bool:
        return await replica.is_ready() and (await replica.metrics()).total("mcp_sidecar_upstream_up") == 1

    await eventually(ready_and_up, within_s=OUTAGE_WAIT_S, step=SAMPLE_PACE_S)


@pytest.mark.parametrize(
    ("protocol", "era"),
    [("auto", "modern"), ("auto", "legacy"), ("2026-07-28", "modern"), ("2025-11-25", "legacy")],
)
async def test_a_killed_http_upstream_stays_not_ready_until_it_is_back(
    tmp_path: Path, http: aiohttp.ClientSession, protocol: str, era: Era
) -> None:
    async with await start_upstream(era) as upstream:
        config = sidecar_config(upstream.url, free_port(), upstream={"protocol": protocol}, polling=POLLING)
        async with _running(Replica("sidecar", tmp_path, config)) as sidecar:
            status, read = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and read["result"]["contents"][0]["text"] == "price=100", read

            await upstream.kill()
            ready, up, samples = await _sample_while_down(sidecar, "upstream still unreachable")
            _assert_down_throughout(sidecar, ready, up, samples)
            messages = _messages(sidecar)
            assert messages.count("upstream unreachable") == 1, messages
            assert "upstream reachable again" not in messages, messages
            pauses = [
                entry["retry_in_s"] for entry in sidecar.log_lines() if entry["msg"] == "upstream still unreachable"
            ]
            assert len(pauses) >= REMINDERS and pauses == sorted(set(pauses)), pauses  # backed off
            status, body = await sidecar.readyz()
            assert status == 503 and "refused" in body["reason"], body

            await upstream.start()  # the same port
            await _recovers(sidecar)
            assert _messages(sidecar).count("upstream reachable again") == 1
            status, read = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and read["result"]["contents"][0]["text"] == "price=100", read


async def test_a_killed_stdio_server_that_cannot_start_again_stays_not_ready_until_it_can(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    allowed = tmp_path / "may-start"
    pids = tmp_path / "pids"
    toy = shlex.join([sys.executable, "-m", "tests.peers.stdio_toy_server", "--pid-file", str(pids)])
    # A server whose start fails while the file is missing (a registry out of reach, a key revoked).
    command = ["sh", "-c", f"test -e {shlex.quote(str(allowed))} || exit 3; exec {toy}"]
    allowed.touch()
    config = sidecar_config("", free_port(), polling=POLLING)
    config["upstream"] = {"command": command, "cwd": str(REPO_ROOT), **RESTARTS}
    async with _running(Replica("sidecar", tmp_path, config)) as sidecar:
        status, read = await rpc(http, sidecar.url, "resources/read", {"uri": NOTE})
        assert status == 200 and read["result"]["contents"][0]["text"] == "note", read

        allowed.unlink()
        os.kill(int(pids.read_text().split()[-1]), signal.SIGKILL)
        ready, up, samples = await _sample_while_down(sidecar, "stdio server down")
        _assert_down_throughout(sidecar, ready, up, samples)
        assert "upstream reachable again" not in _messages(sidecar)

        allowed.touch()
        await _recovers(sidecar)
        assert _messages(sidecar).count("upstream reachable again") == 1
        status, read = await rpc(http, sidecar.url, "resources/read", {"uri": NOTE})
        assert status == 200 and read["result"]["contents"][0]["text"] == "note", read


START_LINES = ("upstream reachable", "upstream unreachable")


def _start_lines(replica: Replica) -> list[dict[str, Any]]:
    return [entry for entry in replica.log_lines() if entry.get("msg") in START_LINES]


async def _line(replica: Replica, msg: str) -> dict[str, Any]:
    async def logged() -> bool:
        return any(entry["msg"] == msg for entry in _start_lines(replica))

    await eventually(logged, within_s=OUTAGE_WAIT_S)
    return next(entry for entry in _start_lines(replica) if entry["msg"] == msg)


@pytest.mark.parametrize(
    ("era", "native", "revision"), [("legacy", False, "2025-11-25"), ("modern", True, "2026-07-28")]
)
async def test_start_up_says_the_upstream_is_reachable_its_era_push_and_polling_interval(
    tmp_path: Path, era: Era, native: bool, revision: str
) -> None:
    async with await start_upstream(era, native=native) as upstream:
        config = sidecar_config(upstream.url, free_port(), polling=POLLING)
        replica = Replica("sidecar", tmp_path, config)
        # Nobody asks /readyz: the line comes from the start alone.
        async with replica.service.serving(http_answers(f"{replica.base_url}/healthz")):
            line = await _line(replica, "upstream reachable")
            assert line["level"] == "info" and line["upstream"] == upstream.url
            assert line["era"] == revision and line["push"] is native
            assert line["polling_interval_ms"] == POLLING["default_interval_ms"]
            assert [entry["msg"] for entry in _start_lines(replica)] == ["upstream reachable"]


async def test_start_up_says_the_upstream_is_unreachable_and_why_then_reachable_once_it_answers(
    tmp_path: Path,
) -> None:
    port = free_port()
    upstream = Upstream("modern", port)
    config = sidecar_config(upstream.url, free_port(), polling=POLLING)
    replica = Replica("sidecar", tmp_path, config)
    try:
        async with replica.service.serving(http_answers(f"{replica.base_url}/healthz")):
            line = await _line(replica, "upstream unreachable")
            assert line["level"] == "warning" and "refused" in line["reason"] and line["retry_in_s"] > 0, line
            assert line["upstream"] == upstream.url

            await upstream.start()  # nobody asks /readyz: the sidecar's own retries find it
            reachable = await _line(replica, "upstream reachable")
            assert reachable["era"] == "2026-07-28" and reachable["push"] is False, reachable
            assert [entry["msg"] for entry in _start_lines(replica)] == ["upstream unreachable", "upstream reachable"]
            assert (await replica.metrics()).total("mcp_sidecar_upstream_up") == 1
    finally:
        await upstream.stop()
