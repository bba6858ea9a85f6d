"""The fair share's turns at their edges (invariant 20): a waiter gone just as its turn comes, a request that gives
up, the words of a refusal, the metrics, and a slot held for a whole or a streamed answer."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.fair_share import FairShare
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import TooManyRequests
from sidecar.upstream.answers import Reply
from tests.kit import eventually
from tests.unit.fair_share_requests import Requests, fair_share, sent

pytestmark = pytest.mark.invariant(20)


async def test_a_waiter_cancelled_just_as_its_turn_comes_is_passed_over_and_its_clients_next_request_goes() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold", "b", "b", "c"])
    requests._done["hold"][0].set()  # the slot frees first ...
    gone = requests.tasks[1]
    gone.cancel()  # ... and b's first request gives up before the freed slot could reach it
    with pytest.raises(asyncio.CancelledError):
        await gone
    await requests.settled()
    assert requests.order == ["hold", "b"], "the same turn again: b's next request, not c"
    assert share.queued == 1
    requests._done["b"][1].set()  # b's second request, the one holding the slot
    await requests.settled()
    assert requests.order[-1] == "c"
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_a_client_whose_only_waiter_is_cancelled_as_its_turn_comes_is_passed_over_for_the_next() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold", "addr/newcomer", "c"])
    requests._done["hold"][0].set()
    gone = requests.tasks[1]
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await requests.settled()
    assert requests.order == ["hold", "c"]
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_a_client_whose_only_waiter_gave_up_is_no_longer_counted_once_its_turn_is_passed_over() -> None:
    # The slot frees in the step its waiter was cancelled, before that waiter's task resumes: what /metrics and the
    # status page read from then on counts no client with nothing in flight and nothing waiting.
    metrics = Metrics()
    share = FairShare(capacity=1, per_client=1, max_queued_per_client=8, metrics=metrics)
    await share.acquire("a", within_s=30, limit="queue_wait")
    waiting = asyncio.ensure_future(share.acquire("b", within_s=30, limit="queue_wait"))
    await eventually(lambda: share.queued == 1, what="b waits its turn")
    waiting.cancel()
    share.release("a")
    assert share.active_clients == 0
    assert metrics.registry.get_sample_value("mcp_sidecar_clients_active") == 0
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_a_request_that_gave_up_leaves_no_turn_behind_for_its_client() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold"])
    with pytest.raises(TooManyRequests):
        await share.acquire("b", within_s=0.01, limit="queue_wait")
    await sent(requests, ["b", "b", "c", "c"])
    for _ in range(4):
        await requests.finish(requests.order[-1])
    assert requests.order == ["hold", "b", "c", "b", "c"], "one turn a round for b, not two"
    await requests.finish_all()


async def test_a_client_still_waiting_keeps_its_turn_when_one_of_its_requests_gives_up() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold", "b/t1"])
    impatient = requests.send("b", within_s=0.01)
    with pytest.raises(TooManyRequests):
        await impatient
    await requests.finish("hold")
    assert requests.order == ["hold", "b/t1"]
    await requests.finish_all()


async def test_a_client_whose_slot_frees_joins_the_round_behind_a_client_that_came_meanwhile() -> None:
    share = fair_share(capacity=1)
    requests = Requests(share)
    await sent(requests, ["hold", "a", "a"])
    await requests.finish("hold")
    assert requests.order[-1] == "a"
    await sent(requests, ["b"])  # arrives while a's first request holds the slot, its second still waiting
    await requests.finish("a")
    assert requests.order[-1] == "b"
    await requests.finish_all()


async def test_a_client_granted_all_it_waited_for_does_not_keep_a_place_in_the_round() -> None:
    share = fair_share(capacity=2)
    requests = Requests(share)
    await sent(requests, ["h", "h", "a", "b"])
    await requests.finish("h")
    await requests.finish("h")
    assert requests.order[2:] == ["a", "b"]
    await sent(requests, ["c", "a"])  # c waited first; a comes back after
    await requests.finish("a")
    assert requests.order[-1] == "c"
    await requests.finish_all()


async def test_a_granted_new_credential_or_one_that_gives_up_frees_room_in_its_addresss_new_lanes() -> None:
    share = fair_share(capacity=1, queued=3)
    requests = Requests(share)
    await sent(requests, ["addr", "addr", "addr/t1", "addr/t2", "addr/t3"])  # own lane waiting, new lanes full
    await requests.finish("addr")
    assert requests.order[-1] == "addr", "the own lane's turn came: the new lanes are still full"
    with pytest.raises(TooManyRequests, match="new credentials"):
        await share.acquire("addr", within_s=0.01, limit="queue_wait", lane="t4")
    await requests.finish("addr")
    assert requests.order[-1] == "addr/t1"
    await sent(requests, ["addr/t4"])  # t1 no longer waits: room for one more, and only one
    assert share.queued == 3
    with pytest.raises(TooManyRequests, match="new credentials"):
        await share.acquire("addr", within_s=0.01, limit="queue_wait", lane="t5")
    requests.tasks[-1].cancel()
    await requests.settled()
    await sent(requests, ["addr/t5"])  # t4 gave up: room again, for one
    assert share.queued == 3
    with pytest.raises(TooManyRequests, match="new credentials"):
        await share.acquire("addr", within_s=0.01, limit="queue_wait", lane="t6")
    await requests.finish_all()
    assert (share.in_flight, share.queued, share.active_clients) == (0, 0, 0)


async def test_an_own_lane_request_that_gives_up_frees_no_room_in_the_new_lanes() -> None:
    share = fair_share(capacity=1, queued=2)
    requests = Requests(share)
    await sent(requests, ["addr", "addr", "addr/t1", "addr/t2"])
    requests.tasks[1].cancel()
    await requests.settled()
    with pytest.raises(TooManyRequests, match="new credentials"):
        await share.acquire("addr", within_s=0.01, limit="queue_wait", lane="t3")
    await requests.finish_all()


async def test_each_refusal_says_whose_queue_is_full_or_how_long_the_request_waited() -> None:
    share = fair_share(capacity=1, queued=1)
    requests = Requests(share)
    await sent(requests, ["a", "a", "a/t1"])
    with pytest.raises(TooManyRequests) as own:
        await share.acquire("a", within_s=30, limit="queue_wait")
    assert own.value.message == "this client already has 1 requests waiting for the upstream; retry later"
    with pytest.raises(TooManyRequests) as new:
        await share.acquire("a", within_s=30, limit="queue_wait", lane="t2")
    assert new.value.message == (
        "new credentials from this address already have 1 requests waiting for the upstream; retry later"
    )
    with pytest.raises(TooManyRequests) as late:
        await share.acquire("b", within_s=0.01, limit="queue_wait")
    assert late.value.message == "this client's request waited 0.01 s behind its own for the upstream; retry later"
    await requests.finish_all()


async def test_with_no_queue_a_busy_upstream_refuses_at_once_and_counts_no_idle_client() -> None:
    share = fair_share(capacity=1, queued=0)
    requests = Requests(share)
    await sent(requests, ["a"])
    with pytest.raises(TooManyRequests):
        await share.acquire("b", within_s=30, limit="queue_wait")
    assert share.active_clients == 1
    await requests.finish_all()
    assert share.active_clients == 0


async def test_the_wait_for_a_slot_is_measured_on_the_clock_and_a_free_slot_waits_nothing() -> None:
    metrics, now = Metrics(), [100.0]
    share = FairShare(capacity=1, per_client=1, max_queued_per_client=10, metrics=metrics, clock=lambda: now[0])
    labels = {"limit": "upstream_requests"}
    await share.acquire("a", within_s=30, limit="queue_wait")
    waiting = asyncio.get_running_loop().create_task(share.acquire("b", within_s=30, limit="queue_wait"))
    await eventually(lambda: share.queued == 1, what="b waits in the queue")
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_depth", labels) == 1, "b waits, and shows"
    now[0] += 2.5
    share.release("a")
    await waiting
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 2
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_sum", labels) == 2.5
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_depth", labels) == 0
    share.release("b")


class _Body:
    """A streamed answer's bytes, ended by the reader."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


