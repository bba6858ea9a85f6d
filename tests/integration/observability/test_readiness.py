"""Readiness tells the truth: an upstream that answers garbage is up but unusable, and says so everywhere."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.app import METRICS
from tests.kit import eventually, readyz, rpc, serve_sidecar, told
from tests.peers.faulty import Fault, FaultyUpstream

PROBES = frozenset({"server/discover", "initialize", "ping"})


@pytest.fixture(params=["modern", "legacy"])
async def up(request: pytest.FixtureRequest) -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream(era=request.param) as upstream:
        yield upstream


async def test_an_upstream_answering_garbage_to_the_probe_is_not_ready_and_says_why(
    up: FaultyUpstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    garbage = up.fail(Fault.NOT_JSON, methods=PROBES)
    async with serve_sidecar(up.url) as sidecar:
        with caplog.at_level(logging.WARNING, logger="sidecar.upstream.http.client"):
            status, body = await readyz(http, sidecar.admin_url)
        assert status == 503, body
        assert "unusable" in str(body["reason"]) and "not JSON" in str(body["reason"])
        assert any(record.getMessage() == "upstream unusable" for record in caplog.records)
        async with http.get(f"{sidecar.admin_url}/status") as resp:
            upstream = (await resp.json())["upstream"]
        assert upstream["era"] is None and upstream["usable"] is False and upstream["up"] is True
        assert "unusable" in upstream["not_ready_reason"]
        assert sidecar.app[METRICS].upstream_usable._value.get() == 0

        # A client is told what is wrong, never that a resource does not exist.
        status, message = await rpc(http, sidecar.url, "resources/read", {"uri": "ok://a"})
        assert status == 502 and "not JSON" in told(message["error"], caplog.records)["reason"]

        up.heal(garbage)
        status, body = await readyz(http, sidecar.admin_url)  # not ready: asked again at once
        assert status == 200, body
        assert sidecar.app[METRICS].upstream_usable._value.get() == 1


async def test_an_upstream_that_starts_answering_garbage_becomes_not_ready(
    up: FaultyUpstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(up.url) as sidecar:
        assert (await readyz(http, sidecar.admin_url))[0] == 200
        up.fail(Fault.NOT_JSON, methods=PROBES)

        async def not_ready() -> bool:
            return (await readyz(http, sidecar.admin_url))[0] == 503

        await eventually(not_ready)  # the next readiness check after the contact goes stale re-asks it
        status, body = await readyz(http, sidecar.admin_url)
        assert status == 503 and "unusable" in str(body["reason"])
