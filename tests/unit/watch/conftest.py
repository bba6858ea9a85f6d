"""The watch unit tests' shared fixture: a registry's world, closed after the test, which fails if anything the
engine did failed (a crashed poll, a failed task) unless the test asked for it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tests.unit.watch.registry_world import World, make_world


@pytest.fixture
async def world(caplog: pytest.LogCaptureFixture) -> AsyncIterator[World]:
    world = make_world()
    yield world
    await world.registry.aclose()
    records = [*caplog.get_records("call"), *caplog.records]
    failures = [record.getMessage() for record in records if record.levelno >= logging.WARNING]
    assert failures == [], "nothing the engine did failed (a crashed poll, a failed task) unless asked to"
