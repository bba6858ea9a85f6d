"""The read-through path's single flight, with no socket: identical requests in flight share one upstream request
(only once it holds its upstream slot, invariant 20), what is shared and kept of its answer, and a change that
makes a request in flight unjoinable (invariant 5). Also a list page's freshness against the watches' looks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.upstream.answers import Reply
from tests.kit.waiting import WAIT_S
from tests.unit.downstream.readthrough_kit import READ, Clock, Gate, answering, cache, ok, result, sample, store

A = {"uri": "x://a"}
JOINS = "mcp_sidecar_singleflight_joins_total"
T = TypeVar("T")


async def _in_flight(rt: object, gate: Gate, context: str = "alice", client: str = "c1", **kw: object) -> asyncio.Task:
    """`client`'s request, once it is upstream (in `gate`). A request that joins one in flight instead waits for
    an answer nobody lets come: it fails here, after the kit's bounded wait, rather than hang the run."""
    task = asyncio.ensure_future(rt.fetch(kw.get("method", READ), kw.get("params", A), context, gate, 0, client))  # type: ignore[attr-defined]
    entered = asyncio.ensure_future(gate.entered.wait())
    await asyncio.wait({entered, task}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    if not entered.done():
        entered.cancel()
        answered = task.done()
        task.cancel()
        await asyncio.gather(entered, task, return_exceptions=True)
        raise AssertionError(
            f"{client}'s request did not go upstream: "
            + ("it was answered without" if answered else f"not within {WAIT_S} s (it joined a request in flight)")
        )
    return task


async def _answered(request: Awaitable[T], what: str) -> T:
    """What `request` answers; an AssertionError naming `what` after the kit's bounded wait (a request that joined
    one held in flight would wait until the test runner gives up)."""
    try:
        async with asyncio.timeout(WAIT_S):
            return await request
    except TimeoutError:
        raise AssertionError(f"not within {WAIT_S} s: {what}") from None


async def test_a_request_like_one_upstream_joins_it_and_gets_its_answer() -> None:
    rt, metrics = cache()
    gate = Gate(ok(result()))
    leader = await _in_flight(rt, gate)
    joiner = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c2"))
    other_context = asyncio.ensure_future(rt.fetch(READ, A, "bob", answering(ok(result("bob's"))), 0, "c3"))
    assert (await other_context)[1] is None, "another context's request is its own"
    gate.release.set()
    reply, shared = await leader
    assert reply is not None and reply.message == ok(result()) and shared is None
    assert await joiner == (None, ok(result()))
    assert sample(metrics, JOINS) == 1
    again = await rt.fetch(READ, A, "alice", answering(ok(result("v2"))), 0, "c2")
    assert again[0] is not None, "a flight that landed is no longer joined"


@pytest.mark.invariant(20)
async def test_a_request_still_queued_for_its_slot_is_joined_only_by_its_own_client() -> None:
    rt, metrics = cache()
    queued = Gate(ok(result()), bound=False)
    leader = await _in_flight(rt, queued, client="c1")
    other = await _answered(
        rt.fetch(READ, A, "alice", answering(ok(result("c2's"))), 0, "c2"),
        "c2's request answered while c1's like one still waits for its slot (c2 joined it)",
    )
    assert other[0] is not None, "another client does not wait behind c1's queue"
    same_client = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c1"))
    assert queued.started is not None
    queued.started()  # now upstream: anyone of the context may join
    anyone = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c3"))
    queued.release.set()
    await leader
    assert await same_client == (None, ok(result()))
    assert await anyone == (None, ok(result()))
    assert sample(metrics, JOINS) == 2


async def test_a_queued_request_that_reaches_upstream_after_a_like_one_does_not_take_its_place() -> None:
    rt, _ = cache()
    first, second = Gate(ok(result("first")), bound=False), Gate(ok(result("second")), bound=False)
    first_task = await _in_flight(rt, first, client="c1")
    second_task = await _in_flight(rt, second, client="c2")
    assert first.started is not None and second.started is not None
    first.started()
    second.started()
    by_c3 = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c3"))
    second.release.set()
    await second_task
    first.release.set()
    await first_task
    assert await by_c3 == (None, ok(result("first"))), "the one upstream first is the one joined"


@pytest.mark.parametrize(
    ("reply", "shared", "kept"),
    [
        (Reply(200, message=ok(result())), ok(result()), True),
        (Reply(299, message=ok(result())), ok(result()), True),
        (Reply(199, message=ok(result())), None, False),
        (Reply(300, message=ok(result())), None, False),
        (Reply(500, message={"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "m"}}), None, False),
        (Reply(200, message={"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "m"}}), "same", False),
        (Reply(200, message={"jsonrpc": "2.0", "id": 1}), None, False),
        (Reply(200, message={"jsonrpc": "2.0", "id": 1, "result": "text"}), "same", False),
        (Reply(200, body=b"{}"), None, False),
    ],
    ids=["200", "299", "199", "300", "500", "error", "neither", "not an object", "raw body"],
)
async def test_what_a_joiner_is_given_and_what_is_kept(reply: Reply, shared: object, kept: bool) -> None:
    rt, _ = cache()
    gate = Gate(None)

    async def forward(started: object) -> Reply:
        await gate(started)  # type: ignore[arg-type]
        return reply

    leader = asyncio.ensure_future(rt.fetch(READ, A, "alice", forward, 0, "c1"))
    await gate.entered.wait()
    joiner = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c2"))
    gate.release.set()
    assert (await leader)[0] is reply
    assert await joiner == (None, reply.message if shared == "same" else shared)
    assert (rt.lookup(READ, A, "alice") is not None) is kept


async def test_a_streamed_answer_is_not_shared_and_a_failed_request_lets_its_joiners_go_upstream() -> None:
    rt, _ = cache()

    async def chunks() -> object:
        yield b""

    gate = Gate(None)

    async def streamed(started: object) -> Reply:
        await gate(started)  # type: ignore[arg-type]
        return Reply(200, message=ok(result()), stream=chunks())  # type: ignore[arg-type]

    leader = asyncio.ensure_future(rt.fetch(READ, A, "alice", streamed, 0, "c1"))
    await gate.entered.wait()
    joiner = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c2"))
    gate.release.set()
    await leader
    assert await joiner == (None, None), "the joiner forwards on its own"
    assert rt.lookup(READ, A, "alice") is None

    async def failing(started: object) -> Reply:
        await failed.entered.wait()
        raise ConnectionError("upstream gone")

    failed = Gate(None)
    failed.entered.set()
    with pytest.raises(ConnectionError):
        await rt.fetch(READ, A, "alice", failing, 0, "c1")
    assert (await rt.fetch(READ, A, "alice", answering(ok(result())), 0, "c2"))[0] is not None


@pytest.mark.invariant(5)
async def test_a_change_makes_a_request_in_flight_unjoinable_and_its_answer_unkept() -> None:
    rt, _ = cache()
    before = Gate(ok(result("old")))
    old = await _in_flight(rt, before)
    other_uri = Gate(ok(result("b")))
    unrelated = await _in_flight(rt, other_uri, params={"uri": "x://b"})
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), "f", 1, 0.0))
    after = Gate(ok(result("new")))
    new = await _in_flight(rt, after, client="c2")
    joiner = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c3"))
    b_joiner = asyncio.ensure_future(rt.fetch(READ, {"uri": "x://b"}, "alice", answering(None), 0, "c3"))
    before.release.set()
    await old
    assert rt.lookup(READ, A, "alice") is None, "an answer from before the change is not kept"
    after.release.set()
    other_uri.release.set()
    await new
    await unrelated
    assert await joiner == (None, ok(result("new"))), "joined the request that started after the change"
    assert await b_joiner == (None, ok(result("b"))), "another URI's request was still joinable"
    assert rt.lookup(READ, A, "alice") == result("new")


async def test_a_list_change_makes_every_page_of_its_list_in_flight_unjoinable() -> None:
    rt, _ = cache()
    page = Gate(ok(result()))
    task = await _in_flight(rt, page, method="tools/list", params={"cursor": "2"})
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "alice"), "f", 1, 0.0))
    fresh = await _answered(
        rt.fetch("tools/list", {"cursor": "2"}, "alice", answering(ok(result("new"))), 0, "c2"),
        "the page asked for after the change answered while the one from before it is still in flight (joined it)",
    )
    assert fresh[0] is not None, "went upstream itself"
    page.release.set()
    await task
    assert rt.lookup("tools/list", {"cursor": "2"}, "alice") == result("new")


async def test_a_list_page_asked_for_after_a_look_that_saw_the_list_as_it_still_is_is_kept() -> None:
    rt, _ = cache()
    key = WatchKey("tools_list", None, "alice")
    rt.observed(key, "L1", 3)
    await store(rt, result("at 3"), method="tools/list", params={"cursor": "at3"}, ticket=3)
    await store(rt, result("at 5"), method="tools/list", params={}, ticket=5)
    await store(rt, result("mine"), method="tools/list", params={}, ticket=1, context="bob")
    rt.observed(key, "L1", 7)
    assert rt.lookup("tools/list", {}, "alice") is not None, "every look since before it saw the same list"
    assert rt.lookup("tools/list", {"cursor": "at3"}, "alice") is None, "asked at the first look, not after it"
    assert rt.lookup("tools/list", {}, "bob") is not None
    rt.observed(key, "L2", 9)
    assert rt.lookup("tools/list", {}, "alice") is None, "the list changed since"
    await store(rt, result(), method="tools/list", params={}, ticket=8)
    assert rt.lookup("tools/list", {}, "alice") is None, "a page older than a look cannot be checked against it"
    await store(rt, result(), method="tools/list", params={}, ticket=10)
    rt.observed(key, "L1", 6)
    assert rt.lookup("tools/list", {}, "alice") is not None, "a late look older than the page leaves it"


async def test_a_resource_is_checked_by_its_content_whatever_looks_saw_before() -> None:
    rt, _ = cache()
    key = WatchKey("resource", "x://a", "alice")
    rt.observed(key, "X", 3)
    await store(rt, result(), ticket=5)
    rt.observed(key, "X", 7)
    assert rt.lookup(READ, A, "alice") is None, "the watch sees X, not what is cached"


async def test_the_index_of_what_a_change_drops_forgets_expired_answers_and_keeps_live_ones() -> None:
    rt_clock = Clock()
    rt, _ = cache(rt_clock)
    await store(rt, result(ttl=10_000_000), params={"uri": "x://keep"})
    for n in range(1022):
        await store(rt, result(ttl=1_000), params={"uri": f"x://{n}"})
    rt_clock.now += 2
    await store(rt, result(ttl=10_000_000), params={"uri": "x://new"})  # the 1,024th: the index is pruned
    assert len(rt._index) == 2
    rt.on_change(ChangeEvent(WatchKey("resource", "x://keep", "alice"), "f", 1, 0.0))
    assert rt.lookup(READ, {"uri": "x://keep"}, "alice") is None
    assert rt.lookup(READ, {"uri": "x://new"}, "alice") is not None
