"""The hub's unit tests' fixture: `make_hub(...)` builds a hub (and its registry's world) that is shut down after the
test, which fails if anything the hub or the engine did failed (a crashed fan-out, a failed poll) unless asked to."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.unit.downstream.hub_world import HubWorld, close_hub, make_hub


@pytest.fixture
async def hubs(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Callable[..., HubWorld]]:
    made: list[HubWorld] = []

    def make(capabilities: dict[str, Any] | None = None, **config: Any) -> HubWorld:
        made.append(make_hub(capabilities, **config))
        return made[-1]

    yield make
    for hub in made:
        await close_hub(hub)
    records = [*caplog.get_records("call"), *caplog.records]
    failures = [record.getMessage() for record in records if record.levelno >= logging.WARNING]
    assert failures == [], "nothing the hub or the engine did failed, unless the test asked for it"
