"""Fixtures: real SDK upstreams (subprocesses) and the sidecar in front of them.

Also the run's policy, chosen by the `CI` environment variable (`tests.prereqs.in_ci`):
- a test skipped because a real peer is missing (its reason starts with `tests.prereqs.MISSING_PEER`) fails
  under CI, so a broken install step cannot pass green; locally it stays a skip (`pytest -rs` lists them);
- `SIDECAR_TEST_LOOP=uvloop` runs the in-process sidecars on uvloop, the loop `mcp-sidecar run` picks on Linux
  (the tests that start the command itself run on it anyway);
- hypothesis runs derandomized under CI (the same examples every run, so a red run is reproducible) and
  randomly elsewhere (`HYPOTHESIS_PROFILE=ci` or `=dev` picks one explicitly).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest
from hypothesis import settings

from tests.cluster import RedisServer, redis_server
from tests.peers import Upstream, start_upstream
from tests.prereqs import MISSING_PEER, in_ci

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    """Under CI, a skip for a missing real peer is a failure (see the module docstring)."""
    report = yield
    if in_ci() and isinstance(report, pytest.TestReport) and report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        if MISSING_PEER in reason:
            report.outcome = "failed"
            report.longrepr = f"{reason}\n(CI=true: a real peer that is missing fails the run instead of skipping)"
    return report


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop the tests (and the sidecars they start in-process) run on: see the module docstring."""
    if os.environ.get("SIDECAR_TEST_LOOP") == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


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


FAST_TTL_MS = 300
"""The ttlMs of `fast_upstream`'s reads and lists: a sidecar in front of it polls each watch about this often."""


@pytest.fixture
async def fast_upstream(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    """The shop server with reads and lists of ttlMs 300 (a legacy one carries none): modern, or the era a test
    gives it (`@pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)`)."""
    era = getattr(request, "param", "modern")
    async with await start_upstream(era, read_ttl_ms=FAST_TTL_MS, list_ttl_ms=FAST_TTL_MS) as up:
        yield up


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server of the test's own on 127.0.0.1, stopped after it."""
    async with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The sidecar's tracing on for the test, into memory: the finished spans (the process's tracing restored
    after). Imported here, not at the top: only the tracing tests need the `otel` extra."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sidecar.observability.tracing import Tracing, install

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = install(Tracing(provider.get_tracer("tests"), provider))
    try:
        yield exporter
    finally:
        install(previous)
        provider.shutdown()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def wide_http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session without a connection limit: every concurrent request gets its own connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--invariant",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="run only the tests marked invariant(N) (repeatable): what tests/breaks/run.py runs against a break",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(config.getoption("invariant"))
    if not wanted:
        return
    kept, dropped = [], []
    for item in items:
        pinned = {mark.args[0] for mark in item.iter_markers("invariant") if mark.args}
        (kept if pinned & wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
