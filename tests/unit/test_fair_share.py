"""The fair share of the upstream's slots (invariant 20), on its own: who gets a slot that frees, who waits, who
is refused. No network: the requests are tasks holding slots until the test lets them go."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sidecar.fair_share import FairShare
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import TooManyRequests

pytestmark = pytest.mark.invariant(20)


def _share(capacity: int, per_client: int | None = None, queued: int = 100) -> FairShare:
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

    def send(self, client: str, within_s: float = 30) -> asyncio.Task[None]:
        done = asyncio.Event()
        self._done.setdefault(client, []).append(done)

        async def hold() -> None:
            async with self.share.slot(client, within_s=within_s, limit="queue_wait"):
                self.order.append(client)
                await done.wait()

        task = asyncio.get_running_loop().create_task(hold())
        self.tasks.append(task)
        return task

    async def finish(self, client: str) -> None:
        """End `client`'s oldest request that holds a slot, and let the loop hand the slot on."""
        holding = self.order.count(client)
        ended = sum(1 for event in self._done[client] if event.is_set())
        assert holding > ended, f"{client} holds no slot"
        self._done[client][ended].set()
        await _settle()

    async def finish_all(self) -> None:
        for events in self._done.values():
            for event in events:
                event.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _sent(requests: Requests, clients: Sequence[str]) -> None:
    for client in clients:
        requests.send(client)
    await _settle()


async def test_a_freed_slot_goes_to_the_next_waiting_client_in_turn_not_to_the_busiest() -> None:
    share = _share(capacity=2)
    requests = Requests(share)
    await _sent(requests, ["greedy", "greedy"])  # every slot taken by one client, on an otherwise idle share
    await _sent(requests, ["greedy"] * 5 + ["polite"])  # the polite request arrives behind five greedy ones
    assert requests.order == ["greedy", "greedy"] and share.queued == 6
    await requests.finish("greedy")
    assert requests.order[-1] == "polite"  # its turn came first, ahead of the greedy queue
    await requests.finish("greedy")
    assert requests.order[-1] == "greedy"  # nobody else waits: the spare slot goes to the greedy client
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_turns_alternate_between_waiting_clients_one_request_each() -> None:
    share = _share(capacity=1)
    requests = Requests(share)
    await _sent(requests, ["a", "a", "a", "b", "b", "c"])
    for _ in range(5):
        await requests.finish(requests.order[-1])
    # A client whose slot frees joins the round behind those that waited meanwhile.
    assert requests.order == ["a", "b", "c", "a", "b", "a"]
    await requests.finish_all()


async def test_two_busy_clients_alternate_slot_by_slot() -> None:
    share = _share(capacity=2)
    requests = Requests(share)
    await _sent(requests, ["a", "a"])
    await _sent(requests, ["a"] * 4 + ["b"] * 4)
    for _ in range(6):
        await requests.finish(requests.order[len(requests.order) - 2])  # the older of the two in flight
    # After b's first turn, each freed slot goes to the client that did not have the last one.
    assert requests.order[2:] == ["b", "a", "b", "a", "b", "a"]
    await requests.finish_all()


async def test_one_client_never_holds_more_than_its_share_even_with_slots_free() -> None:
    share = _share(capacity=4, per_client=3)
    requests = Requests(share)
    await _sent(requests, ["slow"] * 5)
    assert requests.order == ["slow"] * 3 and share.in_flight == 3  # one slot stays free for someone else
    await _sent(requests, ["other"])
    assert requests.order[-1] == "other"
    await requests.finish("slow")
    assert requests.order.count("slow") == 4  # its own slot freed: its next request goes
    await requests.finish_all()


async def test_a_client_over_its_queue_bound_is_refused_and_another_client_still_waits_its_turn() -> None:
    share = _share(capacity=1, queued=2)
    requests = Requests(share)
    await _sent(requests, ["a", "a", "a"])  # one in flight, two waiting: a's queue is full
    with pytest.raises(TooManyRequests) as refused:
        await share.acquire("a", within_s=30, limit="queue_wait")
    assert refused.value.status == 429 and refused.value.retry_after_s >= 1
    await _sent(requests, ["b"])  # b is not refused for a's load: it waits in a queue of its own
    assert share.queued == 3
    await requests.finish("a")
    assert requests.order[-1] == "b"  # and its turn comes before a's second
    await requests.finish_all()


async def test_a_request_that_waits_out_its_deadline_is_refused_and_leaves_the_queue() -> None:
    share = _share(capacity=1)
    requests = Requests(share)
    await _sent(requests, ["a"])
    late = requests.send("b", within_s=0.01)
    with pytest.raises(TooManyRequests):
        await late
    assert share.queued == 0
    assert share.active_clients == 1  # b is forgotten at once, not when its turn would have come
    await requests.finish("a")
    assert (share.in_flight, share.active_clients) == (0, 0)


async def test_a_slot_granted_to_a_request_cancelled_in_the_same_moment_is_handed_on() -> None:
    share = _share(capacity=1)
    requests = Requests(share)
    await _sent(requests, ["a"])
    gone = requests.send("b")
    requests.send("c")
    await _settle()
    requests._done["a"][0].set()
    await asyncio.sleep(0)  # a's slot is released and granted to b ...
    gone.cancel()  # ... which is cancelled before it could run
    await _settle()
    assert requests.order == ["a", "c"]  # b's slot went on to c instead of being lost
    await requests.finish_all()
    assert (share.in_flight, share.queued) == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    share = _share(capacity=1)
    requests = Requests(share)
    await _sent(requests, ["a"])
    waiting = requests.send("b")
    await _settle()
    waiting.cancel()
    await _settle()
    assert share.queued == 0
    await requests.finish("a")
    assert share.active_clients == 0
