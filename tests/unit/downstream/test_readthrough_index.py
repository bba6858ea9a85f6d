"""The read-through's indexes, with no socket: what a look or a change finds through them is exactly what a pass
over every entry and every request in flight would find (a look touches only its own context's entries, a change
only its own group's flights), and entries and requests that come and go leave nothing behind in them."""

from __future__ import annotations

import asyncio

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.downstream.readthrough import ReadThrough
from sidecar.watch.fingerprint import fingerprint_contents
from tests.unit.downstream.readthrough_kit import READ, Clock, Gate, answering, cache, ok, result

A = {"uri": "x://a"}
LIST = "tools/list"


def _keep(rt: ReadThrough, context: str, *, method: str = READ, params: object = None, **res: object) -> None:
    """An answer the upstream gave `context` at ticket 1, kept as the cache keeps one."""
    rt._store(method, A if params is None else params, context, result(**res), 100.0, 1, 100.0)  # type: ignore[arg-type]


def _index_size(rt: ReadThrough) -> int:
    return sum(len(keys) for by_context in rt._index.values() for keys in by_context.values())


def _flights_listed(rt: ReadThrough) -> int:
    return sum(len(flights) for by_uri in rt._flights_of.values() for flights in by_uri.values())


def test_a_look_drops_only_its_own_contexts_entry_of_a_group_every_context_shares() -> None:
    rt, _ = cache()
    for context in ("alice", "bob"):
        _keep(rt, context, method=LIST, params={})
        _keep(rt, context)
    _keep(rt, "carol", method=LIST, params={"cursor": "2"}, scope="public")
    rt.observed(WatchKey("tools_list", None, "alice"), "L", 5)
    assert rt.lookup(LIST, {}, "alice") is None, "older than alice's look"
    assert rt.lookup(LIST, {}, "bob") is not None, "bob's list is bob's: alice's look says nothing of it"
    assert rt.lookup(LIST, {"cursor": "2"}, "carol") is not None, "the public page is the public watch's to check"
    rt.observed(WatchKey("tools_list", None, "public"), "L", 5)
    assert rt.lookup(LIST, {"cursor": "2"}, "carol") is None
    assert rt.lookup(LIST, {}, "bob") is not None
    rt.observed(WatchKey("resource", "x://a", "bob"), "other", 5)
    assert rt.lookup(READ, A, "bob") is None
    assert rt.lookup(READ, A, "alice") is not None, "the same URI read privately by another context"


def test_a_first_look_drops_only_its_own_contexts_contradicted_entry() -> None:
    rt, _ = cache()
    same = fingerprint_contents(result()["contents"])
    for context in ("alice", "bob", "public"):
        _keep(rt, context, scope="public" if context == "public" else "private")
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "bob"), same, 1, 0.0, baseline=True))
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), "other", 1, 0.0, baseline=True))
    assert rt.lookup(READ, A, "alice") is None
    assert rt.lookup(READ, A, "bob") is not None, "bob's look saw what bob has"
    assert rt._cache.get((READ, b"ux://a", "public")) is not None, "the public entry is not alice's"


def test_a_change_still_drops_the_group_in_every_context() -> None:
    rt, _ = cache()
    for context in ("alice", "bob"):
        _keep(rt, context, method=LIST, params={})
    _keep(rt, "alice", method=LIST, params={}, scope="public")
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "alice"), "f", 1, 0.0))
    assert rt.lookup(LIST, {}, "bob") is None, "a change seen in one context leaves no other context's copy"
    assert len(rt._cache) == 0
    assert rt._index == {}


def test_entries_that_looks_and_first_looks_drop_leave_nothing_in_the_index() -> None:
    rt, _ = cache(max_entries=100_000)
    for n in range(300):
        _keep(rt, f"user{n}", method=LIST, params={})
        _keep(rt, f"user{n}", params={"uri": f"x://{n}"})
    assert _index_size(rt) == 600
    for n in range(300):
        rt.observed(WatchKey("tools_list", None, f"user{n}"), "L", 5)
        rt.on_change(ChangeEvent(WatchKey("resource", f"x://{n}", f"user{n}"), "other", 1, 0.0, baseline=True))
    assert len(rt._cache) == 0
    assert rt._index == {}, "no context or group left behind once its last entry went"


