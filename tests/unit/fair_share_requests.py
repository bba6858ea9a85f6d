"""A fair share driven by requests that hold their slots until a test lets them go: who got a slot, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from sidecar.fair_share import FairShare
from sidecar.observability.metrics import Metrics
from tests.kit import eventually

__all__ = ["Requests", "fair_share", "sent"]


def fair_share(capacity: int, per_client: int | None = None, queued: int = 100) -> FairShare:
    return FairShare(
        capacity=capacity,
        per_client=per_client or capacity,
        max_queued_per_client=queued,
        metrics=Metrics(),
        refusal_pause_s=0,
    )


class Requests:
    """Requests of named clients, each holding its slot until `finish` lets it go; `order` is who got one."""

    def __init__(self, share: FairShare) -> None:
        self.share = share
        self.order: list[str] = []
        self._done: dict[str, list[asyncio.Event]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self._holding: set[asyncio.Event] = set()
        """The requests running with a slot now (each by its `done` event)."""

    def send(
        self, client: str, within_s: float = 30, *, released: Callable[[], None] = lambda: None
    ) -> asyncio.Task[None]:
        """A request of `client`; `address/credential` names a credential's own lane within that address.
        `released` runs as its slot is handed on, before whoever gets it can run."""
        done = asyncio.Event()
        self._done.setdefault(client, []).append(done)
        address, _, lane = client.partition("/")

        async def hold() -> None:
            async with self.share.slot(address, within_s=within_s, limit="queue_wait", lane=lane):
                self.order.append(client)
                self._holding.add(done)
                try:
                    await done.wait()
                finally:
                    self._holding.discard(done)
            released()

        task = asyncio.get_running_loop().create_task(hold())
        self.tasks.append(task)
        return task

    async def finish(self, client: str) -> None:
        """End `client`'s oldest request that holds a slot, and let the loop hand the slot on."""
        self.end(client)
        await self.settled()

    def end(self, client: str) -> None:
        """Let `client`'s oldest request that holds a slot go, and return before it has."""
        holding = self.order.count(client)
        ended = sum(1 for event in self._done[client] if event.is_set())
        assert holding > ended, f"{client} holds no slot"
        self._done[client][ended].set()

    def _quiet(self) -> bool:
        live = sum(not task.done() for task in self.tasks)
        held = len(self._holding)
        leaving = any(done.is_set() for done in self._holding) or any(
            task.cancelling() for task in self.tasks if not task.done()
        )
        return not leaving and self.share.in_flight == held and held + self.share.queued == live

    async def settled(self) -> None:
        """Until every request still live runs with its slot or waits in the queue: none let go or cancelled and still
        there, none granted a slot it has not taken up, none on its way in."""
        await eventually(self._quiet, what="every live request holds its slot or waits its turn")

    async def finish_all(self) -> None:
        for events in self._done.values():
            for event in events:
                event.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def sent(requests: Requests, clients: Sequence[str]) -> None:
    for client in clients:
        requests.send(client)
    await requests.settled()
