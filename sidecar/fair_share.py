"""The upstream's capacity for client requests, shared fairly between clients: over its share, a request waits
its turn instead of being refused (invariant 20).

A *client* is the unit of fairness (`Identity.client`): a credential the upstream has accepted, or else the
address a request comes from. At most `capacity` client requests are in flight upstream at once, and one client
at most `per_client` of them, so its slow requests always leave room for the others. A request that finds no
free slot waits in its client's queue; each slot that frees goes to the next waiting client in turn (round
robin, one request per turn), so a busy client gets the spare capacity while nobody else wants it, and only its
turn when others do.

Within an address, fairness is a second round (`Identity.lane`): the address's anonymous requests wait in one
lane, and each credential the upstream has not accepted yet in a lane of its own; the address's turn goes to its
lanes in round robin. A newcomer behind a busy address thus waits one turn of each lane, not the whole queue of
a stranger's flood; and invented tokens, however many, share the address's one turn and gain nothing against
another address.

A client is refused (429 with Retry-After) only when its own queue is full or its request waited out its
deadline: never because of someone else's traffic, whose requests wait in queues of their own. The bounds: an
address's anonymous lane, and its new credentials' lanes together (so at most that many lanes), each hold at
most `max_queued_per_client` waiting requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from sidecar.observability.metrics import Metrics
from sidecar.protocol import TooManyRequests
from sidecar.upstream.answers import ReleasingStream, Reply

__all__ = ["OWN_LANE", "REFUSAL_PAUSE_S", "FairShare"]

REFUSAL_PAUSE_S = 1.0
"""How long a request over its client's queue bound waits before its 429 (the Retry-After it then carries)."""

_QUEUE_FULL = {True: "queued_per_client", False: "queued_new_credentials"}
"""The limit a full queue is counted under: a client's own lane, or its new credentials' lanes together."""


OWN_LANE = ""
"""The lane of a client's own requests: all of an accepted credential's, an address's anonymous ones."""


class _Client:
    """One client's requests: how many are in flight, and the ones waiting for a slot, by lane, oldest first."""

    __slots__ = ("in_flight", "in_turn", "lane_turns", "lanes", "waiting_in_new_lanes")

    def __init__(self) -> None:
        self.in_flight = 0
        self.lanes: dict[str, deque[asyncio.Future[None]]] = {}
        """Only lanes with a request waiting: an emptied lane is forgotten at once."""
        self.lane_turns: deque[str] = deque()
        """The lanes of `lanes`, in the order their turn comes within this client's."""
        self.waiting_in_new_lanes = 0
        """Requests waiting in the lanes of credentials the upstream has not accepted yet (all but the own lane)."""
        self.in_turn = False
        """In the round of clients waiting for a slot (not while it is at its own in-flight bound)."""

    @property
    def waiting(self) -> bool:
        return bool(self.lane_turns)

    def wait_in(self, lane: str, turn: asyncio.Future[None]) -> None:
        queue = self.lanes.get(lane)
        if queue is None:
            queue = self.lanes[lane] = deque()
            self.lane_turns.append(lane)  # a new lane's turn comes after those of the lanes already waiting
        queue.append(turn)
        if lane != OWN_LANE:
            self.waiting_in_new_lanes += 1

    def next_waiting(self) -> asyncio.Future[None]:
        """The oldest request of the lane whose turn it is; that lane goes to the back of the round."""
        lane = self.lane_turns.popleft()
        queue = self.lanes[lane]
        turn = queue.popleft()
        if queue:
            self.lane_turns.append(lane)
        else:
            del self.lanes[lane]
        if lane != OWN_LANE:
            self.waiting_in_new_lanes -= 1
        return turn

    def leave(self, lane: str, turn: asyncio.Future[None]) -> bool:
        """Take a request that gives up out of its lane; False when it was no longer waiting there."""
        queue = self.lanes.get(lane)
        if queue is None or turn not in queue:
            return False
        queue.remove(turn)
        if not queue:
            del self.lanes[lane]
            self.lane_turns.remove(lane)
        if lane != OWN_LANE:
            self.waiting_in_new_lanes -= 1
        return True

    def queue_full(self, lane: str, bound: int) -> int | None:
        """How many wait in the queue `lane` counts against when that is full (None when there is room)."""
        waiting = len(self.lanes.get(lane, ())) if lane == OWN_LANE else self.waiting_in_new_lanes
        return waiting if waiting >= bound else None