def test_entries_that_expire_leave_nothing_in_the_index_once_it_is_pruned() -> None:
    clock = Clock()
    rt, _ = cache(clock, max_entries=100_000)
    for n in range(1023):
        _keep(rt, f"user{n}", method=LIST, params={}, ttl=1_000)
    clock.now += 2
    _keep(rt, "last", params={"uri": "x://last"}, ttl=10_000_000)  # the 1,024th: the index is pruned
    assert rt._index == {(READ, "x://last"): {"last": {(READ, b"ux://last", "last")}}}


async def test_a_change_makes_unjoinable_the_flights_of_its_group_in_every_context_and_no_other() -> None:
    rt, _ = cache()
    gates = {
        (READ, "x://a", "alice"): Gate(ok(result("a"))),
        (READ, "x://a", "bob"): Gate(ok(result("a for bob"))),
        (READ, "x://b", "alice"): Gate(ok(result("b"))),
        (LIST, None, "alice"): Gate(ok(result("tools"))),
    }
    leaders = []
    for (method, uri, context), gate in gates.items():
        params = {"uri": uri} if uri else {}
        leaders.append(asyncio.ensure_future(rt.fetch(method, params, context, gate, 0, "c1")))
        await gate.entered.wait()
    assert _flights_listed(rt) == len(rt._flights) == 4
    rt.on_change(ChangeEvent(WatchKey("resource", "x://unread", "carol"), "f", 1, 0.0))
    assert _flights_listed(rt) == len(rt._flights) == 4, "a change of a URI nobody reads now leaves every flight"
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "carol"), "f", 1, 0.0))
    assert sorted(key[2] for key in rt._flights) == ["alice", "alice"], "x://a's flights went, in every context"
    assert _flights_listed(rt) == 2
    joiners = [
        asyncio.ensure_future(rt.fetch(READ, {"uri": "x://b"}, "alice", answering(None), 0, "c2")),
        asyncio.ensure_future(rt.fetch(LIST, {}, "alice", answering(None), 0, "c2")),
    ]
    for gate in gates.values():
        gate.release.set()
    await asyncio.gather(*leaders)
    assert [await joiner for joiner in joiners] == [(None, ok(result("b"))), (None, ok(result("tools")))]
    assert rt.lookup(READ, A, "alice") is None and rt.lookup(READ, A, "bob") is None, "answered before the change"


async def test_a_change_with_no_uri_makes_every_flight_of_its_methods_unjoinable() -> None:
    rt, _ = cache()
    gates = [Gate(ok(result())) for _ in range(4)]
    requests = [(LIST, {"cursor": "2"}), (LIST, {"uri": "x://a"}), (READ, A), (READ, {"uri": "x://b"})]
    leaders = []
    for (method, params), gate in zip(requests, gates, strict=True):
        leaders.append(asyncio.ensure_future(rt.fetch(method, params, "alice", gate, 0, "c1")))
        await gate.entered.wait()
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "bob"), "f", 1, 0.0))
    assert sorted(key[0] for key in rt._flights) == [READ, READ], "the list's pages went, whatever they named"
    rt.on_change(ChangeEvent(WatchKey("resource", None, "bob"), "f", 1, 0.0))
    assert rt._flights == {} and rt._flights_of == {}, "a read change with no URI names no one read: all of them"
    for gate in gates:
        gate.release.set()
    await asyncio.gather(*leaders)


async def test_requests_that_come_and_go_leave_nothing_in_the_flight_index() -> None:
    rt, _ = cache()
    for n in range(50):
        params = {"uri": f"x://{n}"}
        answered = await rt.fetch(READ, params, f"user{n}", answering(ok(result()), bound=n % 2 == 0), 0, "c1")
        assert answered[0] is not None
        queued, bound = Gate(ok(result()), bound=False), Gate(ok(result()))
        leaders = [
            asyncio.ensure_future(rt.fetch(LIST, {"cursor": str(n)}, f"user{n}", queued, 0, "c1")),
            asyncio.ensure_future(rt.fetch(READ, params, f"user{n}", bound, 0, "c2")),
        ]
        await queued.entered.wait()
        await bound.entered.wait()
        assert queued.started is not None
        queued.started()  # moves from its client's key to the shared one
        assert _flights_listed(rt) == len(rt._flights) == 2
        rt.on_change(ChangeEvent(WatchKey("resource", f"x://{n}", "public"), "f", 1, 0.0))
        queued.release.set()
        bound.release.set()
        await asyncio.gather(*leaders)
    assert rt._flights == {}
    assert rt._flights_of == {}, "no method or URI left behind once its last request landed or was dropped"
