"""The read-through cache at its edges, with no socket: replicas that keep an answer only while they hear its
changes, answers that cannot be compared, pages that look alike, and what is gone before a change comes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.changes import ChangeEvent, WatchKey, WatchKind
from sidecar.config.sections import CacheConfig
from sidecar.downstream.readthrough import ReadThrough
from sidecar.observability.metrics import Metrics
from sidecar.upstream.answers import Reply
from sidecar.watch.fingerprint import fingerprint_contents
from tests.unit.downstream.readthrough_kit import READ, Clock, Gate, answering, cache, ok, result, store

A = {"uri": "x://a"}


class Routing:
    """A replica's bus: records what the cache asks to keep hearing, and answers whether it has heard it since."""

    def __init__(self, heard: bool) -> None:
        self.heard = heard
        self.holds: list[tuple[WatchKind, str | None, float, float]] = []

    def hold(self, kind: WatchKind, uri: str | None, since: float, until: float) -> bool:
        self.holds.append((kind, uri, since, until))
        return self.heard


def _replica(heard: bool) -> tuple[ReadThrough, Routing, Clock]:
    clock, routing = Clock(), Routing(heard)
    return ReadThrough(CacheConfig(), Metrics(), clock, routing), routing, clock


def _slow(clock: Clock, seconds: float, answer: object) -> Callable[[Callable[[], None]], object]:
    async def forward(started: Callable[[], None]) -> Reply:
        started()
        clock.now += seconds  # the upstream took this long to answer
        return Reply(200, message=answer)  # type: ignore[arg-type]

    return forward


async def test_a_replica_keeps_an_answer_only_while_it_hears_its_changes_since_the_request_started() -> None:
    rt, routing, clock = _replica(heard=True)
    await rt.fetch(READ, A, "alice", _slow(clock, 2, ok(result(ttl=5_000))), 0, "c1")  # type: ignore[arg-type]
    assert routing.holds == [("resource", "x://a", 100.0, 107.0)], "from the request's start to the answer's expiry"
    assert rt.lookup(READ, A, "alice") is not None
    await rt.fetch("tools/list", {}, "alice", _slow(clock, 1, ok(result(ttl=1_000))), 0, "c1")  # type: ignore[arg-type]
    assert routing.holds[-1] == ("tools_list", None, 102.0, 104.0)
    deaf, routing, clock = _replica(heard=False)
    await deaf.fetch(READ, A, "alice", _slow(clock, 0, ok(result())), 0, "c1")  # type: ignore[arg-type]
    assert deaf.lookup(READ, A, "alice") is None, "a change since it started might not have reached this replica"
    await deaf.fetch("server/discover", {}, "alice", _slow(clock, 0, ok(result())), 0, "c1")  # type: ignore[arg-type]
    assert len(routing.holds) == 1, "no change ever drops a discovery: nothing to hear"
    assert deaf.lookup("server/discover", {}, "alice") is not None


async def test_a_millisecond_of_freshness_is_kept() -> None:
    rt, _ = cache()
    await store(rt, result(ttl=1))
    answer = rt.lookup(READ, A, "alice")
    assert answer is not None and answer["ttlMs"] == 1


async def test_an_older_answer_a_newer_look_agrees_with_is_kept() -> None:
    rt, _ = cache()
    rt.observed(WatchKey("resource", "x://a", "alice"), fingerprint_contents(result()["contents"]), 7)
    await store(rt, result(), ticket=5)
    assert rt.lookup(READ, A, "alice") is not None
    await store(rt, result("other"), params={"uri": "x://a", "v": 2}, ticket=5)
    assert rt.lookup(READ, {"uri": "x://a", "v": 2}, "alice") is None


async def test_a_context_not_verified_for_the_public_answer_gets_its_own() -> None:
    rt, _ = cache()
    await store(rt, result("public", scope="public"), context="alice")
    await store(rt, result("bob's"), context="bob")
    assert rt.lookup(READ, A, "bob") == result("bob's")


async def test_content_that_cannot_be_fingerprinted_is_dropped_by_any_look() -> None:
    deep: object = "leaf"
    for _ in range(2_000):
        deep = [deep]
    rt, _ = cache()
    key = WatchKey("resource", "x://a", "alice")
    rt.observed(key, "F", 1)
    await store(rt, {"contents": [{"uri": "x://a", "blob": "b"}], "ttlMs": 60_000}, ticket=2)
    rt._cache[next(iter(rt._cache))].result["contents"] = deep  # what orjson wrote but cannot be compared
    rt.observed(key, "F", 3)
    assert rt.lookup(READ, A, "alice") is None


