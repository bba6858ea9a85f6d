"""Fixtures: real SDK upstreams (subprocesses) and the sidecar in front of them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.peers import Upstream, start_upstream


@pytest.fixture
async def modern_upstream() -> AsyncIterator[Upstream]:
    """An SDK 2.3 server that speaks 2026-07-28 (and 2025-11-25) without subscriptions."""
    async with await start_upstream("modern") as up:
        yield up


@pytest.fixture
async def legacy_upstream() -> AsyncIterator[Upstream]:
    """An SDK 2.3 server behind a guard: it speaks only the handshake era (2025-11-25)."""
    async with await start_upstream("legacy") as up:
        yield up


@pytest.fixture(params=["modern", "legacy"])
async def upstream(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    """Each test runs against both kinds of upstream."""
    async with await start_upstream(request.param) as up:
        yield up


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
