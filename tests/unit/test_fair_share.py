"""The fair share of the upstream's slots (invariant 20), on its own: who gets a slot that frees, who waits, who
is refused. No network: the requests are tasks holding slots until the test lets them go."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.fair_share import FairShare
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import TooManyRequests
from tests.unit.fair_share_requests import Requests, fair_share, sent

pytestmark = pytest.mark.invariant(20)


async def test_a_freed_slot_goes_to_the_next_waiting_client_in_turn_not_to_the_busiest() -> None:
    share = fair_share(capacity=2)
    requests = Requests(share)
    await sent(requests, ["greedy", "greedy"])  # every slot taken by one client, on an otherwise idle share
    await sent(requests, ["greedy"] * 5 + ["polite"])  # the polite request arrives behind five greedy ones
    assert requests.order == ["greedy", "greedy"] and share.queued == 6
    await requests.finish("greedy")
    assert requests.order[-1] == "polite"  # its turn came first, ahead of the greedy queue
    await requests.finish("greedy")
    assert requests.order[-1] == "greedy"  # nobody else waits: the spare slot goes to the greedy client
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_turns_alternate_between_waiting_clients_one_request_each() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["a", "a", "a", "b", "b", "c"])
    for _ in range(5):
        await requests.finish(requests.order[-1])
    # A client whose slot frees joins the round behind those that waited meanwhile.
    assert requests.order == ["a", "b", "c", "a", "b", "a"]
    await requests.finish_all()


async def test_two_busy_clients_alternate_slot_by_slot() -> None:
    share = fair_share(capacity=2)
    requests = Requests(share)
    await sent(requests, ["a", "a"])
    await sent(requests, ["a"] * 4 + ["b"] * 4)
    for _ in range(6):
        await requests.finish(requests.order[len(requests.order) - 2])  # the older of the two in flight
    # After b's first turn, each freed slot goes to the client that did not have the last one.
    assert requests.order[2:] == ["b", "a", "b", "a", "b", "a"]
    await requests.finish_all()


async def test_one_client_never_holds_more_than_its_share_even_with_slots_free() -> None:
    share = fair_share(capacity=4, per_client=3)
    requests = Requests(share)
    await sent(requests, ["slow"] * 5)
    assert requests.order == ["slow"] * 3 and share.in_flight == 3  # one slot stays free for someone else
    await sent(requests, ["other"])
    assert requests.order[-1] == "other"
    await requests.finish("slow")
    assert requests.order.count("slow") == 4  # its own slot freed: its next request goes
    await requests.finish_all()


async def test_a_client_over_its_queue_bound_is_refused_and_another_client_still_waits_its_turn() -> None:
    share = fair_share(capacity=1, queued=2)
    requests = Requests(share)
    await sent(requests, ["a", "a", "a"])  # one in flight, two waiting: a's queue is full
    with pytest.raises(TooManyRequests) as refused:
        await share.acquire("a", within_s=30, limit="queue_wait")
    assert refused.value.status == 429 and refused.value.retry_after_s >= 1
    await sent(requests, ["b"])  # b is not refused for a's load: it waits in a queue of its own
    assert share.queued == 3
    await requests.finish("a")
    assert requests.order[-1] == "b"  # and its turn comes before a's second
    await requests.finish_all()


async def test_a_request_that_waits_out_its_deadline_is_refused_and_leaves_the_queue() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["a"])
    late = requests.send("b", within_s=0.01)
    with pytest.raises(TooManyRequests):
        await late
    assert share.queued == 0
    assert share.active_clients == 1  # b is forgotten at once, not when its turn would have come
    await requests.finish("a")
    assert (share.in_flight, share.active_clients) == (0, 0)


async def test_a_slot_granted_to_a_request_cancelled_in_the_same_moment_is_handed_on() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    gone: list[asyncio.Task[None]] = []
    requests.send("a", released=lambda: gone[0].cancel())  # a's slot is released and granted to b ...
    await requests.settled()
    gone.append(requests.send("b"))  # ... which is cancelled before it could run
    requests.send("c")
    await requests.settled()
    requests.end("a")
    await requests.settled()
    assert requests.order == ["a", "c"]  # b's slot went on to c instead of being lost
    await requests.finish_all()
    assert (share.in_flight, share.queued) == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["a"])
    waiting = requests.send("b")
    await requests.settled()
    waiting.cancel()
    await requests.settled()
    assert share.queued == 0
    await requests.finish("a")
    assert share.active_clients == 0


# -- within an address: the lanes of credentials the upstream has not accepted yet ------------------------------


async def test_a_new_credential_from_a_busy_address_waits_one_turn_of_its_address_not_its_queue() -> None:
    share = fair_share(capacity=4, per_client=2)
    requests = Requests(share)
    await sent(requests, ["addr"] * 8)  # two in flight, six anonymous requests waiting in the address's lane
    await sent(requests, ["addr/newcomer"])
    assert requests.order == ["addr", "addr"] and share.queued == 7
    await requests.finish("addr")
    await requests.finish("addr")
    # One turn of the address's anonymous lane at most, then the newcomer's: not behind the six.
    assert requests.order[2:] == ["addr", "addr/newcomer"]
    assert share.active_clients == 1  # one client, the address: the newcomer is no client of its own
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_lanes_of_one_address_take_turns_within_its_one_turn() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold"])
    await sent(requests, ["addr", "addr", "addr", "addr/t1", "addr/t1", "addr/t2", "other", "other", "other"])
    for _ in range(9):
        await requests.finish(requests.order[-1])
    served = requests.order[1:]
    # The address's turn alternates with the other client's; within it, its lanes alternate.
    assert served == ["addr", "other", "addr/t1", "other", "addr/t2", "other", "addr", "addr/t1", "addr"]
    await requests.finish_all()


async def test_invented_tokens_from_one_address_get_its_one_turn_against_another_address() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold"])
    await sent(requests, [f"flood/made-up-{n}" for n in range(6)] + ["other"] * 6)
    for _ in range(6):
        await requests.finish(requests.order[-1])
    served = [client.partition("/")[0] for client in requests.order[1:]]
    assert served == ["flood", "other"] * 3
    await requests.finish_all()


async def test_new_credentials_of_an_address_share_one_queue_bound_and_its_anonymous_lane_keeps_its_own() -> None:
    metrics = Metrics()
    share = FairShare(capacity=1, per_client=1, max_queued_per_client=2, metrics=metrics, refusal_pause_s=0)
    requests = Requests(share)
    await sent(requests, ["addr", "addr/made-up-1", "addr/made-up-2"])  # one in flight, the new lanes full
    with pytest.raises(TooManyRequests) as refused:
        await share.acquire("addr", within_s=30, limit="queue_wait", lane="made-up-3")
    assert refused.value.status == 429 and "new credentials" in str(refused.value)
    assert metrics.limit_rejections.labels("queued_new_credentials")._value.get() == 1
    await sent(requests, ["addr", "addr"])  # the address's anonymous requests still wait in a lane of their own
    assert share.queued == 4 and metrics.limit_rejections.labels("queued_per_client")._value.get() == 0
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_a_lane_whose_only_request_gives_up_leaves_the_round() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["addr", "addr"])
    gone = requests.send("addr/newcomer")
    await requests.settled()
    gone.cancel()
    await requests.settled()
    assert share.queued == 1
    await requests.finish("addr")
    assert requests.order == ["addr", "addr"]
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)