async def test_a_look_drops_the_answers_of_its_own_context_among_many() -> None:
    rt, _ = cache()
    for n in range(30):
        await store(rt, result(), context=f"other{n}", ticket=1)
    await store(rt, result(), ticket=1)
    rt.observed(WatchKey("resource", "x://a", "alice"), "changed", 2)
    assert rt.lookup(READ, A, "alice") is None
    assert all(rt.lookup(READ, A, f"other{n}") is not None for n in range(30))
    for cursor in range(30):
        await store(rt, result(), method="tools/list", params={"cursor": str(cursor)}, ticket=9)
    await store(rt, result(), method="tools/list", params={}, ticket=1)
    rt.observed(WatchKey("tools_list", None, "alice"), "L", 5)
    assert rt.lookup("tools/list", {}, "alice") is None, "older than the look"
    assert all(rt.lookup("tools/list", {"cursor": str(c)}, "alice") is not None for c in range(30))


async def test_a_second_look_of_the_same_moment_does_not_vouch_for_a_page() -> None:
    rt, _ = cache()
    key = WatchKey("tools_list", None, "alice")
    rt.observed(key, "L1", 3)
    rt.observed(key, "L1", 5)
    await store(rt, result(), method="tools/list", params={}, ticket=6)
    rt.observed(key, "L2", 5)
    rt.observed(key, "L2", 7)
    assert rt.lookup("tools/list", {}, "alice") is None, "L2 was seen only from 5 on, before the page's 6"


async def test_a_change_or_first_look_for_what_is_no_longer_cached_is_harmless() -> None:
    clock = Clock()
    rt, _ = cache(clock, max_entries=1)
    await store(rt, result(ttl=1_000))
    await store(rt, result(), params={"uri": "x://b"})  # evicts x://a
    clock.now += 5  # and x://b has expired
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), "f", 1, 0.0))
    rt.on_change(ChangeEvent(WatchKey("resource", "x://b", "alice"), "f", 1, 0.0))
    rt.on_change(ChangeEvent(WatchKey("resource", "x://never", "alice"), "f", 1, 0.0, baseline=True))
    rt.observed(WatchKey("resource", "x://never", "alice"), "f", 1)
    assert rt.lookup(READ, A, "alice") is None


async def test_a_list_request_that_names_a_uri_is_still_dropped_by_its_lists_change() -> None:
    rt, _ = cache()
    await store(rt, result(), method="tools/list", params={"uri": "x://a"})
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "alice"), "f", 1, 0.0))
    assert rt.lookup("tools/list", {"uri": "x://a"}, "alice") is None


async def test_a_list_change_leaves_other_requests_in_flight_joinable() -> None:
    rt, _ = cache()
    gates = {method: Gate(ok(result(method))) for method in (READ, "prompts/list")}
    leaders = []
    for method, gate in gates.items():
        leaders.append(asyncio.ensure_future(rt.fetch(method, A, "alice", gate, 0, "c1")))
        await gate.entered.wait()
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "alice"), "f", 1, 0.0))
    joiners = [asyncio.ensure_future(rt.fetch(method, A, "alice", answering(None), 0, "c2")) for method in gates]
    for gate in gates.values():
        gate.release.set()
    await asyncio.gather(*leaders)
    assert [await joiner for joiner in joiners] == [(None, ok(result(method))) for method in gates]


async def test_a_request_that_never_reached_upstream_is_not_joined_once_answered() -> None:
    rt, _ = cache()
    first = await rt.fetch(READ, A, "alice", answering(ok(result()), bound=False), 0, "c1")
    again = await rt.fetch(READ, A, "alice", answering(ok(result("2"))), 0, "c1")
    assert first[0] is not None and again[0] is not None and again[0].message == ok(result("2"))


async def test_a_queued_request_is_joined_by_its_own_client_before_it_reaches_upstream() -> None:
    rt, _ = cache()
    queued = Gate(ok(result()), bound=False)
    leader = asyncio.ensure_future(rt.fetch(READ, A, "alice", queued, 0, "c1"))
    await queued.entered.wait()
    same_client = asyncio.ensure_future(rt.fetch(READ, A, "alice", answering(None), 0, "c1"))
    await asyncio.sleep(0)  # one turn of the loop: the second request looks for a flight while the first queues
    queued.release.set()
    await leader
    assert await same_client == (None, ok(result()))


async def test_pages_asked_for_after_a_look_that_saw_the_list_as_it_still_is_are_kept_among_older_ones() -> None:
    rt, _ = cache()
    key = WatchKey("tools_list", None, "alice")
    rt.observed(key, "L", 1)
    await store(rt, result(), method="tools/list", params={}, ticket=1)
    for cursor in range(30):
        await store(rt, result(), method="tools/list", params={"cursor": str(cursor)}, ticket=4)
    rt.observed(key, "L", 5)
    assert rt.lookup("tools/list", {}, "alice") is None, "asked at the first look, not after it"
    assert all(rt.lookup("tools/list", {"cursor": str(c)}, "alice") is not None for c in range(30))
