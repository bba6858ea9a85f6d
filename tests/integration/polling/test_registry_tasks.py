"""The registry's own tasks keep their outcome: a first read whose every caller gave up, and which then fails,
does not leave an exception nobody retrieves.

The registry of an in-process sidecar, driven directly, in front of an address where no upstream answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

from sidecar.app import REGISTRY
from sidecar.identity import ANONYMOUS_IDENTITY
from tests.kit import eventually, serve_sidecar
from tests.procs import free_port


async def test_a_first_read_abandoned_by_its_caller_and_then_failing_leaves_no_unretrieved_exception() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with serve_sidecar(f"http://127.0.0.1:{free_port()}/mcp") as sidecar:
            registry = sidecar.app[REGISTRY]
            caller = asyncio.create_task(registry.acquire("resource", "catalog://price", ANONYMOUS_IDENTITY))
            await asyncio.sleep(0)  # one step: its first read is started, and it waits on it
            caller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await caller
            # The read goes on alone, fails (nothing listens there), and is dropped by the registry.
            await eventually(lambda: not registry.looks_in_flight)  # no event tells that an abandoned read ended
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert not [context for context in reported if "never retrieved" in str(context.get("message"))], reported
