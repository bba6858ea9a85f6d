"""The registry's looks at the upstream: every look (a poll, a first read, a joiner's look) among the polls, at
most `polling.max_concurrency` at once, and ticketed as it starts (`sidecar.watch.tickets`); a caller's own look
over its client's first-read rate waits its turn in that client's fair share. What a look at the tools list sees
goes to the tool catalog (`sidecar.watch.tool_calls`). A poll's look comes back as the event the engine is fed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol import UpstreamError, UpstreamHTTPError
from sidecar.upstream.base import Look
from sidecar.watch.clock import Clock
from sidecar.watch.engine.events import PollDone, PollFailed, PollSkipped
from sidecar.watch.observation import Observation
from sidecar.watch.observe import Listed, observe
from sidecar.watch.rules import Rules
from sidecar.watch.tickets import Tickets
from sidecar.watch.tool_calls import ToolCatalog

__all__ = ["Looks", "PollOutcome"]

PollOutcome = tuple[PollDone | PollFailed | PollSkipped, UpstreamError | None]
"""How a poll's look went, as the engine's event, and the upstream's failure if it failed."""


class Looks:
    """The concurrency gate and the ticket clock every look shares, and a caller's look in its turn."""

    def __init__(
        self,
        upstream: Look,
        config: PollingConfig,
        fair_share: FairShare,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self._upstream = upstream
        self._config = config
        self._fair_share = fair_share
        """Where a client's first reads over its rate wait their turn, among its forwarded requests."""
        self.rules = Rules(config.rules)
        """The polling rules (`polling.rules`), which the engine applies too."""
        self.tools = ToolCatalog()
        """What the tools lists this reads show of each tool (which tool calls only read)."""
        self._metrics = metrics
        self._clock = clock
        self.gate = asyncio.Semaphore(config.max_concurrency)
        self.tickets = Tickets()

    def _turn(self, identity: Identity, paced: bool) -> contextlib.AbstractAsyncContextManager[None]:
        """A first read within the client's rate goes at once (among the polls); one over it waits its turn in
        the client's fair share, so a client subscribing to thousands of URIs delays only itself."""
        if not paced:
            return contextlib.nullcontext()
        return self._fair_share.slot(
            identity.client, within_s=self._config.baseline_wait_s, limit="baseline_wait", lane=identity.lane
        )

    async def look(self, kind: WatchKind, uri: str | None, identity: Identity, paced: bool) -> tuple[int, Observation]:
        """A caller's own look: in its turn, among the polls, ticketed as it starts."""
        async with self._turn(identity, paced), self.gate:
            listed = self._listed(kind, identity)
            return await self.tickets.look(
                lambda: observe(self._upstream, kind, uri, identity, self.rules, listed=listed)
            )

    async def poll(self, key: WatchKey, due: float, poller: Callable[[WatchKey], Identity | None]) -> PollOutcome:
        """A watch's poll, due at `due`, with the credential of `poller(key)` (asked once it is its turn): a JSON-RPC
        error the upstream answers for the resource is its state, which the engine confirms (invariant 24). What
        no upstream failure explains (a bug) is raised: the poll's task counts it as a crash (`PollTasks`)."""
        metrics, clock = self._metrics, self._clock
        queued_at = clock.now() if self.gate.locked() else None
        async with self.gate:
            started = clock.now()
            if queued_at is not None:  # waited for polling.max_concurrency: a wait, not a refusal
                metrics.queue_wait.labels("poll_concurrency").observe(started - queued_at)
            metrics.poll_lag.observe(max(0.0, started - due))
            identity = poller(key)
            if identity is None:
                return PollSkipped(key, started), None  # lingering: no stream holds it, so no credential
            listed = self._listed(key.kind, identity)
            try:
                ticket, seen = await self.tickets.look(
                    lambda: observe(
                        self._upstream, key.kind, key.uri, identity, self.rules, errors_are_states=True, listed=listed
                    )
                )
            except UpstreamError as exc:
                metrics.polls.labels(key.kind, "error").inc()
                refused = isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure
                return PollFailed(key, started, identity.context if refused else None), exc
            finally:
                metrics.poll_duration.labels(key.kind).observe(clock.now() - started)
        metrics.polls.labels(key.kind, "error_state" if seen.error else "ok").inc()
        return PollDone(key, started, ticket, seen), None

    def _listed(self, kind: WatchKind, identity: Identity) -> Listed | None:
        """Where a look at the tools list as `identity` tells what it saw: that context's tools, or everyone's when
        the upstream marks the list public."""
        if kind != "tools_list":
            return None
        tools = self.tools

        def listed(entries: list[Any], public: bool) -> None:
            tools.learn(PUBLIC if public else identity.context, entries, complete=True)

        return listed