class FairShare:
    """Slots for client requests upstream, handed out round robin between the clients that wait for one."""

    def __init__(
        self,
        *,
        capacity: int,
        per_client: int,
        max_queued_per_client: int,
        metrics: Metrics,
        refusal_pause_s: float = REFUSAL_PAUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.per_client = min(per_client, capacity)
        self.max_queued_per_client = max_queued_per_client
        self._metrics = metrics
        self._clock = clock
        self._refusal_pause_s = refusal_pause_s
        self._clients: dict[str, _Client] = {}
        self._turns: deque[str] = deque()
        """Clients with a waiting request that may take one more slot, in the order their turn comes."""
        self.in_flight = 0
        self.queued = 0
        self._depth = metrics.queue_depth.labels("upstream_requests")
        self._wait = metrics.queue_wait.labels("upstream_requests")

    @property
    def active_clients(self) -> int:
        """Clients with a request in flight or waiting now."""
        return len(self._clients)

    async def run(
        self, client: str, send: Callable[[], Awaitable[Reply]], *, within_s: float, lane: str = OWN_LANE
    ) -> Reply:
        """`send` once `client` has a slot for `lane` (a streamed answer holds it until the stream ends);
        TooManyRequests when its queue is full or no slot came within `within_s`."""
        await self.acquire(client, within_s=within_s, limit="queue_wait", lane=lane)
        try:
            reply = await send()
        except BaseException:
            self.release(client)
            raise
        if reply.stream is not None:
            reply.stream = ReleasingStream(reply.stream, lambda: self.release(client))
        else:
            self.release(client)
        return reply

    @contextlib.asynccontextmanager
    async def slot(self, client: str, *, within_s: float, limit: str, lane: str = OWN_LANE) -> AsyncIterator[None]:
        """Hold one of `client`'s slots for the block (a paced baseline read)."""
        await self.acquire(client, within_s=within_s, limit=limit, lane=lane)
        try:
            yield
        finally:
            self.release(client)

    async def acquire(self, client: str, *, within_s: float, limit: str, lane: str = OWN_LANE) -> None:
        """Take a slot for `client`, waiting its turn, and within it `lane`'s; `limit` names the refusal when the
        wait runs out."""
        state = self._clients.get(client)
        if state is None:
            state = self._clients[client] = _Client()
            self._metrics.clients_active.set(len(self._clients))
        if self.in_flight < self.capacity and state.in_flight < self.per_client:
            # Nobody can be waiting while a slot is free for them (every release hands its slot on at once).
            self._grant(state)
            self._wait.observe(0.0)
            return
        waiting = state.queue_full(lane, self.max_queued_per_client)
        if waiting is not None:
            self._metrics.limit_rejections.labels(_QUEUE_FULL[lane == OWN_LANE]).inc()
            self._forget_if_idle(client, state)
            # Answered after a pause: a client over its bound is refused at most once a second per connection,
            # not thousands of times a second at the cost of everyone else's CPU.
            await asyncio.sleep(self._refusal_pause_s)
            whose = "this client already has" if lane == OWN_LANE else "new credentials from this address already have"
            raise TooManyRequests(f"{whose} {waiting} requests waiting for the upstream; retry later")
        turn = asyncio.get_running_loop().create_future()
        state.wait_in(lane, turn)
        self._queued(+1)
        if not state.in_turn and state.in_flight < self.per_client:
            state.in_turn = True
            self._turns.append(client)
        started = self._clock()
        try:
            async with asyncio.timeout(within_s):
                await turn
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self.release(client)  # granted just as the wait ended: hand the slot on
            else:
                turn.cancel()
                if state.leave(lane, turn):
                    self._queued(-1)
                if not state.waiting and state.in_turn:
                    state.in_turn = False  # nothing left to wait for: out of the round now, not at its turn
                    with contextlib.suppress(ValueError):
                        self._turns.remove(client)
                self._forget_if_idle(client, state)
            if isinstance(exc, TimeoutError):
                self._metrics.limit_rejections.labels(limit).inc()
                raise TooManyRequests(
                    f"this client's request waited {within_s:g} s behind its own for the upstream; retry later"
                ) from None
            raise
        self._wait.observe(self._clock() - started)

    def release(self, client: str) -> None:
        """One of `client`'s requests is done with its slot: the next client in turn gets it."""
        state = self._clients.get(client)
        if state is None:
            return
        self.in_flight -= 1
        state.in_flight -= 1
        if state.waiting and not state.in_turn:
            state.in_turn = True  # back in the round now that it is under its own bound again
            self._turns.append(client)
        self._forget_if_idle(client, state)
        self._hand_on()

    def _hand_on(self) -> None:
        while self.in_flight < self.capacity and self._turns:
            client = self._turns.popleft()
            state = self._clients.get(client)
            if state is None:
                continue
            state.in_turn = False
            if not state.waiting or state.in_flight >= self.per_client:
                # Re-enters the round when it waits again, or when one of its own slots frees.
                self._forget_if_idle(client, state)
                continue
            turn = state.next_waiting()
            self._queued(-1)
            if turn.done():
                # Cancelled a moment ago; its task, not yet resumed, finds it gone from the queue. Same turn again.
                self._turns.appendleft(client)
                state.in_turn = True
                continue
            self._grant(state)
            turn.set_result(None)
            if state.waiting and state.in_flight < self.per_client:
                state.in_turn = True
                self._turns.append(client)

    def _grant(self, state: _Client) -> None:
        self.in_flight += 1
        state.in_flight += 1

    def _queued(self, change: int) -> None:
        self.queued += change
        self._depth.set(self.queued)

    def _forget_if_idle(self, client: str, state: _Client) -> None:
        # Not while its name is still in the round: a new entry under that name would get two turns a round.
        if state.in_flight == 0 and not state.waiting and not state.in_turn and self._clients.get(client) is state:
            del self._clients[client]
            self._metrics.clients_active.set(len(self._clients))