async def test_a_whole_answer_frees_its_slot_at_once_and_a_streamed_one_when_the_stream_ends() -> None:
    share = fair_share(capacity=1)

    async def whole() -> Reply:
        assert share.in_flight == 1, "sent while holding the slot"
        return Reply(200, message={"result": {}})

    assert (await share.run("a", whole, within_s=1)).message == {"result": {}}
    assert (share.in_flight, share.active_clients) == (0, 0)
    body = _Body()

    async def streamed() -> Reply:
        return Reply(200, stream=body)

    reply = await share.run("a", streamed, within_s=1)
    assert reply.stream is not None and share.in_flight == 1, "the stream holds the slot"
    assert [chunk async for chunk in reply.stream] == [] and share.in_flight == 0
    await reply.stream.aclose()
    assert body.closed and (share.in_flight, share.active_clients) == (0, 0)


async def test_a_send_that_fails_frees_its_slot_and_a_run_waits_its_turn_in_its_lane() -> None:
    metrics = Metrics()
    share = FairShare(capacity=1, per_client=1, max_queued_per_client=1, metrics=metrics, refusal_pause_s=0)

    async def failing() -> Reply:
        raise ConnectionError("upstream gone")

    with pytest.raises(ConnectionError):
        await share.run("a", failing, within_s=1)
    assert (share.in_flight, share.active_clients) == (0, 0)
    requests = Requests(share)
    await sent(requests, ["a", "a/t1"])

    async def unsent() -> Reply:
        raise AssertionError("never sent")

    with pytest.raises(TooManyRequests, match="new credentials"):
        await share.run("a", unsent, within_s=1, lane="t2")
    await sent(requests, ["a"])  # the own lane holds one waiting request now: full too
    with pytest.raises(TooManyRequests, match="this client already has 1 requests"):
        await share.run("a", unsent, within_s=1)
    with pytest.raises(TooManyRequests, match=r"waited 0\.01 s"):
        await share.run("b", unsent, within_s=0.01)
    assert metrics.limit_rejections.labels("queue_wait")._value.get() == 1
    await requests.finish_all()
