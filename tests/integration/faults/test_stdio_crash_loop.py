"""A stdio server that dies at start, over and over: the admin listener says why in every sample, and the log says
it at warning.

The child is a real process: Python raising at start (a traceback on stderr, exit code 1), as a server whose
database is missing does. The sidecar restarts it with a short backoff, so it is sampled both `down` (waiting to
start it again) and `starting` (started, no handshake yet): the state a probe or a person looking once used to
find saying only "waiting for the stdio server to answer its handshake".
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import aiohttp
import pytest

from tests.kit import WAIT_S, eventually, scrape
from tests.peers.stdio_peers import serve_stdio_sidecar

LAST_WORDS = "RuntimeError: no database at /srv/missing.db"
DIES_AT_START = [sys.executable, "-c", "raise RuntimeError('no database at /srv/missing.db')"]
RESTARTS = {"restart_backoff_initial_ms": 50, "restart_backoff_max_ms": 200}
"""Restarted within a fifth of a second: samples land in both states."""


async def _admin(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def test_a_crash_looping_child_names_its_last_exit_in_every_readyz_and_status_sample(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with serve_stdio_sidecar(DIES_AT_START, upstream=RESTARTS) as sidecar:

        async def looping() -> bool:
            metrics = await scrape(http, sidecar.admin_url)
            return metrics.value("mcp_sidecar_upstream_restarts_total", reason="exited") >= 2

        await eventually(looping, what="the child exited twice")
        states: set[str] = set()

        async def sampled_both_states() -> bool:
            status, ready = await _admin(http, f"{sidecar.admin_url}/readyz")
            _, page = await _admin(http, f"{sidecar.admin_url}/status")
            for reason in (ready["reason"], page["upstream"]["not_ready_reason"]):
                # Every sample, whatever the state: the exit, its last stderr line, when, the restarts so far.
                assert status == 503 and "exited with code 1" in reason and LAST_WORDS in reason, reason
                assert " at " in reason and "restarts so far" in reason, reason
                states.add("starting" if reason.startswith("starting") else "down")
            return states == {"starting", "down"}

        await eventually(sampled_both_states, WAIT_S, step=0.01, what="samples while starting and while down")

    downs = [record for record in caplog.records if record.getMessage() == "stdio server down"]
    assert downs and all(record.levelno == logging.WARNING for record in downs)
    assert all(LAST_WORDS in vars(record)["stderr_tail"] for record in downs), "each exit's traceback, at warning"
    stderr = [r for r in caplog.records if r.name == "sidecar.upstream.stdio.stderr" and r.getMessage() == LAST_WORDS]
    # Every child after the first is started after one that died: its traceback is a warning as it is read.
    assert sum(record.levelno == logging.WARNING for record in stderr) >= len(stderr) - 1 >= 1, stderr
