"""The registry's polls in flight: each `StartPoll` the engine asks for, run as a task that looks at the upstream
(`Looks.poll`), feeds back how it went, publishes what changed, and then says it is over (`PollFinished`).

Part of the registry (the engine's one driver): it decides nothing. An idle watch is a timer entry of the
registry's, not a sleeping task; a task exists only while its poll runs, and a watch that ends cancels it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from sidecar.changes import Bus, ChangeEvent, WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS, tracing
from sidecar.protocol import UpstreamError, UpstreamHTTPError
from sidecar.watch.clock import Clock
from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import Publish, StartPoll
from sidecar.watch.engine.events import Event, PollCrashed, PollFinished
from sidecar.watch.engine.polls import LogLimiter
from sidecar.watch.looks import Looks

if TYPE_CHECKING:
    from opentelemetry.trace import Link

__all__ = ["Feed", "PollTasks"]

logger = logging.getLogger(__name__)

Feed = Callable[[Event, "list[Publish] | None"], None]
"""The registry's way to feed the engine an event (a poll collects the changes it publishes itself)."""

_HOLD_BEFORE_PUBLISH = os.environ.get("MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH") == "1"
"""Test seam: the replica tests kill an owner between seeing a change and publishing it. A poll that saw a
change logs that it holds it and waits for ever (for the kill). Unset in every real deployment."""

_failures_logged = LogLimiter(10.0)
"""One line per 10 s for every watch's failing polls together: an outage with thousands of watches stays readable."""


async def _hold() -> None:
    logger.warning("holding a change before publishing it (MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH)")
    await asyncio.get_running_loop().create_future()


class PollTasks:
    """Every watch's poll in flight, and the traced writes its next poll answers."""

    def __init__(self, engine: Engine, looks: Looks, bus: Bus, metrics: Metrics, clock: Clock, feed: Feed) -> None:
        self._engine = engine
        self._clock = clock
        self._looks = looks
        self._bus = bus
        self._metrics = metrics
        self._feed = feed
        self._running: dict[WatchKey, asyncio.Task[None]] = {}
        self._links: dict[WatchKey, list[Link]] = {}
        """Traced writes whose hints a watch's next poll answers (tracing on only)."""
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> int:
        """Polls in flight."""
        return len(self._running)

    def start(self, command: StartPoll) -> None:
        self._running[command.key] = asyncio.get_running_loop().create_task(self._poll(command))

    def link(self, key: WatchKey, links: Sequence[Link]) -> None:
        """`key`'s next poll answers the traced writes `links` (a watch's, which the engine knows)."""
        kept = self._links.setdefault(key, [])
        kept.extend(links[: MAX_LINKS - len(kept)])

    def stop(self, key: WatchKey) -> None:
        """`key`'s watch ended: its poll in flight, if any, is cancelled (and awaited at shutdown)."""
        self._links.pop(key, None)
        task = self._running.pop(key, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def publish(self, change: Publish) -> Coroutine[Any, Any, None]:
        """Publish `change` (logged and counted now, as it is seen; the bus's coroutine is the caller's to await)."""
        key = change.key
        logger.info(
            "change detected",
            extra={
                "watch": key.short_hash,
                "kind": key.kind,
                "generation": change.generation,
                "old": change.previous[:8],
                "new": change.fingerprint[:8],
            },
        )
        self._metrics.changes.labels(key.kind).inc()
        return self._bus.publish(ChangeEvent(key, change.fingerprint, change.generation, time.time()))

    async def _poll(self, command: StartPoll) -> None:
        key, started = command.key, self._clock.now()
        uri = key.uri if key.context == PUBLIC else None  # a private URI can name a person: only its hash
        try:
            with tracing().poll(key.kind, key.short_hash, uri, self._links.pop(key, ())):
                outcome, failure = await self._looks.poll(key, command.due, self._engine.poller)
                changes: list[Publish] = []
                self._feed(outcome, changes)
                if failure is not None:
                    self._failed(key, failure)
                for change in changes:
                    self._metrics.poll_changes.labels(key.kind).inc()
                    if _HOLD_BEFORE_PUBLISH:
                        await _hold()
                    with tracing().change(key.kind, key.short_hash, change.generation):
                        await self.publish(change)
        except Exception:  # boundary: a bug in one poll must not stop its watch for good
            logger.exception("poll crashed", extra={"watch": key.short_hash, "kind": key.kind})
            self._feed(PollCrashed(key, started), None)
        finally:
            if self._running.get(key) is asyncio.current_task():
                del self._running[key]
        self._feed(PollFinished(key), None)

    def _failed(self, key: WatchKey, exc: UpstreamError) -> None:
        # Expected failures (upstream down) log at info, others at warning; the first of a failure streak only.
        if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure:
            return  # the context's streams on it end (Revoke)
        record = self._engine.record(key)
        if record is None or record.consecutive_errors != 1 or not _failures_logged.allow(time.monotonic()):
            return
        level = logging.INFO if exc.is_transport_failure else logging.WARNING
        logger.log(
            level, "poll failed; backing off", extra={"watch": key.short_hash, "kind": key.kind, "reason": exc.reason}
        )

    async def aclose(self) -> None:
        tasks = [*self._running.values(), *self._stopping]
        self._running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
