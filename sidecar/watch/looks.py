"""The registry's looks at the upstream: every look (a poll, a first read, a joiner's look) among the polls, at
most `polling.max_concurrency` at once, and ticketed as it starts (`sidecar.watch.tickets`); a caller's own look
over its client's first-read rate waits its turn in that client's fair share.
"""

from __future__ import annotations

import asyncio
import contextlib

from sidecar.changes import WatchKind
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import Identity
from sidecar.upstream.base import Upstream
from sidecar.watch.observe import Observation, observe
from sidecar.watch.rules import Rules
from sidecar.watch.tickets import Tickets

__all__ = ["Looks"]


class Looks:
    """The concurrency gate and the ticket clock every look shares, and a caller's look in its turn."""

    def __init__(self, upstream: Upstream, config: PollingConfig, fair_share: FairShare, rules: Rules) -> None:
        self._upstream = upstream
        self._config = config
        self._fair_share = fair_share
        """Where a client's first reads over its rate wait their turn, among its forwarded requests."""
        self._rules = rules
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
            return await self.tickets.look(lambda: observe(self._upstream, kind, uri, identity, self._rules))

    async def read(self, kind: WatchKind, uri: str | None, identity: Identity) -> Observation:
        """A watch's poll with `identity`'s credential (the watch gates and tickets its own): a JSON-RPC error the
        upstream answers for the resource is its state, which the watch confirms (invariant 24)."""
        return await observe(self._upstream, kind, uri, identity, self._rules, errors_are_states=True)
