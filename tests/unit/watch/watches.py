"""One `Watch` built for a test, with everything it is not about stood in for: the poller's tests and the tests of
one poll as its driver runs it share it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.watch.clock import LOOP_CLOCK, Clock
from sidecar.watch.observation import Observation
from sidecar.watch.poller import ObservationListener, Reader, Sink, Watch
from sidecar.watch.schedule import Schedule
from sidecar.watch.tickets import Tickets

__all__ = ["PUBLIC_KEY", "make_watch"]

PUBLIC_KEY = WatchKey("resource", "x://1", "public")


async def _never(_: Watch) -> Observation | None:
    raise AssertionError("not polled in this test")


async def _drop(_: ChangeEvent) -> None:
    return None


def make_watch(
    reader: Reader = _never,
    sink: Sink = _drop,
    tickets: Tickets | None = None,
    *,
    config: PollingConfig,
    key: WatchKey = PUBLIC_KEY,
    metrics: Metrics | None = None,
    gate: asyncio.Semaphore | None = None,
    clock: Clock = LOOP_CLOCK,
    observed: ObservationListener = lambda key, fingerprint, ticket: None,
    on_auth_failure: Callable[[Watch, UpstreamHTTPError], None] = lambda *_: None,
) -> Watch:
    """A watch of `key` whose baseline is `fp-0` (ticket 1), read by `reader`, telling its changes to `sink`."""
    tickets = tickets or Tickets()
    return Watch(
        key,
        Observation("fp-0", None, True),
        ticket=tickets.take(),
        schedule=Schedule(config),
        reader=reader,
        sink=sink,
        gate=gate or asyncio.Semaphore(1),
        tickets=tickets,
        metrics=metrics or Metrics(),
        on_auth_failure=on_auth_failure,
        observed=observed,
        clock=clock,
    )
